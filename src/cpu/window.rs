//! DaViT window partition / reverse ([`crate::ops::window`]): zero-pad H, W up to multiples of the
//! window (bottom/right), cut into ws x ws windows (batch, window row, window column; tokens row-major
//! inside), and the inverse with the padding cropped. Pure copies.

use crate::cpu::check_len;
use crate::error::{Error, Result};

fn check(op: &'static str, ws: usize, dims: (usize, usize, usize, usize)) -> Result<()> {
    if ws == 0 || dims.3 == 0 {
        return Err(Error::shape(op, format!("window {ws}, dims {dims:?}")));
    }
    Ok(())
}

/// Number of windows along each axis for an h x w image: (ceil(h / ws), ceil(w / ws)).
pub fn window_grid(h: usize, w: usize, ws: usize) -> (usize, usize) {
    if ws == 0 {
        return (0, 0);
    }
    (h.div_ceil(ws), w.div_ceil(ws))
}

/// x (B, H, W, C) -> out (B*nWh*nWw, ws*ws, C).
pub fn window_partition(
    x: &[f32],
    (b, h, w, c): (usize, usize, usize, usize),
    ws: usize,
    out: &mut [f32],
) -> Result<()> {
    const OP: &str = "cpu window_partition";
    check(OP, ws, (b, h, w, c))?;
    let (nh, nw) = window_grid(h, w, ws);
    check_len(OP, "x", x, b * h * w * c)?;
    check_len(OP, "out", out, b * nh * nw * ws * ws * c)?;
    for (widx, win) in out.chunks_exact_mut(ws * ws * c).enumerate() {
        let (bi, wy, wx) = (widx / (nh * nw), widx / nw % nh, widx % nw);
        for (t, tok) in win.chunks_exact_mut(c).enumerate() {
            let (y, xx) = (wy * ws + t / ws, wx * ws + t % ws);
            if y < h && xx < w {
                tok.copy_from_slice(&x[((bi * h + y) * w + xx) * c..][..c]);
            } else {
                tok.fill(0.0);
            }
        }
    }
    Ok(())
}

/// x (B*nWh*nWw, ws*ws, C) -> out (B, H, W, C), the padding dropped.
pub fn window_reverse(
    x: &[f32],
    (b, h, w, c): (usize, usize, usize, usize),
    ws: usize,
    out: &mut [f32],
) -> Result<()> {
    const OP: &str = "cpu window_reverse";
    check(OP, ws, (b, h, w, c))?;
    let (nh, nw) = window_grid(h, w, ws);
    check_len(OP, "x", x, b * nh * nw * ws * ws * c)?;
    check_len(OP, "out", out, b * h * w * c)?;
    for (p, tok) in out.chunks_exact_mut(c).enumerate() {
        let (bi, y, xx) = (p / (h * w), p / w % h, p % w);
        let widx = (bi * nh + y / ws) * nw + xx / ws;
        let t = (y % ws) * ws + xx % ws;
        tok.copy_from_slice(&x[(widx * ws * ws + t) * c..][..c]);
    }
    Ok(())
}
