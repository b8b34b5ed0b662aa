//! Element conversion to f32 (little-endian bytes in, little-endian f32 bytes out), for byte chunks
//! that may split an element anywhere: [`ElemConverter`] keeps the partial element between calls.

use crate::error::{Error, Result};
use crate::weights::header::StDtype;

/// Decode one element of `dtype` from exactly `dtype.size()` bytes.
#[inline]
fn decode(dtype: StDtype, b: &[u8]) -> f32 {
    match (dtype, b) {
        (StDtype::F32, &[a, b, c, d]) => f32::from_le_bytes([a, b, c, d]),
        (StDtype::F16, &[a, b]) => half::f16::from_bits(u16::from_le_bytes([a, b])).to_f32(),
        (StDtype::BF16, &[a, b]) => half::bf16::from_bits(u16::from_le_bytes([a, b])).to_f32(),
        _ => f32::NAN,
    }
}

/// Convert whole elements of `bytes` (length a multiple of the dtype size) into `out`.
pub fn to_f32_into(dtype: StDtype, bytes: &[u8], out: &mut Vec<f32>) -> Result<()> {
    if !dtype.is_loadable() {
        return Err(Error::UnsupportedDtype {
            name: String::new(),
            dtype: dtype.as_str().to_owned(),
        });
    }
    let sz = dtype.size();
    out.reserve(bytes.len() / sz);
    match dtype {
        StDtype::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        ),
        StDtype::F16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()),
        ),
        _ => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16)),
        ),
    }
    Ok(())
}

/// Streaming converter: push arbitrary byte slices, receive whole converted elements.
#[derive(Debug)]
pub struct ElemConverter {
    dtype: StDtype,
    carry: [u8; 4],
    carry_len: usize,
}

impl ElemConverter {
    pub fn new(dtype: StDtype) -> Result<Self> {
        if !dtype.is_loadable() {
            return Err(Error::UnsupportedDtype {
                name: String::new(),
                dtype: dtype.as_str().to_owned(),
            });
        }
        Ok(ElemConverter {
            dtype,
            carry: [0; 4],
            carry_len: 0,
        })
    }

    /// Bytes of a partial element held from the previous push.
    pub fn pending(&self) -> usize {
        self.carry_len
    }

    /// Convert `bytes` (continuing the previous push), appending whole elements to `out`.
    pub fn push(&mut self, mut bytes: &[u8], out: &mut Vec<f32>) -> Result<()> {
        let sz = self.dtype.size();
        if self.carry_len > 0 {
            let take = (sz - self.carry_len).min(bytes.len());
            let (head, rest) = bytes.split_at(take);
            self.carry[self.carry_len..self.carry_len + take].copy_from_slice(head);
            self.carry_len += take;
            bytes = rest;
            if self.carry_len < sz {
                return Ok(());
            }
            out.push(decode(self.dtype, &self.carry[..sz]));
            self.carry_len = 0;
        }
        let whole = bytes.len() / sz * sz;
        let (body, tail) = bytes.split_at(whole);
        to_f32_into(self.dtype, body, out)?;
        self.carry[..tail.len()].copy_from_slice(tail);
        self.carry_len = tail.len();
        Ok(())
    }
}
