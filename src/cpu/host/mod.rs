//! The CPU backend's side of every launcher: when the recorder's device is the host
//! ([`crate::gpu::Backend::Host`]), a launcher checks its operands as usual and its `match` calls the
//! function of the same name here, which runs the `crate::cpu` kernel on the tensors' host memory at once (through
//! [`crate::gpu::host::HostAccess`]). Same definitions, same layouts, same f32 arithmetic as the WGSL
//! kernels; the model above the launchers does not know which backend it runs on.

pub mod dense;
pub mod rows;
pub mod vision;

use half::f16;

use crate::cpu::attention::KvRef;
use crate::cpu::Weight;
use crate::error::{Error, Result};
use crate::gpu::host::{bytes, f16s, f32s, f32s_mut};
use crate::gpu::{DType, Tensor};

/// `t`'s f32 values in its words (the padding after them cut off).
pub(crate) fn f32_in<'a>(t: &Tensor, words: &'a [u32]) -> Result<&'a [f32]> {
    f32s(words).get(..t.numel()).ok_or_else(|| short(t))
}

/// `t`'s f32 values in its words, mutable.
pub(crate) fn f32_out<'a>(t: &Tensor, words: &'a mut [u32]) -> Result<&'a mut [f32]> {
    let n = t.numel();
    f32s_mut(words).get_mut(..n).ok_or_else(|| short(t))
}

/// `t`'s u32 values in its words.
pub(crate) fn u32_in<'a>(t: &Tensor, words: &'a [u32]) -> Result<&'a [u32]> {
    words.get(..t.numel()).ok_or_else(|| short(t))
}

/// `t`'s halves in its words.
pub(crate) fn f16_in<'a>(t: &Tensor, words: &'a [u32]) -> Result<&'a [f16]> {
    f16s(words).get(..t.numel()).ok_or_else(|| short(t))
}

fn short(t: &Tensor) -> Error {
    Error::shape(
        "host op",
        format!("{:?} {:?} is larger than its buffer", t.shape(), t.dtype()),
    )
}

/// A weight matrix (rows of the last dimension) in `t`'s storage format.
pub(crate) fn weight_in<'a>(t: &Tensor, words: &'a [u32]) -> Result<Weight<'a>> {
    Ok(match t.dtype() {
        DType::F32 => Weight::F32(f32_in(t, words)?),
        DType::F16 => Weight::F16(f16_in(t, words)?),
        d => match d.qformat() {
            Some(fmt) => {
                let n = d.bytes_for(t.shape())?;
                Weight::Quant(fmt, bytes(words).get(..n).ok_or_else(|| short(t))?)
            }
            None => {
                return Err(Error::shape(
                    "host op",
                    format!("a {d:?} tensor is not a weight"),
                ))
            }
        },
    })
}

/// K or V rows in `t`'s format (f32 or f16).
pub(crate) fn kv_in<'a>(t: &Tensor, words: &'a [u32]) -> Result<KvRef<'a>> {
    match t.dtype() {
        DType::F32 => Ok(KvRef::F32(f32_in(t, words)?)),
        DType::F16 => Ok(KvRef::F16(f16_in(t, words)?)),
        d => Err(Error::shape(
            "host attention",
            format!("k/v must be f32 or f16, got {d:?}"),
        )),
    }
}

/// Element `at` of the U32 step buffer `step` (the decoder's run-time position).
pub(crate) fn step_value(step: &Tensor, at: usize) -> Result<usize> {
    let b = step.host()?.read_bytes(step.offset(), step.byte_size())?;
    let words: Vec<u32> = bytemuck::pod_collect_to_vec(&b);
    words
        .get(at)
        .map(|&v| v as usize)
        .ok_or_else(|| Error::shape("host op", format!("step buffer has no element {at}")))
}
