//! Element-wise ops ([`crate::ops::elementwise`], [`crate::ops::pos_embed`],
//! [`crate::ops::decode_step::pos_add`]), in place on the first operand.

use crate::cpu::{check_len, par};
use crate::error::{Error, Result};

const CHUNK: usize = 1 << 14;

/// x += y (same lengths).
pub fn add(x: &mut [f32], y: &[f32]) -> Result<()> {
    check_len("cpu add", "y", y, x.len())?;
    par::chunks_mut(x, CHUNK, |t, c| {
        let yc = &y[t * CHUNK..][..c.len()];
        c.iter_mut().zip(yc).for_each(|(a, &b)| *a += b);
    });
    Ok(())
}

/// x *= s.
pub fn scale(x: &mut [f32], s: f32) {
    par::chunks_mut(x, CHUNK, |_, c| c.iter_mut().for_each(|v| *v *= s));
}

/// x[r, :] += row for x (R, C), row (C).
pub fn add_row(x: &mut [f32], row: &[f32]) -> Result<()> {
    let c = row.len();
    if c == 0 || !x.len().is_multiple_of(c) {
        return Err(Error::shape(
            "cpu add_row",
            format!("{} values are not rows of {c}", x.len()),
        ));
    }
    for r in x.chunks_exact_mut(c) {
        r.iter_mut().zip(row).for_each(|(a, &b)| *a += b);
    }
    Ok(())
}

/// x[t, :] += table[start + t, :] for x (T, C), table (P, C) with start + T <= P (learned positions).
pub fn add_rows_at(x: &mut [f32], table: &[f32], c: usize, start: usize) -> Result<()> {
    let end = start * c + x.len();
    if c == 0 || !x.len().is_multiple_of(c) || !table.len().is_multiple_of(c) || end > table.len() {
        return Err(Error::shape(
            "cpu add_rows_at",
            format!(
                "x of {} values at row {start} of a table of {} values, C = {c}",
                x.len(),
                table.len()
            ),
        ));
    }
    x.iter_mut()
        .zip(&table[start * c..end])
        .for_each(|(a, &b)| *a += b);
    Ok(())
}

/// Projector position terms: x[b, y*w + x, :] = (x + concat(col[x], row[y])) + temporal[0] for x
/// (B, h*w, C), col (P, C - C/2), row (P, C/2) with h, w <= P, temporal (T, C), T >= 1.
pub fn pos2d_temporal_add(
    feats: &mut [f32],
    (h, w, c): (usize, usize, usize),
    col: &[f32],
    row: &[f32],
    temporal: &[f32],
) -> Result<()> {
    let ccol = c - c / 2;
    let crow = c / 2;
    let ok = c > 0
        && feats.len().is_multiple_of(h * w * c)
        && col.len() >= w * ccol
        && row.len() >= h * crow
        && temporal.len() >= c;
    if !ok {
        return Err(Error::shape(
            "cpu pos2d_temporal_add",
            format!("feats of {} values for ({h} x {w}, {c})", feats.len()),
        ));
    }
    for (i, tok) in feats.chunks_exact_mut(c).enumerate() {
        let t = i % (h * w);
        let (y, xx) = (t / w, t % w);
        let pos = col[xx * ccol..(xx + 1) * ccol]
            .iter()
            .chain(&row[y * crow..(y + 1) * crow]);
        for ((v, &p), &tm) in tok.iter_mut().zip(pos).zip(&temporal[..c]) {
            *v = (*v + p) + tm;
        }
    }
    Ok(())
}
