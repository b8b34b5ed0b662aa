//! The `quantization` entry of `config.json` (a quantized checkpoint, see `weights::quantized`):
//! `{"format": "florence2-wasm-block", "bits": 8 | 4, "block_size": 32, "scale_dtype": "float16",
//! "tensors": ["NAME", ...]}`. Any other format, bit count, block size or scale type is refused by name.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::quant::{QFormat, QBLOCK};

/// The `format` value of the `quantization` entry.
pub const QUANT_FORMAT: &str = "florence2-wasm-block";
/// Most names the `tensors` list may hold (Florence-2-large has ~400 matrices).
const MAX_LISTED: usize = 1 << 16;

/// The validated `quantization` entry of `config.json`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantizationConfig {
    pub format: QFormat,
    /// Source tensor names (without the `.qweight` suffix) stored quantized.
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
}
