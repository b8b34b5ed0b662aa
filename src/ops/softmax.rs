//! Row softmax and log-softmax (`shaders/softmax.wgsl`), numerically stable (max-subtracted).

use crate::cpu::host;
use crate::error::{Error, Result};
use crate::gpu::Backend;
use crate::gpu::{grid_1d, shader, uniform, Kernel, Recorder, Tensor};
use crate::opdef::check;

shader!(pub static SHADER = "softmax", [("MAX_WG", MAX_WG)]);

/// Largest workgroup (a power of two; the shader's default WG).
const MAX_WG: u32 = 256;

uniform! {
    struct Params: PARAMS_LAYOUT = "softmax" / Params {
        rows: u32, c: u32, _pad0: u32, _pad1: u32
    }
}

fn launch(rec: &mut Recorder, op: &'static str, x: &Tensor, out: &Tensor) -> Result<()> {
    check::f32(op, "x", x)?;
    check::f32(op, "out", out)?;
    check::shape(op, "out", out, x.shape())?;
    let c = x.dim(-1);
    if x.rank() == 0 || c == 0 {
        return Err(Error::shape(op, format!("x {:?} has no rows", x.shape())));
    }
    check::u32_of(op, "elements", x.numel())?;
    let params = Params {
        rows: check::u32_of(op, "rows", x.numel() / c)?,
        c: c as u32,
        _pad0: 0,
        _pad1: 0,
    };
    match rec.backend()? {
        Backend::Host => rec.host_op(op, &[x], || {
            host::rows::softmax_rows(x, out, op == "log_softmax_rows")
        }),
        Backend::Wgpu(_) => {
            let wg = check::pow2_wg(c, 32, MAX_WG);
            let gpu = rec.gpu().clone();
            let inplace = check::same_buffer(x, out);
            let log = op == "log_softmax_rows";
            let defines: &[&str] = match (log, inplace) {
                (false, false) => &[],
                (false, true) => &["INPLACE"],
                (true, false) => &["LOG"],
                (true, true) => &["LOG", "INPLACE"],
            };
            let bindings = if inplace {
                vec![out.binding(&gpu)?]
            } else {
                vec![x.binding(&gpu)?, out.binding(&gpu)?]
            };
            rec.dispatch(
                &Kernel::new(&SHADER, "softmax")
                    .defines(defines)
                    .with(&[("WG", wg as f64)]),
                &params,
                &bindings,
                grid_1d(params.rows),
            )
        }
    }
}

/// out[r, :] = softmax(x[r, :]) over the last dim; x, out (R, C) (leading dims flattened into R).
/// `out` may be `x`. Mask with a large negative finite value, not -inf.
pub fn softmax_rows(rec: &mut Recorder, x: &Tensor, out: &Tensor) -> Result<()> {
    launch(rec, "softmax_rows", x, out)
}

/// out[r, :] = log_softmax(x[r, :]) over the last dim; x, out (R, C). `out` may be `x`.
pub fn log_softmax_rows(rec: &mut Recorder, x: &Tensor, out: &Tensor) -> Result<()> {
    launch(rec, "log_softmax_rows", x, out)
}
