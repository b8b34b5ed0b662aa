//! Row reductions ([`crate::ops::reduce`]): `argmax_rows` (greedy decoding), `topk_rows` (beam search)
//! and `mean_rows` (the projector's spatial mean). Ordering rule of argmax/topk: float order with NaN
//! above everything and -0 == +0; equal values rank lower index first (torch.argmax's first maximum,
//! a stable descending sort for topk).

use crate::cpu::check_len;
use crate::error::{Error, Result};

/// Largest k [`topk_rows`] takes (as the GPU kernel).
pub const TOPK_MAX: usize = 16;

/// Whether (a at ia) ranks above (b at ib).
#[inline]
fn better(a: f32, ia: usize, b: f32, ib: usize) -> bool {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => ia < ib,
        (true, false) => true,
        (false, true) => false,
        _ => a > b || (a == b && ia < ib),
    }
}

fn rows_of(op: &'static str, len: usize, v: usize) -> Result<usize> {
    if v == 0 || !len.is_multiple_of(v) {
        return Err(Error::shape(
            op,
            format!("{len} values are not rows of {v}"),
        ));
    }
    Ok(len / v)
}

/// out[r] = index of the largest value of row r of x (R, V).
pub fn argmax_rows(x: &[f32], v: usize, out: &mut [u32]) -> Result<()> {
    let r = rows_of("cpu argmax_rows", x.len(), v)?;
    check_len("cpu argmax_rows", "out", out, r)?;
    for (o, row) in out.iter_mut().zip(x.chunks_exact(v)) {
        let mut best = 0;
        for (i, &val) in row.iter().enumerate().skip(1) {
            if better(val, i, row[best], best) {
                best = i;
            }
        }
        *o = best as u32;
    }
    Ok(())
}

/// The k largest values of each row of x (R, V), descending, into vals (R, k) and their column indices
/// into ids (R, k); 1 <= k <= min(16, V).
pub fn topk_rows(x: &[f32], v: usize, k: usize, vals: &mut [f32], ids: &mut [u32]) -> Result<()> {
    const OP: &str = "cpu topk_rows";
    let r = rows_of(OP, x.len(), v)?;
    if k == 0 || k > TOPK_MAX || k > v {
        return Err(Error::shape(
            OP,
            format!("k = {k} (1..={TOPK_MAX}, <= V = {v})"),
        ));
    }
    check_len(OP, "vals", vals, r * k)?;
    check_len(OP, "ids", ids, r * k)?;
    for (ri, row) in x.chunks_exact(v).enumerate() {
        // Sorted best-first; a candidate enters when it beats the current k-th.
        let mut top: Vec<(f32, usize)> = Vec::with_capacity(k + 1);
        for (i, &val) in row.iter().enumerate() {
            if top.len() == k && !better(val, i, top[k - 1].0, top[k - 1].1) {
                continue;
            }
            let at = top
                .iter()
                .position(|&(bv, bi)| better(val, i, bv, bi))
                .unwrap_or(top.len());
            top.insert(at, (val, i));
            top.truncate(k);
        }
        for (s, &(val, i)) in top.iter().enumerate() {
            vals[ri * k + s] = val;
            ids[ri * k + s] = i as u32;
        }
    }
    Ok(())
}

/// out (B, C) = mean over N of x (B, N, C), N >= 1, summed in f32 in token order (as the GPU kernel).
pub fn mean_rows(x: &[f32], (b, n, c): (usize, usize, usize), out: &mut [f32]) -> Result<()> {
    const OP: &str = "cpu mean_rows";
    if n == 0 {
        return Err(Error::shape(OP, "N = 0"));
    }
    check_len(OP, "x", x, b * n * c)?;
    check_len(OP, "out", out, b * c)?;
    for (bi, o) in out.chunks_exact_mut(c.max(1)).enumerate() {
        o.fill(0.0);
        for row in x[bi * n * c..(bi + 1) * n * c].chunks_exact(c) {
            o.iter_mut().zip(row).for_each(|(a, &v)| *a += v);
        }
        o.iter_mut().for_each(|a| *a /= n as f32);
    }
    Ok(())
}
