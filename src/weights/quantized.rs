//! Quantized checkpoints on disk: the `quantization` entry of `config.json` and the naming of quantized
//! tensors (written by `scripts/fixtures/convert_checkpoint.py --dtype q8|q4`).
//!
//! # Format (`florence2-wasm-block`)
//! - Only matrix weights (what [`crate::weights::is_matrix_weight`] selects, with rows of K weights, K a
//!   multiple of 32, and no layout fix-up) are quantized; every other tensor keeps its float dtype.
//! - A quantized matrix `NAME` of shape `(N, K)` is stored as ONE tensor named `NAME.qweight`, dtype `U8`,
//!   shape `(N, row_bytes)`, whose bytes are exactly the engine's GPU row layout ([`crate::quant`]):
//!   per row `[quants][K/32 f16 scales, little-endian][zero padding to 16 bytes]`; q8 quants are K
//!   two's-complement bytes, q4 quants are K/2 bytes (weight k in byte k/2, low nibble for even k, stored
//!   as `q + 8`). `row_bytes` is `K + pad16(K/16)` for q8 and `K/2 + pad16(K/16)` for q4. Because the file
//!   holds the GPU layout, a file loaded in its own format streams straight into the GPU buffer (no
//!   conversion); loaded into another resident dtype it is dequantized row by row (and, for the other
//!   quantized format, requantized with the engine's quantizer).
//! - `config.json` has
//!   `"quantization": {"format": "florence2-wasm-block", "bits": 8 | 4, "block_size": 32,
//!   "scale_dtype": "float16", "tensors": ["NAME", ...]}`: `tensors` lists the (unsuffixed) source names
//!   of the quantized matrices ([`crate::config::quantization`] parses it).
//!
//! The loader checks every quantized tensor against this entry and the config's shapes: a `.qweight`
//! tensor without the entry, one not listed, one that is not U8, one whose shape is not `(N, row_bytes)`
//! of the expected `(N, K)`, a listed tensor stored as floats, or rows whose padding is not zero all give
//! [`crate::Error::QuantizedTensor`].

use crate::error::{Error, Result};
use crate::quant::{QFormat, QBLOCK};

/// Suffix of a quantized matrix's tensor name.
pub const QWEIGHT_SUFFIX: &str = ".qweight";

/// Check whole quantized rows from a file: the padding after the scales must be zero (a writer that
/// disagrees with the documented layout is caught instead of loaded as garbage).
pub fn check_rows(fmt: QFormat, k: usize, name: &str, rows: &[u8]) -> Result<()> {
    let rb = fmt.row_bytes(k);
    let used = fmt.quant_bytes(k) + k / QBLOCK * 2;
    for (i, row) in rows.chunks(rb).enumerate() {
        if row.len() != rb {
            return Err(quant_err(
                name,
                format!("a partial row of {} bytes", row.len()),
            ));
        }
        if row[used..].iter().any(|&b| b != 0) {
            return Err(quant_err(
                name,
                format!("row {i} has non-zero padding after its scales"),
            ));
        }
    }
    Ok(())
}

pub(crate) fn quant_err(name: &str, msg: impl Into<String>) -> Error {
    Error::QuantizedTensor {
        name: name.to_owned(),
        msg: msg.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_must_be_zero() {
        let k = 32;
        let mut rows = Vec::new();
        crate::quant::quantize_rows(QFormat::Q8, k, &[0.5; 64], &mut rows).unwrap();
        check_rows(QFormat::Q8, k, "w", &rows).unwrap();
        let rb = QFormat::Q8.row_bytes(k);
        rows[rb + rb - 1] = 1;
        let e = check_rows(QFormat::Q8, k, "w", &rows).unwrap_err();
        assert!(matches!(e, Error::QuantizedTensor { .. }), "{e}");
    }
}
