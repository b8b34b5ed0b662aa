//! The position-dependent kernels of a recorded decoder step (`shaders/decode_step.wgsl`): they read the
//! position from a step buffer (U32, written per step) instead of a params uniform, so a step recorded
//! once ([`crate::gpu::Plan`]) serves every position.

use crate::cpu::host;
use crate::error::{Error, Result};
use crate::gpu::Backend;
use crate::gpu::{ceil_div, grid_1d, shader, uniform, DType, Kernel, Recorder, Tensor};
use crate::opdef::check;

shader!(pub static SHADER = "decode_step", [("WG", WG)]);

const WG: u32 = 256;

uniform! {
    struct Params: PARAMS_LAYOUT = "decode_step" / Params {
        b: u32, d: u32, rows: u32, at: u32
    }
}

/// The step buffer: U32 with an element at index `at`.
fn check_step(op: &'static str, step: &Tensor, at: usize) -> Result<u32> {
    check::dtype(op, "step", step, DType::U32)?;
    if at >= step.numel() {
        return Err(Error::shape(
            op,
            format!("step buffer {:?} has no element {at}", step.shape()),
        ));
    }
    check::u32_of(op, "step index", at)
}

/// x[r, :] += table[step[at], :] for x (B, D) f32 and table (P, D) f32 (a row past P adds nothing).
pub fn pos_add(
    rec: &mut Recorder,
    x: &Tensor,
    table: &Tensor,
    step: &Tensor,
    at: usize,
) -> Result<()> {
    const OP: &str = "pos_add";
    check::f32(OP, "x", x)?;
    check::f32(OP, "table", table)?;
    let xs = check::rank(OP, "x", x, 2)?;
    let ts = check::rank(OP, "table", table, 2)?;
    let (b, d) = (xs[0], xs[1]);
    if ts[1] != d {
        return Err(Error::shape(
            OP,
            format!("table {ts:?} rows must have x's width {d}"),
        ));
    }
    check::distinct(OP, ("table", table), ("x", x))?;
    let at = check_step(OP, step, at)?;
    match rec.backend()? {
        Backend::Host => rec.host_op("pos_add", &[x], || {
            host::dense::pos_add(x, table, step, at as usize)
        }),
        Backend::Wgpu(_) => {
            let n = b * d;
            let params = Params {
                b: check::u32_of(OP, "B", b)?,
                d: check::u32_of(OP, "D", d)?,
                rows: check::u32_of(OP, "table rows", ts[0])?,
                at,
            };
            check::u32_of(OP, "table elements", table.numel())?;
            rec.launch(
                &Kernel::new(&SHADER, "pos_add"),
                &params,
                &[step, table, x],
                grid_1d(ceil_div(n, WG as usize)),
            )
        }
    }
}

/// ck[r, step[at], :] = kn[r, :] and cv[r, step[at], :] = vn[r, :] for kn/vn (B, D) f32 and the caches
/// ck/cv (B, L, D), both f32 or both f16 (packed halves, rounded by `pack2x16float` like
/// [`crate::ops::cast::f32_to_f16`]; D even). A row past L writes nothing.
pub fn kv_write(
    rec: &mut Recorder,
    kn: &Tensor,
    vn: &Tensor,
    ck: &Tensor,
    cv: &Tensor,
    step: &Tensor,
    at: usize,
) -> Result<()> {
    const OP: &str = "kv_write";
    for (name, t) in [("kn", kn), ("vn", vn)] {
        check::f32(OP, name, t)?;
    }
    let f16 = match (ck.dtype(), cv.dtype()) {
        (DType::F32, DType::F32) => false,
        (DType::F16, DType::F16) => true,
        (a, b) => {
            return Err(Error::shape(
                OP,
                format!("caches must both be f32 or both f16, got {a:?} and {b:?}"),
            ))
        }
    };
    let ks = check::rank(OP, "kn", kn, 2)?;
    let (b, d) = (ks[0], ks[1]);
    check::shape(OP, "vn", vn, &[b, d])?;
    let cs = check::rank(OP, "ck", ck, 3)?;
    let l = cs[1];
    check::shape(OP, "ck", ck, &[b, l, d])?;
    check::shape(OP, "cv", cv, &[b, l, d])?;
    check::distinct(OP, ("ck", ck), ("cv", cv))?;
    if f16 && !d.is_multiple_of(2) {
        return Err(Error::shape(
            OP,
            format!("f16 caches need an even row width, got {d}"),
        ));
    }
    let at = check_step(OP, step, at)?;
    match rec.backend()? {
        Backend::Host => rec.host_op("kv_write", &[ck], || {
            host::dense::kv_write([kn, vn], [ck, cv], (step, at as usize))
        }),
        Backend::Wgpu(_) => {
            check::u32_of(OP, "cache elements", ck.numel())?;
            let params = Params {
                b: check::u32_of(OP, "B", b)?,
                d: check::u32_of(OP, "D", d)?,
                rows: check::u32_of(OP, "cache rows", l)?,
                at,
            };
            // f16: one invocation per pair of channels.
            let (defines, threads): (&[&str], usize) = match f16 {
                true => (&["KV_WRITE", "KV_F16"], b * d / 2),
                false => (&["KV_WRITE"], b * d),
            };
            rec.launch(
                &Kernel::new(&SHADER, "kv_write").defines(defines),
                &params,
                &[step, kn, vn, ck, cv],
                grid_1d(ceil_div(threads, WG as usize)),
            )
        }
    }
}
