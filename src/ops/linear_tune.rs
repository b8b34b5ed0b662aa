//! The linear op's tune case: its candidates ([`LinearVariant::ALL`] where they `support` the shape),
//! its static choice, the operands one call runs on, and how `auto` shrinks it (rows, then columns, so a
//! call lasts about as long as the tuner asks; decode GEMVs keep enough weight bytes that memory
//! traffic is measured as in the model).

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gpu::registry::{LinearShape, ShapeClass, EXACT_ROWS};
use crate::gpu::tune::{CaseRunner, Resizable, TuneCase};
use crate::gpu::{Caps, DType, Device, Recorder, Tensor};
use crate::ops::matmul::{choose_linear_variant_for, linear, LinearArgs, LinearVariant};

/// In `auto`, shapes are never timed at more rows than this (the per-row cost of a GEMM is flat once
/// the grid fills the device); `exhaustive` times the full shape.
pub const AUTO_MAX_ROWS: usize = 2048;
/// Shrunk shapes keep at least this many rows (GEMM) ...
const MIN_ROWS: usize = 32;
/// ... this many output columns ...
const MIN_COLS: usize = 256;
/// ... and, for timed decode GEMVs, this many weight bytes (so the weights do not fit in a cache and
/// memory traffic is measured as in the model).
const MIN_GEMV_WEIGHT_BYTES: f64 = 16.0 * 1024.0 * 1024.0;

/// Whether a shape's rows are decode rows (GEMV) or not: speeds and bans are per regime.
fn is_gemv(shape: &LinearShape) -> bool {
    shape.m <= EXACT_ROWS
}

impl TuneCase for LinearShape {
    fn class(&self) -> ShapeClass {
        LinearShape::class(self)
    }

    fn candidates(&self, caps: &Caps) -> Vec<&'static str> {
        LinearVariant::ALL
            .into_iter()
            .filter(|v| v.supports(caps, self.m, self.k, self.format))
            .map(LinearVariant::name)
            .collect()
    }

    fn static_choice(&self, caps: &Caps) -> &'static str {
        choose_linear_variant_for(caps, self.m, self.k, self.format).name()
    }

    fn flops(&self) -> f64 {
        LinearShape::flops(self)
    }

    /// Zero-filled operands (values do not change the work of these kernels), with a bias.
    fn prepare(&self, gpu: &Arc<Device>) -> Result<CaseRunner> {
        let s = *self;
        let x = Tensor::zeros(gpu, &[s.m, s.k], DType::F32, "tune.x")?;
        let w = Tensor::zeros(gpu, &[s.n, s.k], s.format, "tune.w")?;
        let b = Tensor::zeros(gpu, &[s.n], DType::F32, "tune.bias")?;
        let out = Tensor::zeros(gpu, &[s.m, s.n], DType::F32, "tune.out")?;
        Ok(Box::new(move |rec: &mut Recorder, name: &'static str| {
            let v = LinearVariant::from_name(name)
                .ok_or_else(|| Error::shape("linear", format!("no variant {name:?}")))?;
            linear(
                rec,
                &x,
                &w,
                LinearArgs::default().bias(Some(&b)).variant(v),
                &out,
            )
        }))
    }

    fn resizable(&self) -> Option<&dyn Resizable> {
        Some(self)
    }

    fn timed_shape(&self) -> Option<LinearShape> {
        Some(*self)
    }
}

impl Resizable for LinearShape {
    fn regime(&self) -> &'static str {
        if is_gemv(self) {
            "gemv"
        } else {
            "gemm"
        }
    }

    fn resized(&self, flops: f64, keep_traffic: bool) -> Box<dyn TuneCase> {
        Box::new(shrink(self, flops, keep_traffic))
    }
}

/// `shape` shrunk so one call has about `flops` FLOPs: rows first (GEMM, down to `MIN_ROWS`, never
/// above [`AUTO_MAX_ROWS`]), then columns (down to `MIN_COLS`; for a decode GEMV's timed size not below
/// `MIN_GEMV_WEIGHT_BYTES` of weights when `keep_traffic`). Rows are multiples of 16 and columns of 64
/// unless the shape's own are smaller.
pub fn shrink(shape: &LinearShape, flops: f64, keep_traffic: bool) -> LinearShape {
    let LinearShape { m, n, k, format } = *shape;
    let per = |rows: usize, cols: usize| 2.0 * rows as f64 * cols as f64 * k as f64;
    let round = |x: usize, q: usize| x.div_ceil(q) * q;
    let mut rows = m;
    if !is_gemv(shape) {
        let want = (flops / per(1, n)).ceil().max(1.0) as usize;
        rows = round(want, 16).clamp(MIN_ROWS.min(m), m.min(AUTO_MAX_ROWS));
    }
    let mut cols = n;
    if per(rows, n) > 2.0 * flops && n > MIN_COLS {
        let mut floor = MIN_COLS;
        if keep_traffic && is_gemv(shape) {
            let row_bytes = format.row_bytes(k).max(1) as f64;
            floor = floor.max((MIN_GEMV_WEIGHT_BYTES / row_bytes).ceil() as usize);
        }
        let want = (flops / per(rows, 1)).ceil().max(1.0) as usize;
        cols = round(want, 64).clamp(floor.min(n), n);
    }
    LinearShape {
        m: rows,
        n: cols,
        k,
        format,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ls(m: usize, n: usize, k: usize, format: DType) -> LinearShape {
        LinearShape { m, n, k, format }
    }

    #[test]
    fn shrink_sizes_by_flops() {
        // Big GEMM: rows shrink (multiples of 16, at least 32), then columns (at least 256).
        let s = ls(36864, 512, 128, DType::F32);
        let p = shrink(&s, 4.0e6, false);
        assert_eq!((p.m, p.k, p.format), (32, 128, DType::F32));
        assert!(
            p.n >= MIN_COLS && p.n.is_multiple_of(64) && p.n <= 512,
            "{p:?}"
        );
        let t = shrink(&s, 1.0e9, true);
        assert_eq!(
            (t.m, t.n),
            (AUTO_MAX_ROWS, 512),
            "capped rows, full columns"
        );
        let t = shrink(&s, 5.0e7, true);
        assert_eq!(t.n, 512);
        assert!(
            t.m.is_multiple_of(16) && t.m > 32 && t.m < AUTO_MAX_ROWS,
            "{t:?}"
        );
        // Small shapes stay as they are.
        let small = ls(9, 24, 21, DType::F16);
        assert_eq!(shrink(&small, 1.0, false), small);
        // Decode GEMV: rows stay; the probe shrinks columns, the timed size keeps 16 MiB of weights.
        let head = ls(1, 51328, 768, DType::F16);
        let p = shrink(&head, 1.0e5, false);
        assert_eq!((p.m, p.n), (1, MIN_COLS));
        let t = shrink(&head, 1.0e5, true);
        let bytes = t.n * DType::F16.row_bytes(768);
        assert!(
            bytes as f64 >= MIN_GEMV_WEIGHT_BYTES && t.n < 51328,
            "{t:?}"
        );
        assert_eq!(shrink(&head, 1.0e12, true), head);
    }
}
