//! Scaled dot-product attention on the CPU, as [`crate::ops::attention`] and
//! [`crate::ops::window_attn`] define it: per head, out = softmax(q k^T + mask) v with q scaled (in f32)
//! before the product, heads interleaved in columns (head h owns columns h*D .. h*D + D), K/V shared by
//! every batch row when Bk = 1. Key j is visible to query row i iff j < kv_len and, when causal,
//! j <= q_offset + i; invisible keys contribute exactly 0 and a row that sees none outputs zeros. K and V
//! are f32 or IEEE half ([`KvRef`]: the decoder's caches and cross K/V when the weights are not fp32),
//! widened to f32 exactly; the arithmetic is f32 (two-pass softmax per row).
//!
//! Work: per (batch row, block of query rows), every head: the head's visible keys are gathered once
//! into K^T (D, L) and V (L, D), scores are computed 4 query rows x 8 keys at a time with D in
//! registers, then the probabilities weight V's rows.

use half::f16;

use crate::cpu::{check_len, par, softmax::softmax_row};
use crate::error::{Error, Result};

/// K or V rows: f32 or halves.
#[derive(Clone, Copy, Debug)]
pub enum KvRef<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

impl KvRef<'_> {
    fn len(&self) -> usize {
        match self {
            KvRef::F32(s) => s.len(),
            KvRef::F16(s) => s.len(),
        }
    }

    #[inline]
    fn get(&self, i: usize) -> f32 {
        match self {
            KvRef::F32(s) => s[i],
            KvRef::F16(s) => s[i].to_f32(),
        }
    }
}

/// A KV cache (B, L, D) being written: f32 or halves.
#[derive(Debug)]
pub enum KvMut<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
}

/// Options of one attention call (the CPU twin of [`crate::ops::attention::AttnOpts`]).
#[derive(Clone, Copy, Debug)]
pub struct AttnOpts<'a> {
    pub heads: usize,
    /// Multiplies q before q k^T (usually head_dim^-0.5).
    pub scale: f32,
    pub causal: bool,
    /// Valid key rows (KV-cache fill); `None` = all Tk.
    pub kv_len: Option<usize>,
    /// Absolute position of query row 0 (causal rule).
    pub q_offset: usize,
    /// Additive mask (Tq, Tk), shared by every batch row and head.
    pub mask: Option<&'a [f32]>,
}

impl Default for AttnOpts<'_> {
    fn default() -> Self {
        AttnOpts {
            heads: 1,
            scale: 1.0,
            causal: false,
            kv_len: None,
            q_offset: 0,
            mask: None,
        }
    }
}

/// Where one operand's rows are: row r of batch row b at `(b * rows + r) * stride + off`.
#[derive(Clone, Copy)]
struct Src<T> {
    data: T,
    stride: usize,
    off: usize,
}

/// The shape of one call: B batch rows of Tq queries, Bk (B or 1) batch rows of Tk keys, C = H*D.
#[derive(Clone, Copy)]
struct Dims {
    b: usize,
    bk: usize,
    tq: usize,
    tk: usize,
    c: usize,
}

/// out (B, Tq, C) = attention of q (B, Tq, C) over k, v (Bk, Tk, C) with Bk = B or 1, C = heads * D.
pub fn attention(
    q: &[f32],
    k: KvRef,
    v: KvRef,
    (b, tq, tk, c): (usize, usize, usize, usize),
    opts: &AttnOpts,
    out: &mut [f32],
) -> Result<()> {
    const OP: &str = "cpu attention";
    check_len(OP, "q", q, b * tq * c)?;
    check_len(OP, "out", out, b * tq * c)?;
    let bk = if tk * c > 0 && k.len() == tk * c && b != 1 {
        1
    } else {
        b
    };
    if k.len() != bk * tk * c || v.len() != k.len() {
        return Err(Error::shape(
            OP,
            format!(
                "k, v of {} / {} values are not ({b} or 1, {tk}, {c})",
                k.len(),
                v.len()
            ),
        ));
    }
    if let Some(m) = opts.mask {
        check_len(OP, "mask", m, tq * tk)?;
    }
    let dims = Dims { b, bk, tq, tk, c };
    let src = |data| Src {
        data,
        stride: c,
        off: 0,
    };
    run(q, src(k), src(v), dims, opts, out, c)
}

/// DaViT window attention: out (nW, T, C) from qkv (nW, T, 3C) (columns q | k | v, heads interleaved
/// in each), no mask, `scale` = head_dim^-0.5.
pub fn window_attention(
    qkv: &[f32],
    (nw, t, c): (usize, usize, usize),
    heads: usize,
    scale: f32,
    out: &mut [f32],
) -> Result<()> {
    const OP: &str = "cpu window_attention";
    check_len(OP, "qkv", qkv, nw * t * 3 * c)?;
    check_len(OP, "out", out, nw * t * c)?;
    let opts = AttnOpts {
        heads,
        scale,
        ..AttnOpts::default()
    };
    let dims = Dims {
        b: nw,
        bk: nw,
        tq: t,
        tk: t,
        c,
    };
    let at = |off| Src {
        data: KvRef::F32(qkv),
        stride: 3 * c,
        off,
    };
    run(qkv, at(c), at(2 * c), dims, &opts, out, 3 * c)
}

/// Check the heads and split the work: batch rows in parallel, and query blocks in parallel inside a
/// batch row when there are few batch rows.
fn run(
    q: &[f32],
    k: Src<KvRef>,
    v: Src<KvRef>,
    d: Dims,
    opts: &AttnOpts,
    out: &mut [f32],
    q_stride: usize,
) -> Result<()> {
    if opts.heads == 0 || !d.c.is_multiple_of(opts.heads) {
        return Err(Error::shape(
            "cpu attention",
            format!("{} columns are not {} heads", d.c, opts.heads),
        ));
    }
    if d.b * d.tq * d.c == 0 {
        return Ok(());
    }
    let qs = Src {
        data: q,
        stride: q_stride,
        off: 0,
    };
    let qchunk = if d.b >= 2 * par::threads() {
        d.tq
    } else {
        par::task_len(d.tq, 8)
    };
    par::chunks_mut(out, d.tq * d.c, |bi, ob| {
        par::chunks_mut(ob, qchunk * d.c, |qi, oc| {
            for h in 0..opts.heads {
                block(qs, k, v, d, opts, (bi, qi * qchunk, h), oc);
            }
        });
    });
    Ok(())
}

/// One head of query rows i0 .. i0 + out.len() / C of batch row `bi`, into out (rows, C).
fn block(
    q: Src<&[f32]>,
    k: Src<KvRef>,
    v: Src<KvRef>,
    d: Dims,
    opts: &AttnOpts,
    (bi, i0, h): (usize, usize, usize),
    out: &mut [f32],
) {
    let hd = d.c / opts.heads;
    let rows = out.len() / d.c;
    let kv_len = opts.kv_len.unwrap_or(d.tk).min(d.tk);
    let vis_end = |i: usize| {
        if opts.causal {
            kv_len.min(opts.q_offset + i + 1)
        } else {
            kv_len
        }
    };
    let l = vis_end(i0 + rows - 1); // keys any row of the block sees
    let kb = if d.bk == 1 { 0 } else { bi };
    let (kt, vv) = gather(k, v, (kb * d.tk, l), (h * hd, hd));
    let mut s = vec![0f32; 4 * l.max(1)];
    let mut o = vec![0f32; 4 * hd];
    for r0 in (0..rows).step_by(4) {
        let qb = 4.min(rows - r0);
        let qr: Vec<Vec<f32>> = (0..qb)
            .map(|r| {
                let base = (bi * d.tq + i0 + r0 + r) * q.stride + q.off + h * hd;
                q.data[base..base + hd]
                    .iter()
                    .map(|&x| x * opts.scale)
                    .collect()
            })
            .collect();
        scores(&qr, &kt, l, &mut s);
        o.fill(0.0);
        for r in 0..qb {
            let i = i0 + r0 + r;
            let n = vis_end(i);
            let sr = &mut s[r * l..r * l + n];
            if let Some(m) = opts.mask {
                sr.iter_mut()
                    .zip(&m[i * d.tk..i * d.tk + n])
                    .for_each(|(x, &mv)| *x += mv);
            }
            if n == 0 {
                continue; // no visible key: zeros
            }
            softmax_row(sr);
            let orow = &mut o[r * hd..(r + 1) * hd];
            for (j, &p) in sr.iter().enumerate() {
                let vr = &vv[j * hd..(j + 1) * hd];
                orow.iter_mut().zip(vr).for_each(|(a, &x)| *a += p * x);
            }
        }
        for r in 0..qb {
            let dst = &mut out[(r0 + r) * d.c + h * hd..][..hd];
            dst.copy_from_slice(&o[r * hd..(r + 1) * hd]);
        }
    }
}

/// K^T (D, L) and V (L, D) of one head: key rows `row0 .. row0 + L` (absolute rows of the sources),
/// columns `col .. col + D`, widened to f32.
fn gather(
    k: Src<KvRef>,
    v: Src<KvRef>,
    (row0, l): (usize, usize),
    (col, hd): (usize, usize),
) -> (Vec<f32>, Vec<f32>) {
    let mut kt = vec![0f32; hd * l];
    let mut vv = vec![0f32; l * hd];
    for j in 0..l {
        let kb = (row0 + j) * k.stride + k.off + col;
        let vb = (row0 + j) * v.stride + v.off + col;
        for e in 0..hd {
            kt[e * l + j] = k.data.get(kb + e);
            vv[j * hd + e] = v.data.get(vb + e);
        }
    }
    (kt, vv)
}

/// s[r, j] = q[r] . K^T[:, j] for the block's rows (<= 4) and the L keys: 8 keys x every row per step,
/// the D-long sums in registers.
fn scores(q: &[Vec<f32>], kt: &[f32], l: usize, s: &mut [f32]) {
    let hd = q.first().map_or(0, Vec::len);
    let body = l / 8 * 8;
    for j0 in (0..body).step_by(8) {
        let mut acc = [[0f32; 8]; 4];
        for e in 0..hd {
            let kv = &kt[e * l + j0..e * l + j0 + 8];
            for (r, qr) in q.iter().enumerate() {
                let qv = qr[e];
                for x in 0..8 {
                    acc[r][x] += qv * kv[x];
                }
            }
        }
        for (r, a) in acc.iter().enumerate().take(q.len()) {
            s[r * l + j0..r * l + j0 + 8].copy_from_slice(a);
        }
    }
    for j in body..l {
        for (r, qr) in q.iter().enumerate() {
            s[r * l + j] = (0..hd).map(|e| qr[e] * kt[e * l + j]).sum();
        }
    }
}

/// cache[r, pos, :] = rows[r, :] for a cache (B, L, D) and rows (B, D) (halves rounded to nearest
/// even; the GPU's `pack2x16float` may take either neighbour). A `pos` past L writes nothing.
pub fn kv_write(
    mut cache: KvMut,
    (b, l, d): (usize, usize, usize),
    pos: usize,
    rows: &[f32],
) -> Result<()> {
    const OP: &str = "cpu kv_write";
    check_len(OP, "rows", rows, b * d)?;
    let len = match &cache {
        KvMut::F32(c) => c.len(),
        KvMut::F16(c) => c.len(),
    };
    if len != b * l * d {
        return Err(Error::shape(
            OP,
            format!("cache of {len} values is not ({b}, {l}, {d})"),
        ));
    }
    if pos >= l || d == 0 {
        return Ok(());
    }
    for (r, src) in rows.chunks_exact(d).enumerate() {
        let at = (r * l + pos) * d;
        match &mut cache {
            KvMut::F32(c) => c[at..at + d].copy_from_slice(src),
            KvMut::F16(c) => f32_to_f16(src, &mut c[at..at + d])?,
        }
    }
    Ok(())
}

/// out = x rounded to IEEE half (nearest even), same lengths.
pub fn f32_to_f16(x: &[f32], out: &mut [f16]) -> Result<()> {
    use half::slice::HalfFloatSliceExt;
    check_len("cpu f32_to_f16", "out", out, x.len())?;
    out.convert_from_f32_slice(x);
    Ok(())
}
