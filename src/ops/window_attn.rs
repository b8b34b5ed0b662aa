//! DaViT window attention fused over the qkv Linear's output (`shaders/window_attn.wgsl`): per window
//! and head, softmax(q k^T * scale) v with no mask, for head_dim a multiple of 4 up to 32 (every released
//! Florence-2 uses 32). Other head sizes go through the generic `ops::attention::attention`.

use crate::error::{Error, Result};
use crate::gpu::{ceil_div, grid_1d, Kernel, Recorder, Shader, Tensor};
use crate::ops::check;

pub static SHADER: Shader = Shader {
    name: "window_attn",
    source: include_str!("../../shaders/window_attn.wgsl"),
};

const WG: u32 = 64;
const QPI: usize = 4;
/// Largest head_dim the fused kernel keeps in registers (MAXD4 * 4 in the shader).
pub const MAX_HEAD_DIM: usize = 32;

/// Mirrors `Params` in `shaders/window_attn.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    total: u32,
    t: u32,
    heads: u32,
    c4: u32,
    nqg: u32,
    _pad0: u32,
    scale: f32,
    _pad1: u32,
}

/// Whether [`window_attention`] handles `heads` heads over `c` channels.
pub fn supported(c: usize, heads: usize) -> bool {
    heads > 0
        && c.is_multiple_of(heads)
        && (c / heads).is_multiple_of(4)
        && c / heads <= MAX_HEAD_DIM
}

/// out (nW, T, C) = per window and head, softmax(q k^T * scale) v, where qkv (nW, T, 3C) holds q | k | v
/// with heads interleaved in columns (the DaViT `qkv` Linear's layout). Requires [`supported`].
pub fn window_attention(
    rec: &mut Recorder,
    qkv: &Tensor,
    heads: usize,
    scale: f32,
    out: &Tensor,
) -> Result<()> {
    const OP: &str = "window_attention";
    for (n, t) in [("qkv", qkv), ("out", out)] {
        check::f32(OP, n, t)?;
        check::rank(OP, n, t, 3)?;
    }
    let (nw, t, c3) = (qkv.dim(0), qkv.dim(1), qkv.dim(2));
    let c = c3 / 3;
    if c3 % 3 != 0 || out.shape() != [nw, t, c] {
        return Err(Error::shape(
            OP,
            format!("qkv {:?} and out {:?} disagree", qkv.shape(), out.shape()),
        ));
    }
    if !supported(c, heads) {
        return Err(Error::shape(
            OP,
            format!(
                "{c} channels in {heads} heads: head_dim must be a multiple of 4 <= {MAX_HEAD_DIM}"
            ),
        ));
    }
    check::distinct(OP, ("qkv", qkv), ("out", out))?;
    if nw == 0 || t == 0 {
        return Ok(());
    }
    let nqg = t.div_ceil(QPI);
    let total = nw * heads * nqg;
    check::u32_of(OP, "qkv elements", qkv.numel())?;
    let total32 = check::u32_of(OP, "invocations", total)?;
    let gpu = rec.gpu().clone();
    let params = Params {
        total: total32,
        t: t as u32,
        heads: heads as u32,
        c4: (c / 4) as u32,
        nqg: nqg as u32,
        _pad0: 0,
        scale,
        _pad1: 0,
    };
    let d4 = (c / heads / 4) as f64;
    rec.dispatch(
        &Kernel::new(&SHADER, "window_attention").with(&[("WG", WG as f64), ("D4", d4)]),
        &params,
        &[qkv.binding(&gpu)?, out.binding(&gpu)?],
        grid_1d(ceil_div(total, WG as usize)),
    )
}
