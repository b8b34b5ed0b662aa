//! DaViT channel attention on the CPU, as [`crate::ops::channel_attn`] defines it: per batch row and
//! channel group (d = C / groups channels; q, k, v at columns g*d.., C + g*d.., 2C + g*d.. of qkv),
//! attn = softmax_j(sum_n q[n, i] k[n, j] * scale) with scale = N^-0.5 (N the TOKEN count, applied
//! after the sum), out[n, g*d + i] = sum_j attn[i, j] v[n, j].
//!
//! The logits are a Gram matrix over the long token axis: one task per (batch row, group), 4 tokens per
//! pass over the (d, d) accumulator (in L1); the output is a (d x d) map per token, tokens split over
//! threads.

use crate::cpu::{check_len, par, softmax::softmax_row};
use crate::error::{Error, Result};

/// The attention matrices, transposed: (B, groups, d (j), d (i)).
#[derive(Clone, Debug)]
pub struct ChannelLogits {
    pub attn_t: Vec<f32>,
    pub b: usize,
    pub groups: usize,
    pub d: usize,
}

/// out (B, N, C) = channel attention of qkv (B, N, 3C).
pub fn channel_attention(
    qkv: &[f32],
    (b, n, c): (usize, usize, usize),
    groups: usize,
    out: &mut [f32],
) -> Result<()> {
    check_len("cpu channel_attention", "qkv", qkv, b * n * 3 * c)?;
    let l = channel_logits(qkv, 3 * c, (b, n, c), groups)?;
    l.apply(qkv, (3 * c, 2 * c), n, out)
}

/// The attention matrices from q | k in the first 2C columns of rows of `stride` floats, (B, N, stride).
pub fn channel_logits(
    qk: &[f32],
    stride: usize,
    (b, n, c): (usize, usize, usize),
    groups: usize,
) -> Result<ChannelLogits> {
    const OP: &str = "cpu channel_attention";
    if groups == 0 || !c.is_multiple_of(groups) || stride < 2 * c || n == 0 {
        return Err(Error::shape(
            OP,
            format!("C = {c} in {groups} groups, rows of {stride}, N = {n}"),
        ));
    }
    check_len(OP, "q|k", qk, b * n * stride)?;
    let d = c / groups;
    let scale = (n as f64).powf(-0.5) as f32;
    let mats = par::map(b * groups, |bg| {
        let (bi, g) = (bg / groups, bg % groups);
        let rows = &qk[bi * n * stride..(bi + 1) * n * stride];
        let mut gram = gram(rows, stride, (g * d, c + g * d), d);
        let mut t = vec![0f32; d * d];
        for (i, row) in gram.chunks_exact_mut(d).enumerate() {
            row.iter_mut().for_each(|v| *v *= scale);
            softmax_row(row);
            for (j, &p) in row.iter().enumerate() {
                t[j * d + i] = p;
            }
        }
        t
    });
    Ok(ChannelLogits {
        attn_t: mats.concat(),
        b,
        groups,
        d,
    })
}

/// G (d, d) = sum_n q[n, i] k[n, j] over the token rows of `rows` (stride `stride`), q at column `qo`,
/// k at `ko`; 4 tokens per pass over G.
fn gram(rows: &[f32], stride: usize, (qo, ko): (usize, usize), d: usize) -> Vec<f32> {
    let mut g = vec![0f32; d * d];
    let n = rows.len() / stride;
    let body = n / 4 * 4;
    for t0 in (0..body).step_by(4) {
        let r: [&[f32]; 4] =
            std::array::from_fn(|u| &rows[(t0 + u) * stride..(t0 + u + 1) * stride]);
        for (i, gr) in g.chunks_exact_mut(d).enumerate() {
            let qv: [f32; 4] = std::array::from_fn(|u| r[u][qo + i]);
            let ks: [&[f32]; 4] = std::array::from_fn(|u| &r[u][ko..ko + d]);
            for (j, gv) in gr.iter_mut().enumerate() {
                *gv +=
                    (qv[0] * ks[0][j] + qv[1] * ks[1][j]) + (qv[2] * ks[2][j] + qv[3] * ks[3][j]);
            }
        }
    }
    for t in body..n {
        let r = &rows[t * stride..(t + 1) * stride];
        for (i, gr) in g.chunks_exact_mut(d).enumerate() {
            let qv = r[qo + i];
            gr.iter_mut()
                .zip(&r[ko..ko + d])
                .for_each(|(gv, &kv)| *gv += qv * kv);
        }
    }
    g
}

impl ChannelLogits {
    /// out (B, N, C) = the attention applied to v, at column `v_off` of rows of `v_stride` floats
    /// (B, N, v_stride).
    pub fn apply(
        &self,
        v: &[f32],
        (v_stride, v_off): (usize, usize),
        n: usize,
        out: &mut [f32],
    ) -> Result<()> {
        const OP: &str = "cpu channel_attention";
        let (d, groups) = (self.d, self.groups);
        let c = d * groups;
        check_len(OP, "v", v, self.b * n * v_stride)?;
        check_len(OP, "out", out, self.b * n * c)?;
        if v_off + c > v_stride {
            return Err(Error::shape(
                OP,
                format!("v at column {v_off} of {v_stride}"),
            ));
        }
        let task = par::task_len(self.b * n, 64);
        par::chunks_mut(out, task * c, |t, oc| {
            for (r, orow) in oc.chunks_exact_mut(c).enumerate() {
                let row = t * task + r;
                let vr = &v[row * v_stride + v_off..][..c];
                orow.fill(0.0);
                for g in 0..groups {
                    let at = &self.attn_t[((row / n) * groups + g) * d * d..][..d * d];
                    let o = &mut orow[g * d..(g + 1) * d];
                    for (j, &vj) in vr[g * d..(g + 1) * d].iter().enumerate() {
                        o.iter_mut()
                            .zip(&at[j * d..(j + 1) * d])
                            .for_each(|(a, &p)| *a += vj * p);
                    }
                }
            }
        });
        Ok(())
    }
}
