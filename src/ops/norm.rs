//! LayerNorm (`shaders/norm.wgsl`).

use crate::cpu::host;
use crate::error::{Error, Result};
use crate::gpu::Backend;
use crate::gpu::{ceil_div, grid_1d, shader, uniform, Kernel, Recorder, Tensor};
use crate::opdef::check;

shader!(pub static SHADER = "norm", [("MAX_WG", MAX_WG)]);

/// Largest workgroup of `layer_norm` (a power of two; the shader's default WG).
const MAX_WG: u32 = 256;
/// Workgroup size of `layer_norm_rowwise` (one invocation per row).
const ROWWISE_WG: u32 = 64;

uniform! {
    struct Params: PARAMS_LAYOUT = "norm" / Params {
        rows: u32, c: u32, eps: f32, _pad: u32
    }
}

/// How a row reduction is spread over invocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowStrategy {
    /// `Invocation` on CPU adapters, `Workgroup` elsewhere.
    Auto,
    /// One workgroup per row, tree reduction in workgroup memory (GPUs: coalesced loads).
    Workgroup,
    /// One invocation per row, no barriers (CPU adapters, where a barrier is a coroutine switch:
    /// ~20x faster on lavapipe for 36864 rows of 128); vec4 loads when C % 4 == 0.
    Invocation,
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
    layer_norm_with(rec, x, (gamma, beta), eps, out, RowStrategy::Auto)
}

/// [`layer_norm`] with an explicit [`RowStrategy`] (tests and benchmarks cover both variants); the affine
/// parameters as one pair.
pub fn layer_norm_with(
    rec: &mut Recorder,
    x: &Tensor,
    (gamma, beta): (&Tensor, &Tensor),
    eps: f32,
    out: &Tensor,
    strategy: RowStrategy,
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
    match rec.backend()? {
        Backend::Host => rec.host_op("layer_norm", &[x], || {
            host::rows::layer_norm(x, gamma, beta, eps, out)
        }),
        Backend::Wgpu(_) => record(rec, [x, gamma, beta, out], &params, strategy),
    }
}

/// The WGSL kernel's dispatch for [`layer_norm_with`] (operands checked, `params` filled).
fn record(
    rec: &mut Recorder,
    [x, gamma, beta, out]: [&Tensor; 4],
    params: &Params,
    strategy: RowStrategy,
) -> Result<()> {
    let (rows, c) = (params.rows as usize, params.c as usize);
    let gpu = rec.gpu().clone();
    let rowwise = match strategy {
        RowStrategy::Auto => gpu.caps.is_cpu,
        RowStrategy::Workgroup => false,
        RowStrategy::Invocation => true,
    };
    let (wg, grid) = if rowwise {
        (ROWWISE_WG, grid_1d(ceil_div(rows, ROWWISE_WG as usize)))
    } else {
        (check::pow2_wg(c, 32, MAX_WG), grid_1d(params.rows))
    };
    let inplace = check::same_buffer(x, out);
    let vec4 = rowwise && c.is_multiple_of(4);
    let entry = if rowwise {
        "layer_norm_rowwise"
    } else {
        "layer_norm"
    };
    let defines: &[&str] = match (vec4, inplace) {
        (true, true) => &["VEC4", "INPLACE"],
        (true, false) => &["VEC4"],
        (false, true) => &["INPLACE"],
        (false, false) => &[],
    };
    let bindings = if inplace {
        vec![
            out.binding(&gpu)?,
            gamma.binding(&gpu)?,
            beta.binding(&gpu)?,
        ]
    } else {
        vec![
            x.binding(&gpu)?,
            gamma.binding(&gpu)?,
            beta.binding(&gpu)?,
            out.binding(&gpu)?,
        ]
    };
    rec.dispatch(
        &Kernel::new(&SHADER, entry)
            .defines(defines)
            .with(&[("WG", wg as f64)]),
        params,
        &bindings,
        grid,
    )
}
