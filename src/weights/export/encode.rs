//! What one planned source tensor becomes in a converted checkpoint, and the streaming conversion of
//! its bytes. The rule is the loader's own choice of resident format ([`WeightDType::matrix_dtype`],
//! [`WeightDType::conv_dtype`], f32 for the rest), so that loading the converted file with the target
//! dtype gives the same resident bytes as loading the source with it:
//!
//! - a matrix weight (no layout fix-up) is stored in its resident format for the target: f32, f16, or
//!   `NAME.qweight` rows of the target's q8/q4 ([`crate::quant`]; rows of a source already in that
//!   format are copied);
//! - a dense convolution likewise (f32 for fp32, else f16);
//! - every other tensor (norms, biases, depthwise convolutions, position tables, and the tensors the
//!   loader permutes: mlx channels-last convolutions, the original `image_projection`) is resident in
//!   f32 whatever the target: it is written as f32 for `fp32`, else kept in its source dtype (exact).

use crate::error::{Error, Result};
use crate::quant::{dequantize_rows_into, quantize_rows, QFormat};
use crate::weights::convert::ElemConverter;
use crate::weights::dtype::WeightDType;
use crate::weights::expected::{is_dense_conv_weight, is_matrix_weight};
use crate::weights::header::StDtype;
use crate::weights::plan::{Fixup, TensorPlan};
use crate::weights::quantized::{check_rows, quant_err, QWEIGHT_SUFFIX};

/// How the output bytes are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutKind {
    /// The source bytes, unchanged.
    Copy,
    /// f32 or f16 elements.
    Float(StDtype),
    /// Rows quantized in this format.
    Quant(QFormat),
}

/// A converted tensor's entry in the output: name, dtype, shape, byte length, and how it is made.
#[derive(Clone, Debug)]
pub struct OutTensor {
    pub name: String,
    pub dtype: StDtype,
    pub shape: Vec<usize>,
    pub kind: OutKind,
    /// The canonical name (for the tied-LM-head check).
    pub canonical: String,
    /// The format as the summary names it: `f32`, `f16`, `bf16`, `q8`, `q4`.
    pub label: &'static str,
}

fn label(d: StDtype) -> &'static str {
    match d {
        StDtype::F32 => "f32",
        StDtype::F16 => "f16",
        StDtype::BF16 => "bf16",
        _ => "other",
    }
}

impl OutTensor {
    pub fn byte_len(&self) -> u64 {
        let n: u64 = self.shape.iter().map(|&d| d as u64).product();
        n * self.dtype.size() as u64
    }
}

/// The output of `plan` for the target `dtype` (see the module doc).
pub fn out_tensor(plan: &TensorPlan, dtype: WeightDType) -> Result<OutTensor> {
    let src = &plan.src;
    let base = src
        .name
        .strip_suffix(QWEIGHT_SUFFIX)
        .unwrap_or(&src.name)
        .to_owned();
    let plain = plan.fixup == Fixup::None;
    let resident = if plain && is_matrix_weight(&plan.canonical, &plan.shape) {
        Some(dtype.matrix_dtype(plan.shape.last().copied().unwrap_or(0)))
    } else if plain && is_dense_conv_weight(&plan.canonical, &plan.shape) {
        Some(dtype.conv_dtype())
    } else {
        None
    };
    let float = |d: StDtype| -> OutTensor {
        let kind = if plan.quant.is_none() && src.dtype == d {
            OutKind::Copy
        } else {
            OutKind::Float(d)
        };
        OutTensor {
            name: base.clone(),
            dtype: d,
            // A float source keeps its layout (the loader's fix-up permutes it again); quantized rows
            // become the matrix they stand for.
            shape: match plan.quant {
                Some(_) => plan.shape.clone(),
                None => src.shape.clone(),
            },
            kind,
            canonical: plan.canonical.clone(),
            label: label(d),
        }
    };
    use crate::gpu::DType;
    Ok(match resident {
        Some(DType::F32) => float(StDtype::F32),
        Some(DType::F16) => float(StDtype::F16),
        Some(d) => {
            let (Some(fmt), &[n, k]) = (d.qformat(), plan.shape.as_slice()) else {
                return Err(quant_err(&src.name, "not a matrix"));
            };
            let kind = if plan.quant == Some(fmt) {
                OutKind::Copy
            } else {
                OutKind::Quant(fmt)
            };
            OutTensor {
                name: format!("{base}{QWEIGHT_SUFFIX}"),
                dtype: StDtype::U8,
                shape: vec![n, fmt.row_bytes(k)],
                kind,
                canonical: plan.canonical.clone(),
                label: fmt.name(),
            }
        }
        None if dtype == WeightDType::Fp32 => float(StDtype::F32),
        None => OutTensor {
            name: src.name.clone(),
            dtype: src.dtype,
            shape: src.shape.clone(),
            kind: OutKind::Copy,
            canonical: plan.canonical.clone(),
            label: label(src.dtype),
        },
    })
}

/// Where the source values come from.
#[derive(Debug)]
enum Input {
    /// Float elements (any split of the bytes).
    Float(ElemConverter),
    /// Quantized rows of this format (a partial row waits in `row_carry`).
    Rows(QFormat),
}

/// Converts one tensor's source bytes, pushed in pieces of any size, into its output bytes.
#[derive(Debug)]
pub struct Encoder {
    name: String,
    kind: OutKind,
    input: Input,
    /// Row length of a matrix (quantized input or output).
    k: usize,
    row_carry: Vec<u8>,
    /// Values of a partial output row (quantized output).
    pending: Vec<f32>,
    values: Vec<f32>,
}

impl Encoder {
    pub fn new(plan: &TensorPlan, out: &OutTensor) -> Result<Self> {
        let input = match plan.quant {
            Some(fmt) => Input::Rows(fmt),
            None => Input::Float(ElemConverter::new(plan.src.dtype).map_err(|_| {
                Error::UnsupportedDtype {
                    name: plan.src.name.clone(),
                    dtype: plan.src.dtype.as_str().to_owned(),
                }
            })?),
        };
        Ok(Encoder {
            name: plan.src.name.clone(),
            kind: out.kind,
            input,
            k: plan.shape.last().copied().unwrap_or(0),
            row_carry: Vec::new(),
            pending: Vec::new(),
            values: Vec::new(),
        })
    }

    /// Host bytes held between pushes.
    pub fn held(&self) -> u64 {
        (self.row_carry.capacity() + self.pending.capacity() * 4 + self.values.capacity() * 4)
            as u64
    }

    /// Convert the next source bytes, appending output bytes to `out`.
    pub fn push(&mut self, mut bytes: &[u8], out: &mut Vec<u8>) -> Result<()> {
        if self.kind == OutKind::Copy {
            out.extend_from_slice(bytes);
            return Ok(());
        }
        let mut values = std::mem::take(&mut self.values);
        values.clear();
        let res = match &mut self.input {
            Input::Float(conv) => conv
                .push(bytes, &mut values)
                .and_then(|_| self.emit(&values, out)),
            Input::Rows(fmt) => {
                let (fmt, k) = (*fmt, self.k);
                let rb = fmt.row_bytes(k);
                let mut r = Ok(());
                if !self.row_carry.is_empty() {
                    let take = (rb - self.row_carry.len()).min(bytes.len());
                    self.row_carry.extend_from_slice(&bytes[..take]);
                    bytes = &bytes[take..];
                    if self.row_carry.len() == rb {
                        let row = std::mem::take(&mut self.row_carry);
                        r = self.rows(fmt, &row, &mut values, out);
                        self.row_carry = row;
                        self.row_carry.clear();
                    }
                }
                let whole = bytes.len() / rb * rb;
                if r.is_ok() && whole > 0 {
                    r = self.rows(fmt, &bytes[..whole], &mut values, out);
                }
                self.row_carry.extend_from_slice(&bytes[whole..]);
                r
            }
        };
        self.values = values;
        res
    }

    /// Whole quantized source rows: dequantized in bounded batches, then encoded.
    fn rows(
        &mut self,
        fmt: QFormat,
        rows: &[u8],
        values: &mut Vec<f32>,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        check_rows(fmt, self.k, &self.name, rows)?;
        let rb = fmt.row_bytes(self.k);
        let batch = ((256 << 10) / (4 * self.k.max(1))).max(1) * rb;
        for part in rows.chunks(batch) {
            values.clear();
            dequantize_rows_into(fmt, self.k, part, values)?;
            self.emit(values, out)?;
        }
        Ok(())
    }

    /// Encode values in order into the output format.
    fn emit(&mut self, mut vals: &[f32], out: &mut Vec<u8>) -> Result<()> {
        match self.kind {
            OutKind::Copy => Err(quant_err(&self.name, "copied tensors are not re-encoded")),
            OutKind::Float(StDtype::F32) => {
                out.extend(vals.iter().flat_map(|v| v.to_le_bytes()));
                Ok(())
            }
            OutKind::Float(StDtype::F16) => {
                out.extend(
                    vals.iter()
                        .flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes()),
                );
                Ok(())
            }
            OutKind::Float(d) => Err(Error::UnsupportedDtype {
                name: self.name.clone(),
                dtype: d.as_str().to_owned(),
            }),
            OutKind::Quant(fmt) => {
                let k = self.k;
                if !self.pending.is_empty() {
                    let take = (k - self.pending.len()).min(vals.len());
                    self.pending.extend_from_slice(&vals[..take]);
                    vals = &vals[take..];
                    if self.pending.len() == k {
                        quantize_rows(fmt, k, &self.pending, out)?;
                        self.pending.clear();
                    }
                }
                let whole = vals.len() / k.max(1) * k;
                if whole > 0 {
                    quantize_rows(fmt, k, &vals[..whole], out)?;
                }
                self.pending.extend_from_slice(&vals[whole..]);
                Ok(())
            }
        }
    }

    /// Every byte arrived: nothing may be left over.
    pub fn finish(&self) -> Result<()> {
        let partial = match &self.input {
            Input::Float(c) => c.pending(),
            Input::Rows(_) => self.row_carry.len(),
        };
        if partial != 0 || !self.pending.is_empty() {
            return Err(Error::Truncated {
                file: self.name.clone(),
                expected: 0,
                got: partial as u64,
            });
        }
        Ok(())
    }
}
