//! Convolutions over channels-last images ([`crate::ops::conv`]): the dense `conv2d` (DaViT's patch
//! embeddings: k7 s4 p3 stem, k3 s2 p1) as im2col row chunks + the CPU linear, and the depthwise 3x3
//! positional conv with its bias and residual fused.

use crate::cpu::activation::Act;
use crate::cpu::linear::{linear, LinearRef};
use crate::cpu::{check_len, par, Weight};
use crate::error::{Error, Result};

/// im2col rows per chunk: the scratch stays at most this many bytes.
const IM2COL_BYTES: usize = 8 << 20;

/// Output size of a convolution along one axis: floor((n + 2 pad - k) / stride) + 1, or `None` when
/// the padded input is smaller than the kernel.
pub fn conv_out_len(n: usize, k: usize, stride: usize, pad: usize) -> Option<usize> {
    if stride == 0 || n == 0 {
        return None;
    }
    (n + 2 * pad).checked_sub(k).map(|r| r / stride + 1)
}

/// A dense convolution's geometry: kernel (Cin, kh, kw), stride, padding.
#[derive(Clone, Copy, Debug)]
pub struct ConvGeom {
    pub cin: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: usize,
    pub pad: usize,
}

/// out (B, Ho, Wo, Cout) = conv(x (B, H, W, Cin), w (Cout, Cin*kh*kw), zero padding) + bias (Cout):
/// PyTorch `nn.Conv2d` with its weight (Cout, Cin, kh, kw) viewed as a Linear weight (f32 or f16).
/// Returns (Ho, Wo).
pub fn conv2d(
    x: &[f32],
    (b, h, w): (usize, usize, usize),
    weight: Weight,
    bias: &[f32],
    g: ConvGeom,
    out: &mut [f32],
) -> Result<(usize, usize)> {
    const OP: &str = "cpu conv2d";
    let (ho, wo) = match (
        conv_out_len(h, g.kh, g.stride, g.pad),
        conv_out_len(w, g.kw, g.stride, g.pad),
    ) {
        (Some(a), Some(b)) => (a, b),
        _ => return Err(Error::shape(OP, format!("{h}x{w} input for {g:?}"))),
    };
    check_len(OP, "x", x, b * h * w * g.cin)?;
    let cout = bias.len();
    let k = g.cin * g.kh * g.kw;
    check_len(OP, "out", out, b * ho * wo * cout)?;
    let lin = LinearRef {
        w: weight,
        n: cout,
        k,
        bias: Some(bias),
    };
    let rows = b * ho * wo;
    let chunk = (IM2COL_BYTES / (4 * k.max(1))).clamp(1, rows.max(1));
    let mut cols = vec![0f32; chunk * k];
    for r0 in (0..rows).step_by(chunk) {
        let n = chunk.min(rows - r0);
        let cc = &mut cols[..n * k]; // (n, K)
        par::chunks_mut(cc, 64 * k, |t, part| {
            for (i, dst) in part.chunks_exact_mut(k).enumerate() {
                im2col_row(x, (h, w, ho, wo), g, r0 + t * 64 + i, dst);
            }
        });
        linear(&lin, cc, Act::None, &mut out[r0 * cout..(r0 + n) * cout])?;
    }
    Ok((ho, wo))
}

/// The K = Cin*kh*kw inputs output pixel `row` (b*Ho*Wo + oy*Wo + ox) sees, in the weight's (ci, ky, kx)
/// order, zeros outside the image.
fn im2col_row(
    x: &[f32],
    (h, w, ho, wo): (usize, usize, usize, usize),
    g: ConvGeom,
    row: usize,
    dst: &mut [f32],
) {
    let (bi, oy, ox) = (row / (ho * wo), row / wo % ho, row % wo);
    for ky in 0..g.kh {
        let iy = (oy * g.stride + ky) as isize - g.pad as isize;
        for kx in 0..g.kw {
            let ix = (ox * g.stride + kx) as isize - g.pad as isize;
            let inside = iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < w;
            let src = ((bi * h + iy.max(0) as usize) * w + ix.max(0) as usize) * g.cin;
            for ci in 0..g.cin {
                dst[(ci * g.kh + ky) * g.kw + kx] = if inside { x[src + ci] } else { 0.0 };
            }
        }
    }
}

/// The depthwise 3x3 weight (C, 1, 3, 3) as (9, C) taps (tap ky*3 + kx), the layout
/// [`dwconv3x3_residual`] reads.
pub fn dwconv3x3_taps(w: &[f32], c: usize) -> Result<Vec<f32>> {
    check_len("cpu dwconv3x3", "weight", w, 9 * c)?;
    let mut t = vec![0f32; 9 * c];
    for ch in 0..c {
        for tap in 0..9 {
            t[tap * c + ch] = w[ch * 9 + tap];
        }
    }
    Ok(t)
}

/// out = x + depthwise_conv3x3(x, pad 1) + bias for x, out (B, H, W, C), taps (9, C), bias (C): the
/// accumulator starts at the bias and adds the in-image taps in (ky, kx) order, then x is added (the
/// GPU kernel's order).
pub fn dwconv3x3_residual(
    x: &[f32],
    (b, h, w, c): (usize, usize, usize, usize),
    taps: &[f32],
    bias: &[f32],
    out: &mut [f32],
) -> Result<()> {
    const OP: &str = "cpu dwconv3x3";
    check_len(OP, "x", x, b * h * w * c)?;
    check_len(OP, "out", out, x.len())?;
    check_len(OP, "taps", taps, 9 * c)?;
    check_len(OP, "bias", bias, c)?;
    if x.is_empty() {
        return Ok(());
    }
    // One task per image row (W*C outputs).
    par::chunks_mut(out, w * c, |r, orow| {
        let (bi, y) = (r / h, r % h);
        let mut acc = vec![0f32; c];
        for (xx, o) in orow.chunks_exact_mut(c).enumerate() {
            acc.copy_from_slice(bias);
            for ky in 0..3 {
                let iy = y as isize + ky as isize - 1;
                if iy < 0 || iy >= h as isize {
                    continue;
                }
                for kx in 0..3 {
                    let ix = xx as isize + kx as isize - 1;
                    if ix < 0 || ix >= w as isize {
                        continue;
                    }
                    let src = &x[((bi * h + iy as usize) * w + ix as usize) * c..][..c];
                    let tw = &taps[(ky * 3 + kx) * c..][..c];
                    for ((a, &t), &v) in acc.iter_mut().zip(tw).zip(src) {
                        *a += t * v;
                    }
                }
            }
            let xs = &x[((bi * h + y) * w + xx) * c..][..c];
            for ((o, &xv), &a) in o.iter_mut().zip(xs).zip(&acc) {
                *o = xv + a;
            }
        }
    });
    Ok(())
}
