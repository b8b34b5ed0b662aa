//! The resident weight formats (fp32, fp16, q8, q4) and the element type each tensor is kept in.

use crate::error::{Error, Result};
use crate::gpu::DType;
use crate::quant::QBLOCK;
use crate::weights::expected::{is_dense_conv_weight, is_matrix_weight};
use crate::weights::plan::{Fixup, TensorPlan};

/// The format the matrix weights are kept in on the GPU (see [`is_matrix_weight`]); the dense
/// convolutions follow [`WeightDType::conv_dtype`], every other tensor (depthwise convolutions, norms,
/// biases, position tables) stays f32. Any source dtype (f32, f16, bf16) converts
/// into any resident dtype on the way in, chunk by chunk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WeightDType {
    /// f32 weights.
    Fp32,
    /// IEEE half weights (packed pairs), f32 arithmetic: half the bytes, read on every adapter.
    #[default]
    Fp16,
    /// 8-bit block-quantized weights ([`crate::quant`]), f16 where a matrix's rows are not whole
    /// 32-weight blocks.
    Q8,
    /// 4-bit block-quantized weights, likewise.
    Q4,
}

impl WeightDType {
    pub const ALL: [WeightDType; 4] = [
        WeightDType::Fp32,
        WeightDType::Fp16,
        WeightDType::Q8,
        WeightDType::Q4,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WeightDType::Fp32 => "fp32",
            WeightDType::Fp16 => "fp16",
            WeightDType::Q8 => "q8",
            WeightDType::Q4 => "q4",
        }
    }

    /// The resident dtype whose matrices are stored as `d` (f32 and u32: fp32).
    pub fn of_matrix_dtype(d: DType) -> WeightDType {
        match d {
            DType::F16 => WeightDType::Fp16,
            DType::Q8 => WeightDType::Q8,
            DType::Q4 => WeightDType::Q4,
            DType::F32 | DType::U32 => WeightDType::Fp32,
        }
    }

    /// The format of the dense convolution weights ([`is_dense_conv_weight`]): f32 for fp32, f16 for
    /// every other resident dtype (the im2col GEMM reads f16; the blocks of q8/q4 are for matrices).
    pub fn conv_dtype(self) -> DType {
        match self {
            WeightDType::Fp32 => DType::F32,
            WeightDType::Fp16 | WeightDType::Q8 | WeightDType::Q4 => DType::F16,
        }
    }

    /// The buffer a planned tensor's bytes are loaded into (shape, element type): matrix weights in
    /// [`WeightDType::matrix_dtype`], dense convolutions in [`WeightDType::conv_dtype`], everything else
    /// f32; a tensor with a layout fix-up arrives as f32 in its source shape (the f32 layout kernels
    /// permute it on the GPU).
    pub fn load_layout(self, plan: &TensorPlan) -> (&[usize], DType) {
        match plan.fixup {
            Fixup::None => (
                &plan.shape,
                self.resident_dtype(&plan.canonical, &plan.shape),
            ),
            Fixup::Permute(_) => (&plan.src.shape, DType::F32),
        }
    }

    /// The buffer a planned tensor stays in once loaded (shape, element type): as loaded
    /// ([`WeightDType::load_layout`]), or f32 in the canonical shape after a fix-up's permutation.
    pub fn resident_layout(self, plan: &TensorPlan) -> (&[usize], DType) {
        match plan.fixup {
            Fixup::None => self.load_layout(plan),
            Fixup::Permute(_) => (&plan.shape, DType::F32),
        }
    }

    /// The element type a tensor of canonical `name` and `shape` is kept in when it arrives in the
    /// canonical layout.
    pub fn resident_dtype(self, name: &str, shape: &[usize]) -> DType {
        if is_matrix_weight(name, shape) {
            self.matrix_dtype(shape.last().copied().unwrap_or(0))
        } else if is_dense_conv_weight(name, shape) {
            self.conv_dtype()
        } else {
            DType::F32
        }
    }

    /// The GPU element type of a matrix weight with rows of `k` elements.
    pub fn matrix_dtype(self, k: usize) -> DType {
        let whole_blocks = k > 0 && k.is_multiple_of(QBLOCK);
        match self {
            WeightDType::Fp32 => DType::F32,
            WeightDType::Fp16 => DType::F16,
            WeightDType::Q8 if whole_blocks => DType::Q8,
            WeightDType::Q4 if whole_blocks => DType::Q4,
            WeightDType::Q8 | WeightDType::Q4 => DType::F16,
        }
    }
}

impl std::fmt::Display for WeightDType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for WeightDType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl std::str::FromStr for WeightDType {
    type Err = Error;
    /// `fp32`/`f32`/`float32`, `fp16`/`f16`/`float16`, `q8`/`int8`, `q4`/`int4` (case-insensitive).
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "fp32" | "f32" | "float32" => Ok(WeightDType::Fp32),
            "fp16" | "f16" | "float16" => Ok(WeightDType::Fp16),
            "q8" | "int8" => Ok(WeightDType::Q8),
            "q4" | "int4" => Ok(WeightDType::Q4),
            _ => Err(Error::UnknownDType {
                got: s.chars().take(32).collect(),
                expected: "fp32, fp16, q8 or q4",
            }),
        }
    }
}
