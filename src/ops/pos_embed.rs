//! Florence-2 projector position terms (`shaders/pos_embed.wgsl`): the learned 2-D position embedding
//! (column half first) plus the cosine temporal row 0, added to the image tokens in one pass.

use crate::cpu::host;
use crate::error::{Error, Result};
use crate::gpu::Backend;
use crate::gpu::{ceil_div, grid_1d, shader, uniform, DType, Kernel, Recorder, Tensor};

shader!(pub static SHADER = "pos_embed", [("WG", WG)]);

const WG: u32 = 256;

uniform! {
    struct Params: PARAMS_LAYOUT = "pos_embed" / Params {
        n: u32, h: u32, w: u32, c: u32, ccol: u32, _pad0: u32, _pad1: u32, _pad2: u32
    }
}

const OP: &str = "pos2d_temporal_add";

/// out[b, y*w + x] = (feats[b, y*w + x] + concat(col[x], row[y])) + temporal[0] for feats, out
/// (B, h*w, C), col (P, C - C/2), row (P, C/2) with h, w <= P, temporal (T, C) with T >= 1.
pub fn pos2d_temporal_add(
    rec: &mut Recorder,
    feats: &Tensor,
    col: &Tensor,
    row: &Tensor,
    temporal: &Tensor,
    grid: (usize, usize),
    out: &Tensor,
) -> Result<()> {
    check_operands(feats, [col, row, temporal], grid, out)?;
    let (h, w) = grid;
    let c = feats.dim(2);
    let ccol = c - c / 2;
    let n = feats.numel();
    if n == 0 {
        return Ok(());
    }
    match rec.backend()? {
        Backend::Host => rec.host_op("pos2d_temporal_add", &[feats], || {
            host::vision::pos2d_temporal_add(feats, [col, row, temporal], grid, out)
        }),
        Backend::Wgpu(_) => {
            let n32 = u32::try_from(n).map_err(|_| Error::shape(OP, "too many elements"))?;
            let params = Params {
                n: n32,
                h: h as u32,
                w: w as u32,
                c: c as u32,
                ccol: ccol as u32,
                _pad0: 0,
                _pad1: 0,
                _pad2: 0,
            };
            rec.launch(
                &Kernel::new(&SHADER, "pos2d_temporal_add"),
                &params,
                &[feats, col, row, temporal, out],
                grid_1d(ceil_div(n, WG as usize)),
            )
        }
    }
}

/// F32 operands of matching shapes (see [`pos2d_temporal_add`]), `out` apart from `feats`.
fn check_operands(
    feats: &Tensor,
    [col, row, temporal]: [&Tensor; 3],
    grid: (usize, usize),
    out: &Tensor,
) -> Result<()> {
    for (n, t) in [
        ("feats", feats),
        ("col", col),
        ("row", row),
        ("temporal", temporal),
        ("out", out),
    ] {
        if t.dtype() != DType::F32 {
            return Err(Error::shape(
                OP,
                format!("{n}: expected F32, got {:?}", t.dtype()),
            ));
        }
    }
    let (h, w) = grid;
    if feats.rank() != 3 || out.shape() != feats.shape() || feats.dim(1) != h * w {
        return Err(Error::shape(
            OP,
            format!(
                "feats {:?} / out {:?} must be (B, {h}*{w}, C)",
                feats.shape(),
                out.shape()
            ),
        ));
    }
    let c = feats.dim(2);
    let ccol = c - c / 2;
    if col.rank() != 2 || row.rank() != 2 || col.dim(1) != ccol || row.dim(1) != c / 2 {
        return Err(Error::shape(
            OP,
            format!(
                "col {:?} / row {:?} must be (P, {ccol}) / (P, {})",
                col.shape(),
                row.shape(),
                c / 2
            ),
        ));
    }
    if w > col.dim(0) || h > row.dim(0) {
        return Err(Error::shape(
            OP,
            format!(
                "a {h}x{w} token grid exceeds the {}-row position tables",
                col.dim(0).min(row.dim(0))
            ),
        ));
    }
    if temporal.rank() != 2 || temporal.dim(0) == 0 || temporal.dim(1) != c {
        return Err(Error::shape(
            OP,
            format!("temporal {:?} must be (T >= 1, {c})", temporal.shape()),
        ));
    }
    if feats.same_buffer(out) {
        return Err(Error::shape(OP, "out must not share feats' buffer"));
    }
    Ok(())
}
