//! Row softmax and log-softmax over the last dimension, max-subtracted, as
//! [`crate::ops::softmax`]: softmax = exp(x - m) / sum, log_softmax = (x - m) - ln(sum). In place (the
//! GPU's `out = x` case; copy first for another output). The sum of the exponentials accumulates in
//! f64 (four interleaved partial sums, added in a fixed order): a sequential f32 sum over the
//! 51328-token vocabulary would lose ~1e-4 relative (the GPU's tree reduction loses ~log2(C) roundings).
//!
//! The exponential is [`exp`], branch-free f32 arithmetic that the compiler turns into SIMD (SSE/AVX2
//! natively, SIMD128 in wasm), a few ulp from the correctly rounded value. The scalar library `expf` it
//! replaces made the softmax most of the DaViT window attention's time (144-key rows, 16 heads).

use crate::cpu::par;
use crate::error::{Error, Result};

/// x (R, C) = softmax(x) row by row.
pub fn softmax_rows(x: &mut [f32], c: usize) -> Result<()> {
    rows(x, c, false)
}

/// x (R, C) = log_softmax(x) row by row.
pub fn log_softmax_rows(x: &mut [f32], c: usize) -> Result<()> {
    rows(x, c, true)
}

fn rows(x: &mut [f32], c: usize, log: bool) -> Result<()> {
    if c == 0 || !x.len().is_multiple_of(c) {
        return Err(Error::shape(
            "cpu softmax",
            format!("{} values are not rows of {c}", x.len()),
        ));
    }
    let task = par::task_len(x.len() / c, 1);
    par::chunks_mut(x, task * c, |_, xc| {
        for row in xc.chunks_exact_mut(c) {
            if log {
                log_softmax_row(row);
            } else {
                softmax_row(row);
            }
        }
    });
    Ok(())
}

/// softmax of one row in place.
#[inline]
pub fn softmax_row(row: &mut [f32]) {
    let m = row_max(row);
    row.iter_mut().for_each(|v| *v = exp(*v - m));
    let inv = (1.0 / sum_f64(row, |v| v)) as f32;
    row.iter_mut().for_each(|v| *v *= inv);
}

fn log_softmax_row(row: &mut [f32]) {
    let m = row_max(row);
    let ls = sum_f64(row, |v| exp(v - m)).ln() as f32;
    row.iter_mut().for_each(|v| *v = (*v - m) - ls);
}

/// The row's largest value (-f32::MAX for an empty row), in 8 lanes.
#[inline(always)]
fn row_max(row: &[f32]) -> f32 {
    let mut lanes = [-f32::MAX; 8];
    let body = row.len() / 8 * 8;
    for c in row[..body].chunks_exact(8) {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = l.max(v);
        }
    }
    let tail = row[body..].iter().fold(-f32::MAX, |a, &v| a.max(v));
    lanes.iter().fold(tail, |a, &v| a.max(v))
}

/// Σ f(v) over the row in f64: four interleaved partial sums, then ((s0 + s1) + (s2 + s3)) + the
/// tail. `f` maps each value as it is read (log-softmax's exponentials, kept nowhere).
#[inline(always)]
fn sum_f64(row: &[f32], f: impl Fn(f32) -> f32) -> f64 {
    let mut lanes = [0f64; 4];
    let body = row.len() / 4 * 4;
    for c in row[..body].chunks_exact(4) {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += f64::from(f(v));
        }
    }
    let tail: f64 = row[body..].iter().map(|&v| f64::from(f(v))).sum();
    (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]) + tail
}

/// e^x for x <= 88 (the softmax's x - max <= 0), 0 below -87.33 (where e^x leaves the normal
/// range): Cephes' `expf` without branches. x = n ln2 + r with n = round(x log2 e) (the 1.5 * 2^23
/// trick: adding it rounds to an integer and leaves n in the low mantissa bits), r = x - n ln2 in two
/// parts (exact to ~1e-10), e^r by its degree-7 minimax polynomial (relative error ~1e-7 on
/// |r| <= ln2 / 2), times 2^n built in the exponent bits. Within 2 ulp of the correctly rounded e^x.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    let xc = x.clamp(-87.336_55, 88.0);
    let t = xc * std::f32::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    let r = xc - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let mut p = 1.987_569_2e-4;
    p = p * r + 1.398_2e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let er = p * r * r + r + 1.0;
    // n in [-126, 127]: its biased exponent n + 127 is a normal one.
    let bits = (t.to_bits() as i32 - MAGIC.to_bits() as i32 + 127) << 23;
    let y = er * f32::from_bits(bits as u32);
    if x < -87.336_55 {
        0.0
    } else {
        y
    }
}

#[cfg(test)]
mod tests {
    use super::exp;

    /// [`exp`] against f64's e^x over the softmax's range (and a little above 0): within 2 ulp of the
    /// f32 rounding of the exact value (|rel| <= 2 * 2^-23); 0 where e^x is below the normal range.
    #[test]
    fn exp_is_within_two_ulp() {
        let mut worst = 0f64;
        let mut x = -87.3f32;
        while x <= 10.0 {
            let want = f64::from(x).exp();
            let got = f64::from(exp(x));
            let rel = (got - want).abs() / want;
            worst = worst.max(rel);
            assert!(
                rel <= 2.0 * f64::from(f32::EPSILON),
                "exp({x}) = {got}, want {want}"
            );
            x += 0.000_37;
        }
        eprintln!("exp: worst relative error {worst:.3e}");
        for x in [-87.4f32, -100.0, -1e9, f32::MIN] {
            assert_eq!(exp(x), 0.0, "exp({x})");
        }
        assert_eq!(exp(0.0), 1.0);
    }
}
