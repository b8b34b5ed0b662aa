//! Block-wise symmetric quantization of matrix weights (the resident `q8` and `q4` formats).
//!
//! # Format
//! A quantized tensor is a matrix `(N, K)` (PyTorch Linear layout, or an embedding table `(V, C)` with
//! K = C) with `K % 32 == 0`. Each row is cut into blocks of [`QBLOCK`] = 32 consecutive weights along K.
//! A block has one f16 scale `d = max|w| / QMAX` (`QMAX` = 127 for q8, 7 for q4) and 32 integers
//! `q = round(w / d)` in `[-QMAX, QMAX]`; the weight it stands for is `d * q` (symmetric: no zero point,
//! so the largest weight of every block is exact up to the f16 rounding of `d`).
//!
//! Alternatives to this quantizer and their measured errors: `scripts/bench/q4_fidelity.rs`.
//!
//! Row layout in the GPU buffer (and, byte for byte, in quantized checkpoints: `NAME.qweight` U8
//! tensors, see [`crate::weights::quantized`] and `scripts/fixtures/convert_checkpoint.py --dtype q8|q4`, whose
//! quantizer reproduces this one bit for bit):
//! `[quants][scales][zero padding]`, each row starting at a multiple of 16 bytes:
//! - q8 quants: K bytes, weight k is the two's-complement byte k.
//! - q4 quants: K/2 bytes, weight k in byte k/2, low nibble for even k, high nibble for odd k, stored as
//!   `q + 8` (0..=15; 0 never occurs since q >= -7). Read as little-endian u32 words, weight k is nibble
//!   k mod 8 of word k/8.
//! - scales: K/32 IEEE half values (little-endian), block b at scale index b, padded with zeros to a
//!   multiple of 16 bytes.
//!
//! So a row is `K + pad16(K/16)` bytes for q8 (8.5 bits per weight plus padding) and
//! `K/2 + pad16(K/16)` bytes for q4 (4.5 bits per weight): 816 and 432 bytes for K = 768.
//! The GPU kernels (`shaders/matmul_common.wgsl`, `shaders/embedding.wgsl`) dequantize in registers:
//! every read of 8 weights costs one scale load and 8 integer unpacks.

use crate::error::{Error, Result};

/// Weights per quantization block.
pub const QBLOCK: usize = 32;

/// A block-quantized format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QFormat {
    Q8,
    Q4,
}

impl QFormat {
    /// Bits per quantized weight.
    pub fn bits(self) -> usize {
        match self {
            QFormat::Q8 => 8,
            QFormat::Q4 => 4,
        }
    }

    /// Bytes of the quants of one row of `k` weights.
    pub fn quant_bytes(self, k: usize) -> usize {
        k * self.bits() / 8
    }

    /// Bytes of one row of `k` weights (quants + scales + padding), a multiple of 16. `k % 32 == 0`.
    pub fn row_bytes(self, k: usize) -> usize {
        self.quant_bytes(k) + (k / QBLOCK * 2).div_ceil(16) * 16
    }

    /// Check that rows of `k` weights can be quantized.
    pub fn check_k(self, what: &str, k: usize) -> Result<()> {
        if k == 0 || !k.is_multiple_of(QBLOCK) {
            return Err(Error::shape(
                "quantize",
                format!("{what}: rows of {k} weights are not whole {QBLOCK}-weight blocks"),
            ));
        }
        Ok(())
    }

    pub fn name(self) -> &'static str {
        match self {
            QFormat::Q8 => "q8",
            QFormat::Q4 => "q4",
        }
    }
}

/// Largest magnitude of a quantized integer.
fn qmax(fmt: QFormat) -> f32 {
    match fmt {
        QFormat::Q8 => 127.0,
        QFormat::Q4 => 7.0,
    }
}

/// The scale and integers of one block: `d = max|w| / QMAX` rounded to f16 (kept finite), `q =
/// round(w / d)` clamped to `[-QMAX, QMAX]`; non-finite weights count as 0.
fn quantize_one(fmt: QFormat, block: &[f32]) -> (half::f16, [i32; QBLOCK]) {
    let amax = block.iter().fold(
        0.0f32,
        |m, &v| if v.is_finite() { m.max(v.abs()) } else { m },
    );
    let mut d16 = half::f16::from_f32(amax / qmax(fmt));
    if d16.is_infinite() {
        d16 = half::f16::MAX;
    }
    let d = d16.to_f32();
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0i32; QBLOCK];
    for (qi, &v) in q.iter_mut().zip(block) {
        let v = if v.is_finite() { v } else { 0.0 };
        *qi = (v * inv).round().clamp(-qmax(fmt), qmax(fmt)) as i32;
    }
    (d16, q)
}

/// Quantize rows of `k` weights (`values.len()` a multiple of `k`, `k % 32 == 0`) into `out`, appending
/// `values.len() / k * fmt.row_bytes(k)` bytes in the layout above. Non-finite weights become 0.
pub fn quantize_rows(fmt: QFormat, k: usize, values: &[f32], out: &mut Vec<u8>) -> Result<()> {
    fmt.check_k("quantize_rows", k)?;
    if !values.len().is_multiple_of(k) {
        return Err(Error::shape(
            "quantize",
            format!("{} values are not whole rows of {k}", values.len()),
        ));
    }
    let row_bytes = fmt.row_bytes(k);
    let qbytes = fmt.quant_bytes(k);
    for row in values.chunks_exact(k) {
        let start = out.len();
        out.resize(start + row_bytes, 0);
        let dst = &mut out[start..start + row_bytes];
        for (b, block) in row.chunks_exact(QBLOCK).enumerate() {
            let (d16, q) = quantize_one(fmt, block);
            let s = qbytes + 2 * b;
            dst[s..s + 2].copy_from_slice(&d16.to_bits().to_le_bytes());
            for (i, &qi) in q.iter().enumerate() {
                let k_idx = b * QBLOCK + i;
                match fmt {
                    QFormat::Q8 => dst[k_idx] = qi as i8 as u8,
                    QFormat::Q4 => {
                        let nib = (qi + 8) as u8 & 0xF;
                        dst[k_idx / 2] |= if k_idx.is_multiple_of(2) {
                            nib
                        } else {
                            nib << 4
                        };
                    }
                }
            }
        }
    }
    Ok(())
}

/// The weights quantized rows stand for (`d * q`), as f32: the reference the kernels are tested against.
pub fn dequantize_rows(fmt: QFormat, k: usize, bytes: &[u8]) -> Result<Vec<f32>> {
    let mut out = Vec::new();
    dequantize_rows_into(fmt, k, bytes, &mut out)?;
    Ok(out)
}

/// [`dequantize_rows`], appending to `out` (the loader's conversion of quantized checkpoint rows into
/// another resident dtype).
pub fn dequantize_rows_into(
    fmt: QFormat,
    k: usize,
    bytes: &[u8],
    out: &mut Vec<f32>,
) -> Result<()> {
    fmt.check_k("dequantize_rows", k)?;
    let row_bytes = fmt.row_bytes(k);
    if !bytes.len().is_multiple_of(row_bytes) {
        return Err(Error::shape(
            "dequantize",
            format!("{} bytes are not whole {row_bytes}-byte rows", bytes.len()),
        ));
    }
    let qbytes = fmt.quant_bytes(k);
    out.reserve(bytes.len() / row_bytes * k);
    for row in bytes.chunks_exact(row_bytes) {
        for kk in 0..k {
            let b = kk / QBLOCK;
            let d = half::f16::from_bits(u16::from_le_bytes([
                row[qbytes + 2 * b],
                row[qbytes + 2 * b + 1],
            ]))
            .to_f32();
            let q = match fmt {
                QFormat::Q8 => row[kk] as i8 as i32,
                QFormat::Q4 => {
                    let byte = row[kk / 2];
                    let nib = if kk % 2 == 0 { byte & 0xF } else { byte >> 4 };
                    nib as i32 - 8
                }
            };
            out.push(d * q as f32);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_bytes_are_16_aligned() {
        assert_eq!(QFormat::Q8.row_bytes(768), 816);
        assert_eq!(QFormat::Q4.row_bytes(768), 432);
        assert_eq!(QFormat::Q4.row_bytes(32), 32);
        for k in (32..=4096).step_by(32) {
            assert_eq!(QFormat::Q8.row_bytes(k) % 16, 0);
            assert_eq!(QFormat::Q4.row_bytes(k) % 16, 0);
        }
    }

    #[test]
    fn round_trip_error_is_within_half_a_step() {
        let k = 64;
        let vals: Vec<f32> = (0..3 * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        for fmt in [QFormat::Q8, QFormat::Q4] {
            let mut bytes = Vec::new();
            quantize_rows(fmt, k, &vals, &mut bytes).unwrap();
            assert_eq!(bytes.len(), 3 * fmt.row_bytes(k));
            let back = dequantize_rows(fmt, k, &bytes).unwrap();
            for (blk, (a, b)) in vals.chunks(QBLOCK).zip(back.chunks(QBLOCK)).enumerate() {
                let amax = a.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                // Half a step, plus the f16 rounding of the scale (relative 2^-11) over QMAX steps.
                let step = amax / qmax(fmt);
                let bound = 0.5 * step * 1.001 + amax * 2f32.powi(-11);
                for (x, y) in a.iter().zip(b) {
                    assert!((x - y).abs() <= bound, "{fmt:?} block {blk}: {x} vs {y}");
                }
            }
        }
    }

    #[test]
    fn zero_blocks_and_non_finite_values() {
        let mut vals = vec![0.0f32; 32];
        vals.extend((0..32).map(|i| if i == 3 { f32::NAN } else { 1.0 }));
        let mut bytes = Vec::new();
        quantize_rows(QFormat::Q4, 64, &vals, &mut bytes).unwrap();
        let back = dequantize_rows(QFormat::Q4, 64, &bytes).unwrap();
        assert!(back[..32].iter().all(|&v| v == 0.0));
        assert_eq!(back[32 + 3], 0.0);
        // A constant block is exact up to the f16 rounding of its scale.
        assert!((back[32] - 1.0).abs() <= 1e-3, "{}", back[32]);
    }

    #[test]
    fn bad_k_is_an_error() {
        let mut out = Vec::new();
        assert!(quantize_rows(QFormat::Q8, 48, &[0.0; 48], &mut out).is_err());
        assert!(quantize_rows(QFormat::Q8, 32, &[0.0; 48], &mut out).is_err());
    }
}
