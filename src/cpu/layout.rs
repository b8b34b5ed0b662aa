//! Layout copies ([`crate::ops::layout`]): a materialised permutation of up to 4 dimensions, and the
//! split of a fused q | k | v projection into three matrices.

use crate::cpu::check_len;
use crate::error::{Error, Result};

/// out = x.permute(dims) for x of `shape` (rank <= 4), contiguous.
pub fn permute<T: Copy>(x: &[T], shape: &[usize], dims: &[usize], out: &mut [T]) -> Result<()> {
    const OP: &str = "cpu permute";
    let rank = shape.len();
    let mut seen = [false; 4];
    let valid = rank <= 4
        && dims.len() == rank
        && dims
            .iter()
            .all(|&d| d < rank && !std::mem::replace(&mut seen[d], true));
    if !valid {
        return Err(Error::shape(
            OP,
            format!("dims {dims:?} for shape {shape:?}"),
        ));
    }
    let n: usize = shape.iter().product();
    check_len(OP, "x", x, n)?;
    check_len(OP, "out", out, n)?;
    // Pad to rank 4 with leading unit dims; in_strides[i]: stride in x of out's dim i.
    let mut s_in = [0usize; 4];
    let mut acc = 1;
    for d in (0..rank).rev() {
        s_in[d] = acc;
        acc *= shape[d];
    }
    let (mut od, mut st) = ([1usize; 4], [0usize; 4]);
    for i in 0..rank {
        od[4 - rank + i] = shape[dims[i]];
        st[4 - rank + i] = s_in[dims[i]];
    }
    let mut o = 0;
    for a in 0..od[0] {
        for b in 0..od[1] {
            for c in 0..od[2] {
                let base = a * st[0] + b * st[1] + c * st[2];
                for d in 0..od[3] {
                    out[o] = x[base + d * st[3]];
                    o += 1;
                }
            }
        }
    }
    Ok(())
}

/// q, k, v (R, C) = the three column blocks of qkv (R, 3C).
pub fn split_qkv(qkv: &[f32], c: usize, q: &mut [f32], k: &mut [f32], v: &mut [f32]) -> Result<()> {
    const OP: &str = "cpu split_qkv";
    if c == 0 || !qkv.len().is_multiple_of(3 * c) {
        return Err(Error::shape(
            OP,
            format!("{} values are not rows of 3 x {c}", qkv.len()),
        ));
    }
    let rows = qkv.len() / (3 * c);
    for (name, t) in [("q", &*q), ("k", &*k), ("v", &*v)] {
        check_len(OP, name, t, rows * c)?;
    }
    for (r, row) in qkv.chunks_exact(3 * c).enumerate() {
        q[r * c..(r + 1) * c].copy_from_slice(&row[..c]);
        k[r * c..(r + 1) * c].copy_from_slice(&row[c..2 * c]);
        v[r * c..(r + 1) * c].copy_from_slice(&row[2 * c..]);
    }
    Ok(())
}
