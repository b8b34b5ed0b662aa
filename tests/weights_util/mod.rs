//! Helpers for the weights tests: a tiny config, synthetic checkpoints in each layout and dtype, and a
//! hand-written safetensors writer (so malformed files can be built too).
#![allow(dead_code)]

use florence2_wasm::model::config::Florence2Config;
use florence2_wasm::weights::expected_tensors;

#[path = "../common/mod.rs"]
pub mod common;

pub use common::{gpu, Rng};

/// A tiny two-stage config (HF-native spelling).
pub fn tiny_config_json() -> serde_json::Value {
    serde_json::json!({
        "model_type": "florence2",
        "image_token_id": 39,
        "projection_dim": 16,
        "text_config": {"d_model": 16, "encoder_layers": 1, "decoder_layers": 2,
            "encoder_attention_heads": 2, "decoder_attention_heads": 2,
            "encoder_ffn_dim": 24, "decoder_ffn_dim": 32, "vocab_size": 40,
            "max_position_embeddings": 12},
        "vision_config": {"embed_dim": [8, 12], "depths": [1, 2],
            "num_heads": [2, 2], "num_groups": [2, 3],
            "patch_size": [7, 3], "patch_stride": [4, 2],
            "patch_padding": [3, 1], "patch_prenorm": [false, true],
            "window_size": 2, "projection_dim": 16, "max_position_embeddings": 5,
            "max_temporal_embeddings": 4}
    })
}

pub fn tiny_config() -> Florence2Config {
    Florence2Config::from_json(&tiny_config_json()).unwrap()
}

/// Source element type for synthetic files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dt {
    F32,
    F16,
    BF16,
}

impl Dt {
    pub fn name(self) -> &'static str {
        match self {
            Dt::F32 => "F32",
            Dt::F16 => "F16",
            Dt::BF16 => "BF16",
        }
    }
    pub fn encode(self, v: &[f32]) -> Vec<u8> {
        match self {
            Dt::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Dt::F16 => v
                .iter()
                .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                .collect(),
            Dt::BF16 => v
                .iter()
                .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                .collect(),
        }
    }
    /// The value the loader must produce from `x` stored in this dtype.
    pub fn round(self, x: f32) -> f32 {
        match self {
            Dt::F32 => x,
            Dt::F16 => half::f16::from_f32(x).to_f32(),
            Dt::BF16 => half::bf16::from_f32(x).to_f32(),
        }
    }
}

/// One tensor of a synthetic file: name, dtype string, shape, raw bytes.
#[derive(Clone, Debug)]
pub struct RawTensor {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

impl RawTensor {
    pub fn new(name: &str, dt: Dt, shape: &[usize], values: &[f32]) -> Self {
        RawTensor {
            name: name.to_owned(),
            dtype: dt.name().to_owned(),
            shape: shape.to_vec(),
            bytes: dt.encode(values),
        }
    }
}

/// Serialize tensors in the given order (data laid out in that order), optional metadata.
pub fn write_safetensors(tensors: &[RawTensor], metadata: Option<serde_json::Value>) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    if let Some(m) = metadata {
        header.insert("__metadata__".into(), m);
    }
    let mut off = 0usize;
    for t in tensors {
        header.insert(
            t.name.clone(),
            serde_json::json!({"dtype": t.dtype, "shape": t.shape,
                "data_offsets": [off, off + t.bytes.len()]}),
        );
        off += t.bytes.len();
    }
    let mut h = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    for t in tensors {
        out.extend_from_slice(&t.bytes);
    }
    out
}

/// Build a file from a raw JSON header and data bytes.
pub fn raw_file(header_json: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header_json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header_json.as_bytes());
    out.extend_from_slice(data);
    out
}

/// Canonical tensors (name, shape, f32 values) for a config, seeded. Values are exactly representable in
/// bf16 when `bf16_exact` (so every dtype round-trips identically).
pub fn canonical_tensors(cfg: &Florence2Config, seed: u64) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let mut rng = Rng::new(seed);
    expected_tensors(cfg)
        .into_iter()
        .map(|(n, s)| {
            let numel: usize = s.iter().product();
            let v = rng.vec(numel, 1.0);
            (n, s, v)
        })
        .collect()
}
