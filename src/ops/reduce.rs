//! Row reductions (`shaders/reduce.wgsl`): `argmax_rows`, `topk_rows` (beam search), `mean_rows`
//! (DaViT's final spatial mean pooling).
//!
//! Ordering rule of argmax/topk: values rank by float order with NaN above everything (like
//! torch.argmax / torch.topk) and -0 == +0; equal values rank by LOWER index first. So argmax returns
//! the first maximal index (torch.argmax's documented rule) and topk's output order is that of a stable
//! descending sort.

use crate::cpu::host;
use crate::error::{Error, Result};
use crate::gpu::Backend;
use crate::gpu::{ceil_div, grid_1d, shader, uniform, DType, Kernel, Recorder, Tensor};
use crate::opdef::check;

shader!(pub static SHADER = "reduce", [("MAX_WG", MAX_WG), ("MAXK", MAX_TOPK as u32)]);

/// Largest k supported by `topk_rows`.
pub const MAX_TOPK: usize = 16;

/// Largest workgroup (a power of two): the size of the shader's workgroup arrays; `mean_rows` runs with it.
const MAX_WG: u32 = 256;

uniform! {
    struct Params: PARAMS_LAYOUT = "reduce" / Params {
        rows: u32, v: u32, k: u32, _pad: u32
    }
}

/// (R, V) of a row-reduction input; any leading dims are flattened into R.
fn rows_of(op: &'static str, x: &Tensor) -> Result<(usize, usize)> {
    check::f32(op, "x", x)?;
    let v = x.dim(-1);
    if x.rank() == 0 || v == 0 {
        return Err(Error::shape(
            op,
            format!("x {:?} has empty rows", x.shape()),
        ));
    }
    check::u32_of(op, "elements", x.numel())?;
    Ok((x.numel() / v, v))
}

/// out[r] = the index of the largest value of x[r, :] (lowest index among equals; NaN ranks highest),
/// for x f32 (R, V) and out U32 (R). Leading dims of x are flattened into R; out must have R elements
/// as a 1-D tensor.
pub fn argmax_rows(rec: &mut Recorder, x: &Tensor, out: &Tensor) -> Result<()> {
    const OP: &str = "argmax_rows";
    let (r, v) = rows_of(OP, x)?;
    check::dtype(OP, "out", out, DType::U32)?;
    check::shape(OP, "out", out, &[r])?;
    let params = Params {
        rows: r as u32,
        v: v as u32,
        k: 1,
        _pad: 0,
    };
    match rec.backend()? {
        Backend::Host => rec.host_op("argmax_rows", &[x], || host::rows::argmax_rows(x, out)),
        Backend::Wgpu(_) => {
            let wg = check::pow2_wg(v, 32, MAX_WG);
            rec.launch(
                &Kernel::new(&SHADER, "argmax_rows").with(&[("WG", wg as f64)]),
                &params,
                &[x, out],
                grid_1d(params.rows),
            )
        }
    }
}

/// The k largest values of each row of x f32 (R, V), descending, into vals f32 (R, k) and their column
/// indices into ids U32 (R, k); 1 <= k <= min(16, V). Equal values come lowest index first; NaN ranks
/// highest. For beam search over beams x vocabulary, view the scores as (B, beams * V).
pub fn topk_rows(
    rec: &mut Recorder,
    x: &Tensor,
    k: usize,
    vals: &Tensor,
    ids: &Tensor,
) -> Result<()> {
    const OP: &str = "topk_rows";
    let (r, v) = rows_of(OP, x)?;
    if k == 0 || k > MAX_TOPK || k > v {
        return Err(Error::shape(
            OP,
            format!("k = {k} must be in 1..={} (and <= V = {v})", MAX_TOPK),
        ));
    }
    check::f32(OP, "vals", vals)?;
    check::dtype(OP, "ids", ids, DType::U32)?;
    check::shape(OP, "vals", vals, &[r, k])?;
    check::shape(OP, "ids", ids, &[r, k])?;
    check::distinct(OP, ("x", x), ("vals", vals))?;
    let params = Params {
        rows: r as u32,
        v: v as u32,
        k: k as u32,
        _pad: 0,
    };
    match rec.backend()? {
        Backend::Host => rec.host_op("topk_rows", &[x], || host::rows::topk_rows(x, k, vals, ids)),
        Backend::Wgpu(_) => {
            let wg = check::pow2_wg(v, 32, MAX_WG);
            rec.launch(
                &Kernel::new(&SHADER, "topk_rows").with(&[("WG", wg as f64)]),
                &params,
                &[x, vals, ids],
                grid_1d(params.rows),
            )
        }
    }
}

/// out[b, c] = mean over n of x[b, n, c], for x (B, N, C) and out (B, C); N >= 1.
pub fn mean_rows(rec: &mut Recorder, x: &Tensor, out: &Tensor) -> Result<()> {
    const OP: &str = "mean_rows";
    check::f32(OP, "x", x)?;
    check::f32(OP, "out", out)?;
    let xs = check::rank(OP, "x", x, 3)?;
    let (b, n, c) = (xs[0], xs[1], xs[2]);
    if n == 0 {
        return Err(Error::shape(OP, format!("x {xs:?}: mean over N = 0")));
    }
    check::shape(OP, "out", out, &[b, c])?;
    check::distinct(OP, ("x", x), ("out", out))?;
    check::u32_of(OP, "elements", x.numel())?;
    match rec.backend()? {
        Backend::Host => rec.host_op("mean_rows", &[x], || host::rows::mean_rows(x, out)),
        Backend::Wgpu(_) => {
            let params = Params {
                rows: b as u32,
                v: n as u32,
                k: c as u32,
                _pad: 0,
            };
            rec.launch(
                &Kernel::new(&SHADER, "mean_rows").with(&[("WG", MAX_WG as f64)]),
                &params,
                &[x, out],
                grid_1d(ceil_div(b * c, MAX_WG as usize)),
            )
        }
    }
}
