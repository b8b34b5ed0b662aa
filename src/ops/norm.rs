//! LayerNorm (`shaders/norm.wgsl`).

use crate::error::{Error, Result};
use crate::gpu::{grid_1d, Kernel, Recorder, Shader, Tensor};
use crate::ops::check;

pub static SHADER: Shader = Shader {
    name: "norm",
    source: include_str!("../../shaders/norm.wgsl"),
};

/// Mirrors `Params` in `shaders/norm.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    rows: u32,
    c: u32,
    eps: f32,
    _pad: u32,
}

/// out = LayerNorm(x) over the last dim C with affine `gamma`, `beta` (C); x, out (R, C) or any shape
/// whose last dim is C (leading dims are flattened). `out` may be `x`.
pub fn layer_norm(
    rec: &mut Recorder,
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f32,
    out: &Tensor,
) -> Result<()> {
    const OP: &str = "layer_norm";
    for (n, t) in [("x", x), ("gamma", gamma), ("beta", beta), ("out", out)] {
        check::f32(OP, n, t)?;
    }
    check::shape(OP, "out", out, x.shape())?;
    let c = x.dim(-1);
    if x.rank() == 0 || c == 0 {
        return Err(Error::shape(OP, format!("x {:?} has no rows", x.shape())));
    }
    check::shape(OP, "gamma", gamma, &[c])?;
    check::shape(OP, "beta", beta, &[c])?;
    check::distinct(OP, ("gamma", gamma), ("out", out))?;
    check::distinct(OP, ("beta", beta), ("out", out))?;
    let rows = x.numel() / c;
    let params = Params {
        rows: check::u32_of(OP, "rows", rows)?,
        c: check::u32_of(OP, "C", c)?,
        eps,
        _pad: 0,
    };
    check::u32_of(OP, "elements", x.numel())?;
    let wg = check::pow2_wg(c, 32, 256);
    let gpu = rec.gpu().clone();
    let inplace = check::same_buffer(x, out);
    let (entry, bindings) = if inplace {
        (
            "layer_norm_inplace",
            vec![
                out.binding(&gpu)?,
                gamma.binding(&gpu)?,
                beta.binding(&gpu)?,
            ],
        )
    } else {
        (
            "layer_norm",
            vec![
                x.binding(&gpu)?,
                gamma.binding(&gpu)?,
                beta.binding(&gpu)?,
                out.binding(&gpu)?,
            ],
        )
    };
    rec.dispatch(
        &Kernel::new(&SHADER, entry).with(&[("WG", wg as f64)]),
        &params,
        &bindings,
        grid_1d(params.rows),
    )
}
