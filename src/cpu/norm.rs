//! LayerNorm over the last dimension, as `torch.nn.LayerNorm` and [`crate::ops::norm::layer_norm`]:
//! out = (x - mean) / sqrt(var + eps) * gamma + beta with the biased variance. As the GPU's row-wise
//! kernel: sums in interleaved f32 partials (8 here), a first-pass mean m1, then d = x - m1 and d^2
//! summed, mean = m1 + sum(d) / C and var = sum(d^2) / C - (sum(d) / C)^2 (sum(d) / C is only m1's
//! rounding error, so nothing cancels: no E[x^2] - E[x]^2).

use crate::cpu::{check_len, par};
use crate::error::{Error, Result};

/// out (R, C) = LayerNorm(x (R, C)) with gamma, beta (C).
pub fn layer_norm(x: &[f32], gamma: &[f32], beta: &[f32], eps: f32, out: &mut [f32]) -> Result<()> {
    check(x.len(), gamma, beta)?;
    check_len("cpu layer_norm", "out", out, x.len())?;
    let c = gamma.len();
    let rows = par::task_len(x.len() / c.max(1), 16);
    par::chunks_mut(out, rows * c, |t, oc| {
        let xs = &x[t * rows * c..][..oc.len()];
        for (xr, or) in xs.chunks_exact(c).zip(oc.chunks_exact_mut(c)) {
            normalize(xr, gamma, beta, eps, or);
        }
    });
    Ok(())
}

/// x (R, C) = LayerNorm(x) in place.
pub fn layer_norm_inplace(x: &mut [f32], gamma: &[f32], beta: &[f32], eps: f32) -> Result<()> {
    check(x.len(), gamma, beta)?;
    let c = gamma.len();
    let rows = par::task_len(x.len() / c.max(1), 16);
    par::chunks_mut(x, rows * c, |_, xc| {
        let mut tmp = vec![0f32; c];
        for xr in xc.chunks_exact_mut(c) {
            normalize(xr, gamma, beta, eps, &mut tmp);
            xr.copy_from_slice(&tmp);
        }
    });
    Ok(())
}

fn check(len: usize, gamma: &[f32], beta: &[f32]) -> Result<()> {
    let c = gamma.len();
    if c == 0 || beta.len() != c || !len.is_multiple_of(c) {
        return Err(Error::shape(
            "cpu layer_norm",
            format!(
                "x of {len} values, gamma ({c}), beta ({}): not rows of C",
                beta.len()
            ),
        ));
    }
    Ok(())
}

/// The two sums of `f(v)` over `x` in 8 interleaved partials.
#[inline]
fn sum8(x: &[f32], f: impl Fn(f32) -> [f32; 2]) -> [f32; 2] {
    let mut acc = [[0f32; 8]; 2];
    let mut it = x.chunks_exact(8);
    for ch in &mut it {
        for l in 0..8 {
            let v = f(ch[l]);
            acc[0][l] += v[0];
            acc[1][l] += v[1];
        }
    }
    let mut s = acc.map(|a| ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])));
    for &v in it.remainder() {
        let v = f(v);
        s[0] += v[0];
        s[1] += v[1];
    }
    s
}

fn normalize(x: &[f32], gamma: &[f32], beta: &[f32], eps: f32, out: &mut [f32]) {
    let c = x.len() as f32;
    let m1 = sum8(x, |v| [v, 0.0])[0] / c;
    let [sd, sd2] = sum8(x, |v| [v - m1, (v - m1) * (v - m1)]);
    let corr = sd / c;
    let mean = m1 + corr;
    let var = sd2 / c - corr * corr;
    let inv = 1.0 / (var + eps).sqrt();
    for (((o, &v), &g), &b) in out.iter_mut().zip(x).zip(gamma).zip(beta) {
        *o = (v - mean) * inv * g + b;
    }
}
