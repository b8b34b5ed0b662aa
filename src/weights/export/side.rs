//! The small files of a converted checkpoint: `config.json` (with the `quantization` entry of a q8/q4
//! output, without one otherwise), `tokenizer.json` (completed with the Florence-2 tokens, or built from
//! `vocab.json` + `merges.txt`), `preprocessor_config.json` and `generation_config.json` (copied, or
//! Florence-2's defaults, which are also what the loader uses when they are absent), and
//! `processor_config.json` / `tokenizer_config.json` when present.

use std::path::Path;

use serde_json::{json, Value};

use crate::config::quantization::QUANT_FORMAT;
use crate::error::{Error, Result};
use crate::processor::tokenizer::{
    complete_tokenizer_json, tokenizer_json_from_vocab_merges, MAX_TOKENIZER_JSON_BYTES,
};
use crate::quant::{QFormat, QBLOCK};
use crate::weights::export::shards::{write_err, write_json};
use crate::weights::load::{CONFIG_FILE, MAX_JSON_BYTES};

/// Florence-2's image processor settings (the model card's `preprocessor_config.json`).
pub fn default_preprocessor_config() -> Value {
    json!({
        "do_convert_rgb": true,
        "do_resize": true,
        "size": {"height": 768, "width": 768},
        "resample": 3,
        "do_center_crop": false,
        "crop_size": {"height": 768, "width": 768},
        "do_rescale": true,
        "rescale_factor": 1.0 / 255.0,
        "do_normalize": true,
        "image_mean": [0.485, 0.456, 0.406],
        "image_std": [0.229, 0.224, 0.225],
        "image_processor_type": "CLIPImageProcessor",
        "image_seq_length": 577,
    })
}

/// Florence-2's generation settings (the model card's `generation_config.json`).
pub fn default_generation_config() -> Value {
    json!({
        "bos_token_id": 0,
        "pad_token_id": 1,
        "eos_token_id": 2,
        "decoder_start_token_id": 2,
        "forced_bos_token_id": 0,
        "forced_eos_token_id": 2,
        "num_beams": 3,
        "no_repeat_ngram_size": 3,
        "early_stopping": true,
    })
}

fn read_opt(path: &Path, max: u64) -> Result<Option<Vec<u8>>> {
    crate::files::read_capped_opt(path, max)
}

/// `config.json` with the output's `quantization` entry: `Some((format, names))` for q8/q4 outputs
/// (names sorted), `None` removes any entry of the source.
pub fn write_config(
    config: &[u8],
    quantized: Option<(QFormat, Vec<String>)>,
    out: &Path,
) -> Result<()> {
    let mut v: Value = crate::json::parse_strict_slice(config)
        .map_err(|e| Error::Config(format!("config.json: {e}")))?;
    let obj = v
        .as_object_mut()
        .ok_or_else(|| Error::Config("config.json is not an object".into()))?;
    match quantized {
        Some((fmt, names)) => {
            obj.insert(
                "quantization".into(),
                json!({
                    "format": QUANT_FORMAT,
                    "bits": fmt.bits(),
                    "block_size": QBLOCK,
                    "scale_dtype": "float16",
                    "tensors": names,
                }),
            );
        }
        None => {
            obj.remove("quantization");
        }
    }
    write_json(&out.join(CONFIG_FILE), &v)
}

/// Every side file but `config.json`, from `src` into `out`; returns notes for the summary.
pub fn write_side_files(src: &Path, out: &Path) -> Result<Vec<String>> {
    let mut notes = Vec::new();
    let tok_max = MAX_TOKENIZER_JSON_BYTES as u64;
    let tok = match read_opt(&src.join("tokenizer.json"), tok_max)? {
        Some(b) => {
            let done = complete_tokenizer_json(&b)?;
            if done != b {
                notes.push("tokenizer.json: the Florence-2 tokens added".to_owned());
            }
            done
        }
        None => {
            let vocab = read_opt(&src.join("vocab.json"), tok_max)?;
            let merges = read_opt(&src.join("merges.txt"), tok_max)?;
            let (Some(v), Some(m)) = (vocab, merges) else {
                return Err(Error::FileRead {
                    file: src.join("tokenizer.json").display().to_string(),
                    msg: "not found (nor vocab.json + merges.txt)".into(),
                });
            };
            notes.push("tokenizer.json: built from vocab.json + merges.txt".to_owned());
            tokenizer_json_from_vocab_merges(&v, &m)?
        }
    };
    let p = out.join("tokenizer.json");
    std::fs::write(&p, tok).map_err(|e| write_err(&p, e))?;
    for (name, default) in [
        ("preprocessor_config.json", default_preprocessor_config()),
        ("generation_config.json", default_generation_config()),
    ] {
        match read_opt(&src.join(name), MAX_JSON_BYTES)? {
            Some(b) => {
                let p = out.join(name);
                std::fs::write(&p, b).map_err(|e| write_err(&p, e))?;
            }
            None => {
                write_json(&out.join(name), &default)?;
                notes.push(format!("{name}: Florence-2's defaults written"));
            }
        }
    }
    for name in ["processor_config.json", "tokenizer_config.json"] {
        if let Some(b) = read_opt(&src.join(name), MAX_JSON_BYTES)? {
            let p = out.join(name);
            std::fs::write(&p, b).map_err(|e| write_err(&p, e))?;
        }
    }
    Ok(notes)
}
