//! Row softmax and log-softmax over the last dimension, max-subtracted, as
//! [`crate::ops::softmax`]: softmax = exp(x - m) / sum, log_softmax = (x - m) - ln(sum). In place (the
//! GPU's `out = x` case; copy first for another output). The sum of the exponentials accumulates in
//! f64: a sequential f32 sum over the 51328-token vocabulary would lose ~1e-4 relative (the GPU's tree
//! reduction loses ~log2(C) roundings).

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
pub fn softmax_row(row: &mut [f32]) {
    let m = row.iter().fold(-f32::MAX, |a, &v| a.max(v));
    let mut s = 0f64;
    for v in row.iter_mut() {
        *v = (*v - m).exp();
        s += f64::from(*v);
    }
    let inv = (1.0 / s) as f32;
    row.iter_mut().for_each(|v| *v *= inv);
}

fn log_softmax_row(row: &mut [f32]) {
    let m = row.iter().fold(-f32::MAX, |a, &v| a.max(v));
    let s: f64 = row.iter().map(|&v| f64::from((v - m).exp())).sum();
    let ls = s.ln() as f32;
    row.iter_mut().for_each(|v| *v = (*v - m) - ls);
}
