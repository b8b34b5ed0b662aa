//! Host memory of the CPU backend ([`crate::gpu::Device::cpu`]): a tensor's buffer is a vector of 32-bit
//! words (every storage layout is a whole number of them, as on the GPU), and an op reaches its
//! tensors through [`HostAccess`].
//!
//! Every buffer sits behind its own `RwLock`. An op takes each distinct buffer once: the output's for
//! writing, the inputs' for reading. An input in the output's own buffer (an op in place, or a view of
//! the same arena buffer) is copied out first, so the kernel's input and output slices never alias.

use std::ops::Range;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::error::{Error, Result};
use crate::gpu::Tensor;

/// A host buffer: `words.len() * 4` bytes, zero-initialised.
#[derive(Debug)]
pub struct HostBuf {
    words: RwLock<Vec<u32>>,
}

impl HostBuf {
    /// `bytes` (a multiple of 4) zero bytes; [`Error::OutOfMemory`] when the allocation fails.
    pub fn zeros(bytes: u64) -> Result<HostBuf> {
        let n = usize::try_from(bytes / 4)
            .map_err(|_| Error::OutOfMemory(format!("{bytes} bytes of host memory")))?;
        let mut v: Vec<u32> = Vec::new();
        v.try_reserve_exact(n)
            .map_err(|_| Error::OutOfMemory(format!("{bytes} bytes of host memory")))?;
        v.resize(n, 0);
        Ok(HostBuf {
            words: RwLock::new(v),
        })
    }

    fn read(&self) -> Result<RwLockReadGuard<'_, Vec<u32>>> {
        self.words.read().map_err(|_| poisoned())
    }

    fn write(&self) -> Result<RwLockWriteGuard<'_, Vec<u32>>> {
        self.words.write().map_err(|_| poisoned())
    }

    /// Copy `bytes` in at byte `offset` (both multiples of 4, checked by the caller).
    pub fn write_bytes(&self, offset: u64, bytes: &[u8]) -> Result<()> {
        let mut w = self.write()?;
        let start = (offset / 4) as usize;
        let dst = w
            .get_mut(start..start + bytes.len() / 4)
            .ok_or_else(|| Error::shape("host write", "range outside the buffer"))?;
        bytemuck::cast_slice_mut::<u32, u8>(dst).copy_from_slice(bytes);
        Ok(())
    }

    /// `len` bytes from byte `offset` (multiples of 4).
    pub fn read_bytes(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        let r = self.read()?;
        let start = (offset / 4) as usize;
        let src = r
            .get(start..start + (len / 4) as usize)
            .ok_or_else(|| Error::shape("host read", "range outside the buffer"))?;
        Ok(bytemuck::cast_slice::<u32, u8>(src).to_vec())
    }

    /// Copy `words` words from word `src` of `from` to word `dst` of `self` (the two may be the same
    /// buffer, with overlapping ranges).
    pub fn copy_from(&self, from: &HostBuf, src: usize, dst: usize, words: usize) -> Result<()> {
        if std::ptr::eq(self, from) {
            let mut w = self.write()?;
            if src + words > w.len() || dst + words > w.len() {
                return Err(Error::shape("copy", "range outside the buffer"));
            }
            w.copy_within(src..src + words, dst);
            return Ok(());
        }
        let r = from.read()?;
        let mut w = self.write()?;
        let s = r
            .get(src..src + words)
            .ok_or_else(|| Error::shape("copy", "range outside the source"))?;
        w.get_mut(dst..dst + words)
            .ok_or_else(|| Error::shape("copy", "range outside the destination"))?
            .copy_from_slice(s);
        Ok(())
    }
}

fn poisoned() -> Error {
    Error::Gpu("a host buffer's lock was poisoned by a panic".into())
}

/// The word range a tensor covers in its host buffer.
fn words_of(t: &Tensor) -> Range<usize> {
    let start = (t.offset() / 4) as usize;
    start..start + (t.byte_size() / 4) as usize
}

/// What [`HostAccess::split`] gives: the outputs' words and the inputs' words.
pub type Split<'s> = (Vec<&'s mut [u32]>, Vec<&'s [u32]>);

/// An input as the kernel sees it: borrowed from a read lock, or a copy (when it shares an output's
/// buffer).
enum Held<'a> {
    Read(RwLockReadGuard<'a, Vec<u32>>),
    Copy(Vec<u32>),
}

/// The tensors of one host op: the outputs locked for writing, each input readable. Build it with
/// [`HostAccess::new`], then take the slices with [`HostAccess::split`].
pub struct HostAccess<'a> {
    outs: Vec<(RwLockWriteGuard<'a, Vec<u32>>, Range<usize>)>,
    /// Distinct read-locked buffers (keyed by address) and copies.
    held: Vec<(usize, Held<'a>)>,
    /// Per input: (index into `held`, its word range there).
    inputs: Vec<(usize, Range<usize>)>,
}

impl<'a> HostAccess<'a> {
    /// Lock `outs` for writing and `ins` for reading (see the module docs). Every tensor must be a host
    /// tensor, and no two outputs may share a buffer.
    pub fn new(outs: &[&'a Tensor], ins: &[&'a Tensor]) -> Result<HostAccess<'a>> {
        let mut out_bufs: Vec<&HostBuf> = Vec::with_capacity(outs.len());
        for t in outs {
            let b = t.host()?;
            if out_bufs.iter().any(|o| std::ptr::eq(*o, b)) {
                return Err(Error::shape("host op", "two outputs share a buffer"));
            }
            out_bufs.push(b);
        }
        let mut held: Vec<(usize, Held<'a>)> = Vec::new();
        let mut inputs = Vec::with_capacity(ins.len());
        for t in ins {
            let b = t.host()?;
            let range = words_of(t);
            if out_bufs.iter().any(|o| std::ptr::eq(*o, b)) {
                // Copied before the outputs are locked.
                let copy = b.read()?.get(range).map(|s| s.to_vec());
                let copy =
                    copy.ok_or_else(|| Error::shape("host op", "input outside its buffer"))?;
                let n = copy.len();
                held.push((0, Held::Copy(copy)));
                inputs.push((held.len() - 1, 0..n));
                continue;
            }
            let key = b as *const HostBuf as usize;
            let at = match held
                .iter()
                .position(|(k, h)| *k == key && matches!(h, Held::Read(_)))
            {
                Some(i) => i,
                None => {
                    held.push((key, Held::Read(b.read()?)));
                    held.len() - 1
                }
            };
            inputs.push((at, range));
        }
        let mut locked = Vec::with_capacity(outs.len());
        for (t, b) in outs.iter().zip(out_bufs) {
            let g = b.write()?;
            let range = words_of(t);
            if range.end > g.len() {
                return Err(Error::shape("host op", "output outside its buffer"));
            }
            locked.push((g, range));
        }
        Ok(HostAccess {
            outs: locked,
            held,
            inputs,
        })
    }

    /// The outputs' words and the inputs' words, each in the order given to [`HostAccess::new`].
    pub fn split(&mut self) -> Result<Split<'_>> {
        let mut ins = Vec::with_capacity(self.inputs.len());
        for (at, range) in &self.inputs {
            let words: &[u32] = match &self.held[*at].1 {
                Held::Read(g) => g,
                Held::Copy(v) => v,
            };
            ins.push(
                words
                    .get(range.clone())
                    .ok_or_else(|| Error::shape("host op", "input outside its buffer"))?,
            );
        }
        let outs = self
            .outs
            .iter_mut()
            .map(|(g, r)| &mut g[r.clone()])
            .collect();
        Ok((outs, ins))
    }
}

/// Run `f` on the words of one output and of `ins` (see [`HostAccess`]).
pub fn with_host<R>(
    out: &Tensor,
    ins: &[&Tensor],
    f: impl FnOnce(&mut [u32], &[&[u32]]) -> Result<R>,
) -> Result<R> {
    let mut acc = HostAccess::new(&[out], ins)?;
    let (mut outs, ins) = acc.split()?;
    let o = outs
        .pop()
        .ok_or_else(|| Error::shape("host op", "no output"))?;
    f(o, &ins)
}

/// `words` as f32 values.
pub fn f32s(words: &[u32]) -> &[f32] {
    bytemuck::cast_slice(words)
}

/// `words` as mutable f32 values.
pub fn f32s_mut(words: &mut [u32]) -> &mut [f32] {
    bytemuck::cast_slice_mut(words)
}

/// `words` as f16 values.
pub fn f16s(words: &[u32]) -> &[half::f16] {
    bytemuck::cast_slice(words)
}

/// `words` as mutable f16 values.
pub fn f16s_mut(words: &mut [u32]) -> &mut [half::f16] {
    bytemuck::cast_slice_mut(words)
}

/// `words` as bytes.
pub fn bytes(words: &[u32]) -> &[u8] {
    bytemuck::cast_slice(words)
}
