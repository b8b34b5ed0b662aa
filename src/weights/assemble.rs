//! The loading core shared by the ranged loader ([`crate::weights::load_files`]) and the push-style
//! streaming loader ([`crate::weights::StreamLoader`]): an [`Assembler`] decides, per source tensor, what it
//! becomes (canonical name, expected shape, layout fix-up, or ignored), opens a [`TensorWriter`] that
//! converts its bytes to f32 chunk by chunk straight into a GPU buffer, and at the end checks the table
//! of expected tensors, ties the LM head and synthesizes the temporal table if absent.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::config::Florence2Config;
use crate::error::{Error, Result};
use crate::gpu::{DType, Device, MemKind, Recorder, Tensor};
use crate::ops::layout::permute;
use crate::quant::{dequantize_rows_into, quantize_rows, QFormat};
use crate::weights::convert::ElemConverter;
use crate::weights::dtype_plan::DTypePlan;
use crate::weights::expected::{temporal_cosine_table, LM_HEAD, SHARED, TEMPORAL_TABLE};
use crate::weights::header::Header;
use crate::weights::names::{Layout, FINAL_LOGITS_BIAS};
pub use crate::weights::plan::{Fixup, Planner, TensorPlan};
use crate::weights::quantized::{check_rows, quant_err};
use crate::weights::store::Weights;

/// Loader tuning.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Largest byte range read (ranged loader) or converted (per push) at once.
    pub chunk_bytes: usize,
    /// Natively, submit the queue (flushing wgpu's staging copies of `write_buffer`) after this many
    /// bytes were written, so host staging memory stays bounded.
    pub flush_bytes: u64,
    /// Resident format of the matrix weights, per part of the model (default uniform fp16).
    pub dtype: DTypePlan,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            chunk_bytes: 8 << 20,
            flush_bytes: 64 << 20,
            dtype: DTypePlan::default(),
        }
    }
}

impl LoadOptions {
    /// Default tuning with the given resident dtype (one format, or a [`DTypePlan`] per part).
    pub fn with_dtype(dtype: impl Into<DTypePlan>) -> Self {
        LoadOptions {
            dtype: dtype.into(),
            ..LoadOptions::default()
        }
    }
}

/// Host-memory accounting of the loader's own buffers (bytes held by the loader, not by wgpu).
/// `current` is the latest figure, `peak` the largest seen.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemStats {
    pub current: u64,
    pub peak: u64,
}

impl MemStats {
    pub fn set(&mut self, current: u64) {
        self.current = current;
        self.peak = self.peak.max(current);
    }
}

/// Receives one tensor's bytes in order, in pieces of any size.
pub struct TensorWriter {
    plan: TensorPlan,
    /// Element converter of a float source (`None` for a quantized source, which arrives in rows).
    conv: Option<ElemConverter>,
    /// GPU buffer receiving the source-layout values in its resident dtype (f32 when a fix-up permutes
    /// it on the GPU when complete).
    dest: Tensor,
    /// Elements converted so far.
    written: usize,
    /// Converted values not yet encoded: the resident dtype is written in whole units (f16: a pair,
    /// q8/q4: a row), so at most one unit's worth waits here.
    pending: Vec<f32>,
    /// Elements already written to `dest`.
    flushed: usize,
    /// Every value seen so far is zero (tracked to drop an all-zero `final_logits_bias`).
    all_zero: bool,
    /// Quantized source: the bytes of a partial row held between pushes.
    row_carry: Vec<u8>,
    /// Quantized source: bytes received so far.
    bytes_in: u64,
}

impl TensorWriter {
    pub fn plan(&self) -> &TensorPlan {
        &self.plan
    }

    /// Bytes held on the host by this writer (a partial element).
    pub fn host_bytes(&self) -> u64 {
        let partial = self.conv.as_ref().map_or(0, ElemConverter::pending);
        (partial + self.pending.capacity() * 4 + self.row_carry.capacity()) as u64
    }

    /// Elements per encoded unit of the resident dtype, and bytes per unit.
    fn unit(&self) -> (usize, usize) {
        let k = self.dest.dim(-1);
        match self.dest.dtype() {
            DType::F16 => (2, 4),
            d if d.qformat().is_some() => (k, d.row_bytes(k)),
            _ => (1, 4),
        }
    }
}

/// Collects tensors from one or more safetensors files into [`Weights`].
pub struct Assembler {
    gpu: Arc<Device>,
    opts: LoadOptions,
    planner: Planner,
    weights: Weights,
    scratch: Vec<f32>,
    since_flush: u64,
    /// Host bytes the caller reported holding (header buffer, the chunk being read).
    external: u64,
    stats: MemStats,
}

impl Assembler {
    pub fn new(gpu: &Arc<Device>, cfg: &Florence2Config, opts: LoadOptions) -> Self {
        Assembler {
            gpu: gpu.clone(),
            opts,
            planner: Planner::new(cfg),
            weights: Weights::new(),
            scratch: Vec::new(),
            since_flush: 0,
            external: 0,
            stats: MemStats::default(),
        }
    }

    pub fn options(&self) -> &LoadOptions {
        &self.opts
    }

    /// Fix the layout (e.g. from an index's names) before any header is planned.
    pub fn set_layout(&mut self, layout: Layout) {
        self.planner.set_layout(layout);
    }

    pub fn layout(&self) -> Option<Layout> {
        self.planner.layout()
    }

    /// Peak host bytes held by the loader's own buffers so far (conversion scratch, partial elements,
    /// and whatever the caller reported via [`Assembler::note_held`]).
    pub fn mem_stats(&self) -> MemStats {
        self.stats
    }

    /// Report host bytes held by the caller (e.g. the streaming loader's header buffer) for accounting.
    pub fn note_held(&mut self, bytes: u64) {
        self.external = bytes;
        let cur = bytes + (self.scratch.capacity() * 4) as u64;
        self.stats.set(cur);
    }

    /// Plan every tensor of a header (file order): [`Planner::plan_header`].
    pub fn plan_header(&mut self, file: &str, header: &Header) -> Result<Vec<Option<TensorPlan>>> {
        self.planner.plan_header(file, header)
    }

    /// Open a writer for a planned tensor (allocates its GPU buffer in the source layout).
    pub fn begin(&mut self, plan: TensorPlan) -> Result<TensorWriter> {
        let conv =
            match plan.quant {
                Some(_) => None,
                None => Some(ElemConverter::new(plan.src.dtype).map_err(|_| {
                    Error::UnsupportedDtype {
                        name: plan.src.name.clone(),
                        dtype: plan.src.dtype.as_str().to_owned(),
                    }
                })?),
            };
        let (shape, dtype) = self
            .opts
            .dtype
            .for_tensor(&plan.canonical)
            .load_layout(&plan);
        let dest = Tensor::zeros_kind(&self.gpu, shape, dtype, &plan.canonical, MemKind::Weights)?;
        Ok(TensorWriter {
            plan,
            conv,
            dest,
            written: 0,
            pending: Vec::new(),
            flushed: 0,
            all_zero: true,
            row_carry: Vec::new(),
            bytes_in: 0,
        })
    }

    /// Feed the next bytes of the writer's tensor.
    pub fn push(&mut self, w: &mut TensorWriter, bytes: &[u8]) -> Result<()> {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        let res = self.push_inner(w, bytes, &mut scratch);
        self.scratch = scratch;
        res
    }

    fn push_inner(&mut self, w: &mut TensorWriter, bytes: &[u8], out: &mut Vec<f32>) -> Result<()> {
        match w.conv.as_mut() {
            Some(conv) => conv.push(bytes, out)?,
            None => return self.push_quantized(w, bytes, out),
        }
        self.accept_values(w, out, out.capacity())
    }

    /// Quantized source: gather whole rows (a partial row waits in `row_carry`), then either copy them
    /// straight into the buffer (same format) or dequantize them in bounded batches and encode those
    /// like float values.
    fn push_quantized(
        &mut self,
        w: &mut TensorWriter,
        mut bytes: &[u8],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let (Some(fmt), &[_, k]) = (w.plan.quant, w.plan.shape.as_slice()) else {
            return Err(quant_err(&w.plan.src.name, "not a quantized matrix"));
        };
        let rb = fmt.row_bytes(k);
        let total = w.plan.src.byte_len();
        if w.bytes_in + bytes.len() as u64 > total {
            return Err(Error::SafetensorsHeader {
                file: w.plan.src.name.clone(),
                msg: "more bytes than the tensor holds".into(),
            });
        }
        w.bytes_in += bytes.len() as u64;
        if !w.row_carry.is_empty() {
            let take = (rb - w.row_carry.len()).min(bytes.len());
            w.row_carry.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if w.row_carry.len() == rb {
                let row = std::mem::take(&mut w.row_carry);
                self.quantized_rows(w, fmt, k, &row, out)?;
                w.row_carry = row;
                w.row_carry.clear();
            }
        }
        let whole = bytes.len() / rb * rb;
        if whole > 0 {
            self.quantized_rows(w, fmt, k, &bytes[..whole], out)?;
        }
        w.row_carry.extend_from_slice(&bytes[whole..]);
        if self.since_flush >= self.opts.flush_bytes {
            self.flush()?;
        }
        Ok(())
    }

    /// Whole quantized rows from the file into the writer's resident dtype.
    fn quantized_rows(
        &mut self,
        w: &mut TensorWriter,
        fmt: QFormat,
        k: usize,
        rows: &[u8],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        check_rows(fmt, k, &w.plan.src.name, rows)?;
        let rb = fmt.row_bytes(k);
        if w.dest.dtype().qformat() == Some(fmt) {
            // The file holds the GPU row layout: straight copy.
            let offset = (w.flushed / k * rb) as u64;
            w.dest.write_bytes(&self.gpu, offset, rows)?;
            let n = rows.len() / rb * k;
            w.written += n;
            w.flushed += n;
            self.since_flush += rows.len() as u64;
            let held = self.external + w.host_bytes();
            self.stats.set(held);
            return Ok(());
        }
        // Dequantize at most ~256 KiB of f32 at once (at least one row), whatever the chunk size.
        let batch = ((256 << 10) / (4 * k)).max(1) * rb;
        for part in rows.chunks(batch) {
            out.clear();
            dequantize_rows_into(fmt, k, part, out)?;
            self.accept_values(w, out, out.capacity())?;
        }
        Ok(())
    }

    /// Route converted f32 values (in order) into the writer's resident dtype.
    /// `scratch_capacity`: elements of the f32 scratch holding them (host accounting).
    fn accept_values(
        &mut self,
        w: &mut TensorWriter,
        out: &[f32],
        scratch_capacity: usize,
    ) -> Result<()> {
        let numel: usize = w.plan.shape.iter().product();
        if w.written + out.len() > numel {
            return Err(Error::SafetensorsHeader {
                file: w.plan.src.name.clone(),
                msg: "more bytes than the tensor holds".into(),
            });
        }

        if w.all_zero && w.plan.canonical == FINAL_LOGITS_BIAS {
            w.all_zero = out.iter().all(|&x| x == 0.0);
        }
        w.written += out.len();
        let (unit, unit_bytes) = w.unit();
        if unit == 1 {
            if !out.is_empty() {
                w.dest
                    .write_bytes(&self.gpu, (w.flushed * 4) as u64, bytemuck::cast_slice(out))?;
                self.since_flush += (out.len() * 4) as u64;
                w.flushed += out.len();
            }
            let held = self.external + w.host_bytes() + (scratch_capacity * 4) as u64;
            self.stats.set(held);
        } else {
            // Complete the pending unit first, then encode this chunk's whole units straight from it;
            // the partial unit at its end waits in `pending`.
            let mut vals: &[f32] = out;
            if !w.pending.is_empty() {
                let take = (unit - w.pending.len()).min(vals.len());
                w.pending.extend_from_slice(&vals[..take]);
                vals = &vals[take..];
                if w.pending.len() == unit {
                    let pending = std::mem::take(&mut w.pending);
                    self.write_units(w, unit, unit_bytes, &pending, scratch_capacity)?;
                    w.pending = pending;
                    w.pending.clear();
                }
            }
            let whole = vals.len() / unit * unit;
            if whole > 0 {
                self.write_units(w, unit, unit_bytes, &vals[..whole], scratch_capacity)?;
            }
            w.pending.extend_from_slice(&vals[whole..]);
        }
        if self.since_flush >= self.opts.flush_bytes {
            self.flush()?;
        }
        Ok(())
    }

    /// Encode whole units of values into the writer's resident dtype and write them after what was
    /// written so far. `scratch_capacity`: the f32 scratch the caller holds (host accounting).
    fn write_units(
        &mut self,
        w: &mut TensorWriter,
        unit: usize,
        unit_bytes: usize,
        vals: &[f32],
        scratch_capacity: usize,
    ) -> Result<()> {
        let bytes = encode(w.dest.dtype(), unit, vals)?;
        let held = self.external + w.host_bytes() + (scratch_capacity * 4 + bytes.len()) as u64;
        self.stats.set(held);
        let offset = (w.flushed / unit * unit_bytes) as u64;
        w.dest.write_bytes(&self.gpu, offset, &bytes)?;
        self.since_flush += bytes.len() as u64;
        w.flushed += vals.len();
        Ok(())
    }

    /// Submit pending buffer writes (natively this lets wgpu free its staging copies).
    pub fn flush(&mut self) -> Result<()> {
        self.since_flush = 0;
        if let Ok(hw) = self.gpu.wgpu() {
            hw.queue.submit(std::iter::empty());
            #[cfg(not(target_arch = "wasm32"))]
            self.gpu.wait_idle()?;
        }
        Ok(())
    }

    /// Close a writer: every element must have arrived; apply the fix-up; store the tensor.
    pub fn finish_tensor(&mut self, w: TensorWriter) -> Result<()> {
        let numel: usize = w.plan.shape.iter().product();
        let (partial, got) = match &w.conv {
            Some(conv) => (
                conv.pending(),
                (w.written * w.plan.src.dtype.size() + conv.pending()) as u64,
            ),
            None => (w.row_carry.len(), w.bytes_in),
        };
        if w.written != numel || partial != 0 {
            return Err(Error::Truncated {
                file: w.plan.src.name.clone(),
                expected: w.plan.src.byte_len(),
                got,
            });
        }
        let TensorWriter {
            plan,
            dest,
            all_zero,
            pending,
            flushed,
            ..
        } = w;
        if !pending.is_empty() {
            // Only an f16 tensor with an odd element count ends mid-unit: pad its last pair with 0
            // (the buffer is padded to 4 bytes).
            if dest.dtype() != DType::F16 || pending.len() != 1 {
                return Err(Error::Truncated {
                    file: plan.src.name.clone(),
                    expected: plan.src.byte_len(),
                    got: (flushed * plan.src.dtype.size()) as u64,
                });
            }
            let bytes = encode(DType::F16, 2, &[pending[0], 0.0])?;
            dest.write_bytes(&self.gpu, (flushed * 2) as u64, &bytes)?;
        }
        if plan.canonical == FINAL_LOGITS_BIAS && all_zero {
            log::debug!("final_logits_bias is all zeros: dropped");
            return Ok(());
        }
        let tensor = match &plan.fixup {
            Fixup::None => dest,
            Fixup::Permute(perm) => {
                // On the GPU: the staged source-layout tensor is permuted into the canonical one.
                let (shape, dtype) = self
                    .opts
                    .dtype
                    .for_tensor(&plan.canonical)
                    .resident_layout(&plan);
                let out =
                    Tensor::zeros_kind(&self.gpu, shape, dtype, &plan.canonical, MemKind::Weights)?;
                let mut rec = Recorder::new(&self.gpu);
                permute(&mut rec, &dest, perm, &out)?;
                rec.submit()?;
                out
            }
        };
        self.weights.insert(plan.canonical, tensor);
        Ok(())
    }

    /// Names of source tensors that were skipped as unused.
    pub fn ignored(&self) -> &[String] {
        self.planner.ignored()
    }

    /// Check the table, tie the LM head, synthesize the temporal table if absent; flush the queue.
    pub fn finish(mut self) -> Result<Weights> {
        // Missing tensors first: nothing is synthesized (allocated) for a checkpoint that is refused
        // anyway. The temporal table is the one required tensor the loader can make itself.
        let missing: BTreeSet<&String> = self
            .planner
            .table
            .iter()
            .filter(|(n, (_, req))| *req && !self.weights.has(n) && n.as_str() != TEMPORAL_TABLE)
            .map(|(n, _)| n)
            .collect();
        if let Some(first) = missing.first() {
            if missing.len() > 1 {
                log::debug!("{} tensors missing: {missing:?}", missing.len());
            }
            return Err(Error::MissingTensor {
                name: (*first).clone(),
            });
        }
        if !self.weights.has(TEMPORAL_TABLE) {
            if let Some((shape, _)) = self.planner.table.get(TEMPORAL_TABLE) {
                if let [n, c] = shape.as_slice() {
                    // Bounded by the config's cost checks (Florence2Config::validate).
                    let data = temporal_cosine_table(*n, *c);
                    let t = Tensor::from_bytes_kind(
                        &self.gpu,
                        shape,
                        DType::F32,
                        bytemuck::cast_slice(&data),
                        TEMPORAL_TABLE,
                        MemKind::Weights,
                    )?;
                    self.weights.insert(TEMPORAL_TABLE, t);
                }
            }
        }
        if !self.weights.has(LM_HEAD) {
            let shared = self.weights.get_any(SHARED)?;
            self.weights.insert(LM_HEAD, shared);
        }
        let ignored = self.planner.ignored();
        if !ignored.is_empty() {
            log::debug!(
                "{} checkpoint tensors not used: {:?}",
                ignored.len(),
                ignored
            );
        }
        self.flush()?;
        Ok(self.weights)
    }
}

/// Encode whole units of f32 values into `dtype`'s storage bytes (f16 pairs, or quantized rows of
/// `unit` weights).
fn encode(dtype: DType, unit: usize, vals: &[f32]) -> Result<Vec<u8>> {
    match dtype.qformat() {
        Some(q) => {
            let mut out = Vec::with_capacity(vals.len() / unit * q.row_bytes(unit));
            quantize_rows(q, unit, vals, &mut out)?;
            Ok(out)
        }
        None => {
            let h: Vec<half::f16> = vals.iter().map(|&v| half::f16::from_f32(v)).collect();
            Ok(bytemuck::cast_slice(&h).to_vec())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::dtype::WeightDType;

    #[test]
    fn dtype_names_parse() {
        for d in WeightDType::ALL {
            assert_eq!(d.as_str().parse::<WeightDType>().unwrap(), d);
        }
        assert_eq!("F16".parse::<WeightDType>().unwrap(), WeightDType::Fp16);
        assert!(matches!(
            "int3".parse::<WeightDType>(),
            Err(Error::UnknownDType { .. })
        ));
        assert_eq!(
            LoadOptions::default().dtype,
            DTypePlan::uniform(WeightDType::Fp16)
        );
    }

    #[test]
    fn matrix_dtype_falls_back_to_f16_for_partial_blocks() {
        assert_eq!(WeightDType::Q8.matrix_dtype(64), DType::Q8);
        assert_eq!(WeightDType::Q4.matrix_dtype(48), DType::F16);
        assert_eq!(WeightDType::Fp32.matrix_dtype(48), DType::F32);
    }
}
