//! Shape, dtype and aliasing checks shared by the launchers. Every failure is an [`Error::Shape`] naming
//! the op, so a caller's mistake never reaches the GPU (where it would be a silent out-of-bounds read).

use crate::error::{Error, Result};
use crate::gpu::{DType, Tensor};

/// `t` must hold `dtype`.
pub(crate) fn dtype(op: &'static str, name: &str, t: &Tensor, dtype: DType) -> Result<()> {
    if t.dtype() != dtype {
        return Err(Error::shape(
            op,
            format!("{name}: expected {dtype:?}, got {:?}", t.dtype()),
        ));
    }
    Ok(())
}

/// `t` must be f32.
pub(crate) fn f32(op: &'static str, name: &str, t: &Tensor) -> Result<()> {
    dtype(op, name, t, DType::F32)
}

/// `t` must hold 4-byte elements (f32 or u32): kernels that move elements as raw bits.
pub(crate) fn word(op: &'static str, name: &str, t: &Tensor) -> Result<()> {
    if !matches!(t.dtype(), DType::F32 | DType::U32) {
        return Err(Error::shape(
            op,
            format!(
                "{name}: expected f32 or u32 (4-byte elements), got {:?}",
                t.dtype()
            ),
        ));
    }
    Ok(())
}

/// `t` must have exactly `shape`.
pub(crate) fn shape(op: &'static str, name: &str, t: &Tensor, shape: &[usize]) -> Result<()> {
    if t.shape() != shape {
        return Err(Error::shape(
            op,
            format!("{name}: expected shape {shape:?}, got {:?}", t.shape()),
        ));
    }
    Ok(())
}

/// `t` must have rank `rank`; returns its shape.
pub(crate) fn rank<'a>(
    op: &'static str,
    name: &str,
    t: &'a Tensor,
    rank: usize,
) -> Result<&'a [usize]> {
    if t.rank() != rank {
        return Err(Error::shape(
            op,
            format!("{name}: expected rank {rank}, got shape {:?}", t.shape()),
        ));
    }
    Ok(t.shape())
}

/// True when two tensors share a buffer (in-place use, or a reshape of the same storage).
pub(crate) fn same_buffer(a: &Tensor, b: &Tensor) -> bool {
    a.same_buffer(b)
}

/// Reject `a` and `b` sharing storage (kernels whose outputs would race with their inputs).
pub(crate) fn distinct(op: &'static str, a: (&str, &Tensor), b: (&str, &Tensor)) -> Result<()> {
    if same_buffer(a.1, b.1) {
        return Err(Error::shape(
            op,
            format!("{} and {} must not share a buffer", a.0, b.0),
        ));
    }
    Ok(())
}

/// A size that the shader indexes with `u32`.
pub(crate) fn u32_of(op: &'static str, what: &str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::shape(op, format!("{what} = {n} does not fit in u32")))
}

/// Smallest power of two >= n, clamped to [min, max] (both powers of two): the workgroup size of a
/// per-row reduction.
pub(crate) fn pow2_wg(n: usize, min: u32, max: u32) -> u32 {
    let mut wg = min;
    while wg < max && (wg as usize) < n {
        wg *= 2;
    }
    wg
}
