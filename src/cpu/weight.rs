//! Matrix weights on the host in every resident format, and their per-row / per-block dequantization.
//! A weight is a matrix (N, K) in PyTorch Linear layout (or an embedding table (V, C), K = C): f32, IEEE
//! half, or the block-quantized q8/q4 rows of [`crate::quant`] (byte for byte the GPU buffer and the
//! quantized checkpoint layout: `[quants][K/32 f16 scales][zero padding to 16 bytes]` per row). Kernels
//! never dequantize a whole matrix: a row or a 32-weight block at a time, into registers or a panel.

use half::f16;

use crate::error::{Error, Result};
use crate::quant::{QFormat, QBLOCK};

/// A borrowed weight matrix (N, K).
#[derive(Clone, Copy, Debug)]
pub enum Weight<'a> {
    /// N * K values, row-major.
    F32(&'a [f32]),
    /// N * K halves, row-major.
    F16(&'a [f16]),
    /// N rows of `fmt.row_bytes(K)` bytes (K % 32 == 0).
    Quant(QFormat, &'a [u8]),
}

impl Weight<'_> {
    /// Check that this holds an (n, k) matrix ([`Error::Shape`] for `op` otherwise).
    pub fn check(&self, op: &'static str, n: usize, k: usize) -> Result<()> {
        let (len, want) = match self {
            Weight::F32(w) => (w.len(), n * k),
            Weight::F16(w) => (w.len(), n * k),
            Weight::Quant(fmt, w) => {
                fmt.check_k(op, k)?;
                (w.len(), n * fmt.row_bytes(k))
            }
        };
        if len != want {
            return Err(Error::shape(
                op,
                format!("{} weight of {len} elements is not ({n}, {k})", self.name()),
            ));
        }
        Ok(())
    }

    pub fn name(&self) -> &'static str {
        match self {
            Weight::F32(_) => "f32",
            Weight::F16(_) => "f16",
            Weight::Quant(fmt, _) => fmt.name(),
        }
    }

    /// Row `row` of K weights as f32 into `out` (K values). Quantized rows are dequantized block by block
    /// (`d * q`, exact in f32: |q| <= 127 has 7 significant bits and d is an f16).
    pub fn row_into(&self, k: usize, row: usize, out: &mut [f32]) {
        match self {
            Weight::F32(w) => out.copy_from_slice(&w[row * k..(row + 1) * k]),
            Weight::F16(w) => crate::cpu::widen::f16_to_f32(&w[row * k..(row + 1) * k], out),
            Weight::Quant(fmt, w) => {
                let rb = fmt.row_bytes(k);
                let bytes = &w[row * rb..(row + 1) * rb];
                for (b, blk) in out.chunks_exact_mut(QBLOCK).enumerate() {
                    dequant_block(*fmt, k, bytes, b, blk);
                }
            }
        }
    }
}

/// The scale of block `b` of a quantized row of `k` weights.
#[inline]
fn block_scale(fmt: QFormat, k: usize, row: &[u8], b: usize) -> f32 {
    let s = fmt.quant_bytes(k) + 2 * b;
    f16::from_bits(u16::from_le_bytes([row[s], row[s + 1]])).to_f32()
}

/// Block `b` (weights 32 b .. 32 b + 32) of a quantized row of `k` weights, as f32, into `out` (32).
#[inline]
pub fn dequant_block(fmt: QFormat, k: usize, row: &[u8], b: usize, out: &mut [f32]) {
    let d = block_scale(fmt, k, row, b);
    match fmt {
        QFormat::Q8 => {
            let q = &row[b * QBLOCK..(b + 1) * QBLOCK];
            for (o, &v) in out.iter_mut().zip(q) {
                *o = d * f32::from(v as i8);
            }
        }
        QFormat::Q4 => {
            let q = &row[b * QBLOCK / 2..(b + 1) * QBLOCK / 2];
            for (pair, &v) in out.chunks_exact_mut(2).zip(q) {
                pair[0] = d * f32::from((v & 0xF) as i8 - 8);
                pair[1] = d * f32::from((v >> 4) as i8 - 8);
            }
        }
    }
}
