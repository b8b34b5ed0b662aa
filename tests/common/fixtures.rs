//! The committed reference fixtures (`tests/fixtures/`, see its README) and the `florence2 run` CLI on them,
//! shared by the parity tests.

use std::path::{Path, PathBuf};

use florence2_wasm::model::generate::{EarlyStopping, GenerateOptions};
use serde_json::Value;

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The committed demo model (`www/models/florence2-shapes`, see its card).
pub fn demo_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("www/models/florence2-shapes")
}

/// The first `n` of the demo model's sample scenes (PNG bytes, in file-name order).
pub fn demo_samples(n: usize) -> Vec<Vec<u8>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(demo_model().join("samples"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "png"))
        .collect();
    files.sort();
    files
        .iter()
        .take(n)
        .map(|f| std::fs::read(f).unwrap())
        .collect()
}

/// The reference cases of one fixture dir (`reference/<dir>/cases.json`).
pub fn cases(dir: &str) -> Vec<Value> {
    let path = fixtures().join("reference").join(dir).join("cases.json");
    let v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    v.as_array().unwrap().clone()
}

/// A JSON array of token ids.
pub fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// `florence2 run --json` on a fixture model dir and a reference case, with `extra` flags; the parsed JSON.
/// Weights are f32 (the reference precision) unless `extra` has a `--dtype`.
pub fn cli_run(dir: &str, case: &Value, extra: &[&str]) -> Value {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_florence2"));
    // The kernel tuner's cache goes under target/, not the user's cache directory.
    cmd.env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"));
    cmd.env("NODEVICE_SELECT", "1").args([
        "run",
        "--model",
        fixtures().join("models").join(dir).to_str().unwrap(),
        "--image",
        fixtures()
            .join("images")
            .join(case["image"].as_str().unwrap())
            .to_str()
            .unwrap(),
        "--task",
        case["task"].as_str().unwrap(),
        "--max-new-tokens",
        &case["max_new_tokens"].to_string(),
        "--json",
    ]);
    cmd.args(extra);
    if !extra.contains(&"--dtype") {
        cmd.args(["--dtype", "fp32"]);
    }
    let text_input = case["text_input"].as_str().unwrap();
    if !text_input.is_empty() {
        cmd.args(["--text", text_input]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{dir}: florence2 run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The tiny2 fixture's BART decoder (LM head tied to the shared embedding) and its cross-attention K/V
/// over an `s`-row encoder output whose element `i` is `h(i)`: the decoder tests' deterministic setup.
/// f32 weights, so f32 KV caches and cross K/V.
pub fn tiny2_decoder(
    g: &std::sync::Arc<florence2_wasm::gpu::Device>,
    s: usize,
    h: impl Fn(usize) -> f32,
) -> (
    florence2_wasm::model::bart::Decoder,
    florence2_wasm::model::bart::CrossKv,
) {
    tiny2_decoder_kv(g, s, h, florence2_wasm::gpu::DType::F32)
}

/// [`tiny2_decoder`] with KV caches and cross K/V of element type `kv` (F32 or F16) on the same f32
/// weights.
pub fn tiny2_decoder_kv(
    g: &std::sync::Arc<florence2_wasm::gpu::Device>,
    s: usize,
    h: impl Fn(usize) -> f32,
    kv: florence2_wasm::gpu::DType,
) -> (
    florence2_wasm::model::bart::Decoder,
    florence2_wasm::model::bart::CrossKv,
) {
    use florence2_wasm::gpu::{Recorder, Tensor};
    use florence2_wasm::model::bart::Decoder;
    let (cfg, w) = florence2_wasm::weights::load_dir(g, &fixtures().join("models/tiny2")).unwrap();
    let t = &cfg.text;
    let shared = w
        .get(
            "model.language_model.shared.weight",
            &[t.vocab_size, t.d_model],
        )
        .unwrap();
    let mut dec = Decoder::new(
        t,
        w.pp("model.language_model.decoder"),
        shared.clone(),
        shared,
        None,
    )
    .unwrap();
    dec.set_kv_dtype(kv).unwrap();
    let h: Vec<f32> = (0..s * t.d_model).map(h).collect();
    let ht = Tensor::from_f32(g, &[1, s, t.d_model], &h, "enc").unwrap();
    let mut rec = Recorder::new(g);
    let cross = dec.cross_kv(&mut rec, &ht).unwrap();
    rec.submit().unwrap();
    (dec, cross)
}

/// Generation options of a fixture result (`kwargs` as passed to the reference's `generate`).
pub fn options_of(result: &Value, max_new: usize) -> GenerateOptions {
    let kw = &result["kwargs"];
    let id = |k: &str| kw[k].as_u64().map(|x| x as u32);
    GenerateOptions {
        max_new_tokens: max_new,
        no_repeat_ngram_size: kw["no_repeat_ngram_size"].as_u64().unwrap_or(0) as usize,
        forced_bos_token_id: id("forced_bos_token_id"),
        forced_eos_token_id: id("forced_eos_token_id"),
        eos_token_ids: vec![id("eos_token_id").unwrap()],
        decoder_start_token_id: id("decoder_start_token_id").unwrap(),
        num_beams: kw["num_beams"].as_u64().unwrap_or(1) as usize,
        length_penalty: kw["length_penalty"].as_f64().unwrap_or(1.0) as f32,
        early_stopping: match &kw["early_stopping"] {
            Value::Bool(false) => EarlyStopping::False,
            Value::String(s) if s == "never" => EarlyStopping::Never,
            _ => EarlyStopping::True,
        },
    }
}
