//! Quantized checkpoints on disk: the `quantization` entry of `config.json` and the naming of quantized
//! tensors (written by `scripts/convert_checkpoint.py --dtype q8|q4`).
//!
//! # Format (`florence2-wasm-block`)
//! - Only matrix weights (what [`crate::weights::is_matrix_weight`] selects, with rows of K weights, K a
//!   multiple of 32, and no layout fix-up) are quantized; every other tensor keeps its float dtype.
//! - A quantized matrix `NAME` of shape `(N, K)` is stored as ONE tensor named `NAME.qweight`, dtype `U8`,
//!   shape `(N, row_bytes)`, whose bytes are exactly the engine's GPU row layout ([`crate::gpu::quant`]):
//!   per row `[quants][K/32 f16 scales, little-endian][zero padding to 16 bytes]`; q8 quants are K
//!   two's-complement bytes, q4 quants are K/2 bytes (weight k in byte k/2, low nibble for even k, stored
//!   as `q + 8`). `row_bytes` is `K + pad16(K/16)` for q8 and `K/2 + pad16(K/16)` for q4. Because the file
//!   holds the GPU layout, a file loaded in its own format streams straight into the GPU buffer (no
//!   conversion); loaded into another resident dtype it is dequantized row by row (and, for the other
//!   quantized format, requantized with the engine's quantizer).
//! - `config.json` has
//!   `"quantization": {"format": "florence2-wasm-block", "bits": 8 | 4, "block_size": 32,
//!   "scale_dtype": "float16", "tensors": ["NAME", ...]}`: `tensors` lists the (unsuffixed) source names
//!   of the quantized matrices. Any other format, bit count, block size or scale type is refused by name
//!   ([`crate::Error::Config`]).
//!
//! The loader checks every quantized tensor against this entry and the config's shapes: a `.qweight`
//! tensor without the entry, one not listed, one that is not U8, one whose shape is not `(N, row_bytes)`
//! of the expected `(N, K)`, a listed tensor stored as floats, or rows whose padding is not zero all give
//! [`crate::Error::QuantizedTensor`].

use std::collections::BTreeSet;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::gpu::quant::{QFormat, QBLOCK};

/// The `format` value of the `quantization` entry.
pub const QUANT_FORMAT: &str = "florence2-wasm-block";
/// Suffix of a quantized matrix's tensor name.
pub const QWEIGHT_SUFFIX: &str = ".qweight";
/// Most names the `tensors` list may hold (Florence-2-large has ~400 matrices).
const MAX_LISTED: usize = 1 << 16;

/// The validated `quantization` entry of `config.json`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantizationConfig {
    pub format: QFormat,
    /// Source tensor names (without [`QWEIGHT_SUFFIX`]) stored quantized.
    pub tensors: BTreeSet<String>,
}

fn qerr(msg: impl std::fmt::Display) -> Error {
    Error::Config(format!("config.json quantization: {msg}"))
}

impl QuantizationConfig {
    /// Parse `config["quantization"]` (absent or null: `None`).
    pub fn from_config(cfg: &Value) -> Result<Option<Self>> {
        let Some(q) = cfg.get("quantization").filter(|v| !v.is_null()) else {
            return Ok(None);
        };
        let q = q.as_object().ok_or_else(|| qerr("must be an object"))?;
        let format = q
            .get("format")
            .and_then(Value::as_str)
            .ok_or_else(|| qerr("has no format string"))?;
        if format != QUANT_FORMAT {
            return Err(qerr(format!(
                "unknown format '{}' (supported: '{QUANT_FORMAT}')",
                format.chars().take(64).collect::<String>()
            )));
        }
        let bits = q.get("bits").ok_or_else(|| qerr("has no bits"))?;
        let format = match bits.as_u64() {
            Some(8) => QFormat::Q8,
            Some(4) => QFormat::Q4,
            _ => return Err(qerr(format!("unsupported bits {bits} (8 or 4)"))),
        };
        let block = q
            .get("block_size")
            .ok_or_else(|| qerr("has no block_size"))?;
        if block.as_u64() != Some(QBLOCK as u64) {
            return Err(qerr(format!(
                "unsupported block_size {block} (only {QBLOCK})"
            )));
        }
        if let Some(s) = q.get("scale_dtype") {
            if s.as_str() != Some("float16") {
                return Err(qerr(format!(
                    "unsupported scale_dtype {s} (only \"float16\")"
                )));
            }
        }
        let list = q
            .get("tensors")
            .and_then(Value::as_array)
            .ok_or_else(|| qerr("has no tensors list"))?;
        if list.len() > MAX_LISTED {
            return Err(qerr(format!(
                "lists {} tensors (at most {MAX_LISTED})",
                list.len()
            )));
        }
        let mut tensors = BTreeSet::new();
        for n in list {
            let n = n
                .as_str()
                .ok_or_else(|| qerr(format!("tensors has a non-string entry {n}")))?;
            tensors.insert(n.to_owned());
        }
        Ok(Some(QuantizationConfig { format, tensors }))
    }
}

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

    fn parse(s: &str) -> Result<Option<QuantizationConfig>> {
        QuantizationConfig::from_config(&serde_json::from_str(s).unwrap())
    }

    #[test]
    fn entries_parse_and_bad_ones_are_named() {
        assert_eq!(parse("{}").unwrap(), None);
        let q = parse(
            r#"{"quantization": {"format": "florence2-wasm-block", "bits": 4, "block_size": 32,
                "scale_dtype": "float16", "tensors": ["a.weight"]}}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(q.format, QFormat::Q4);
        assert!(q.tensors.contains("a.weight"));
        for (bad, word) in [
            (
                r#"{"format": "gptq", "bits": 4, "block_size": 32, "tensors": []}"#,
                "gptq",
            ),
            (
                r#"{"format": "florence2-wasm-block", "bits": 3, "block_size": 32, "tensors": []}"#,
                "bits 3",
            ),
            (
                r#"{"format": "florence2-wasm-block", "bits": 8, "block_size": 64, "tensors": []}"#,
                "block_size 64",
            ),
            (
                r#"{"format": "florence2-wasm-block", "bits": 8, "block_size": 32, "scale_dtype": "bfloat16", "tensors": []}"#,
                "scale_dtype",
            ),
            (
                r#"{"format": "florence2-wasm-block", "bits": 8, "block_size": 32}"#,
                "tensors",
            ),
            (
                r#"{"format": "florence2-wasm-block", "bits": 8, "block_size": 32, "tensors": [1]}"#,
                "non-string",
            ),
            (r#"[]"#, "object"),
        ] {
            let e = parse(&format!(r#"{{"quantization": {bad}}}"#)).unwrap_err();
            assert!(
                matches!(&e, Error::Config(m) if m.contains(word)),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn padding_must_be_zero() {
        let k = 32;
        let mut rows = Vec::new();
        crate::gpu::quant::quantize_rows(QFormat::Q8, k, &[0.5; 64], &mut rows).unwrap();
        check_rows(QFormat::Q8, k, "w", &rows).unwrap();
        let rb = QFormat::Q8.row_bytes(k);
        rows[rb + rb - 1] = 1;
        let e = check_rows(QFormat::Q8, k, "w", &rows).unwrap_err();
        assert!(matches!(e, Error::QuantizedTensor { .. }), "{e}");
    }
}
