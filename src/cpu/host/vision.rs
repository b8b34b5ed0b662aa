//! Host twins of the vision tower's launchers: convolutions, windows, window attention, layout copies
//! and the projector's position terms.

use crate::cpu;
use crate::cpu::conv::ConvGeom;
use crate::cpu::host::{f32_in, f32_out, weight_in};
use crate::error::{Error, Result};
use crate::gpu::host::{with_host, HostAccess};
use crate::gpu::{DType, Tensor};
use crate::opdef::conv::Conv2dWeight;

/// [`crate::ops::conv::conv2d`] on the host: x (B, H, W, Cin), out (B, Ho, Wo, Cout).
pub fn conv2d(
    x: &Tensor,
    w: Conv2dWeight,
    bias: &Tensor,
    (stride, pad): (usize, usize),
    out: &Tensor,
) -> Result<()> {
    let (wt, (cin, kh, kw)) = match w {
        Conv2dWeight::Checkpoint(t) => (t, (t.dim(1), t.dim(2), t.dim(3))),
        Conv2dWeight::Prepared(t, geom) => (t, geom),
    };
    if wt.numel() != wt.dim(0) * cin * kh * kw {
        return Err(Error::shape(
            "conv2d",
            format!("weight {:?} is not (Cout, {cin}, {kh}, {kw})", wt.shape()),
        ));
    }
    let geom = ConvGeom {
        cin,
        kh,
        kw,
        stride,
        pad,
    };
    let dims = (x.dim(0), x.dim(1), x.dim(2));
    with_host(out, &[x, wt, bias], |o, i| {
        cpu::conv::conv2d(
            f32_in(x, i[0])?,
            dims,
            weight_in(wt, i[1])?,
            f32_in(bias, i[2])?,
            geom,
            f32_out(out, o)?,
        )
        .map(|_| ())
    })
}

/// [`crate::ops::conv::dwconv3x3_residual_taps`] on the host: out = x + dwconv3x3(x) + bias for x
/// (B, H, W, C) and taps (9, C).
pub fn dwconv3x3_residual(x: &Tensor, taps: &Tensor, bias: &Tensor, out: &Tensor) -> Result<()> {
    let dims = (x.dim(0), x.dim(1), x.dim(2), x.dim(3));
    with_host(out, &[x, taps, bias], |o, i| {
        cpu::conv::dwconv3x3_residual(
            f32_in(x, i[0])?,
            dims,
            f32_in(taps, i[1])?,
            f32_in(bias, i[2])?,
            f32_out(out, o)?,
        )
    })
}

/// [`crate::ops::window::window_partition`] on the host.
pub fn window_partition(x: &Tensor, ws: usize, out: &Tensor) -> Result<()> {
    let dims = (x.dim(0), x.dim(1), x.dim(2), x.dim(3));
    with_host(out, &[x], |o, i| {
        cpu::window::window_partition(f32_in(x, i[0])?, dims, ws, f32_out(out, o)?)
    })
}

/// [`crate::ops::window::window_reverse`] on the host.
pub fn window_reverse(x: &Tensor, ws: usize, (h, w): (usize, usize), out: &Tensor) -> Result<()> {
    let dims = (out.dim(0), h, w, out.dim(3));
    with_host(out, &[x], |o, i| {
        cpu::window::window_reverse(f32_in(x, i[0])?, dims, ws, f32_out(out, o)?)
    })
}

/// [`crate::ops::window_attn::window_attention`] on the host: qkv (nW, T, 3C) -> out (nW, T, C).
pub fn window_attention(qkv: &Tensor, heads: usize, scale: f32, out: &Tensor) -> Result<()> {
    let dims = (out.dim(0), out.dim(1), out.dim(2));
    with_host(out, &[qkv], |o, i| {
        cpu::attention::window_attention(f32_in(qkv, i[0])?, dims, heads, scale, f32_out(out, o)?)
    })
}

/// [`crate::ops::layout::permute`] on the host (f32 or u32: both are 32-bit words).
pub fn permute(x: &Tensor, dims: &[usize], out: &Tensor) -> Result<()> {
    let n = x.numel();
    if !matches!(x.dtype(), DType::F32 | DType::U32) {
        return Err(Error::shape("permute", "x must be f32 or u32"));
    }
    with_host(out, &[x], |o, i| {
        cpu::layout::permute(&i[0][..n], x.shape(), dims, &mut o[..n])
    })
}

/// [`crate::ops::layout::split_qkv`] on the host.
pub fn split_qkv(qkv: &Tensor, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<()> {
    let c = q.dim(-1);
    let mut acc = HostAccess::new(&[q, k, v], &[qkv])?;
    let (mut outs, ins) = acc.split()?;
    let [qo, ko, vo] = &mut outs[..] else {
        return Err(Error::shape("split_qkv", "three outputs"));
    };
    cpu::layout::split_qkv(
        f32_in(qkv, ins[0])?,
        c,
        f32_out(q, qo)?,
        f32_out(k, ko)?,
        f32_out(v, vo)?,
    )
}

/// [`crate::ops::pos_embed::pos2d_temporal_add`] on the host.
pub fn pos2d_temporal_add(
    feats: &Tensor,
    [col, row, temporal]: [&Tensor; 3],
    (h, w): (usize, usize),
    out: &Tensor,
) -> Result<()> {
    let c = feats.dim(-1);
    with_host(out, &[feats, col, row, temporal], |o, i| {
        let o = f32_out(out, o)?;
        o.copy_from_slice(f32_in(feats, i[0])?);
        cpu::elementwise::pos2d_temporal_add(
            o,
            (h, w, c),
            f32_in(col, i[1])?,
            f32_in(row, i[2])?,
            f32_in(temporal, i[3])?,
        )
    })
}
