//! Helpers for the weights tests: a tiny config, synthetic checkpoints in each layout and dtype, and a
//! hand-written safetensors writer (so malformed files can be built too).
#![allow(dead_code)]

use florence2_wasm::config::tensors::expected_tensors;
use florence2_wasm::config::Florence2Config;

#[path = "../common/mod.rs"]
pub mod common;

#[allow(unused_imports)]
pub use common::{gpu, Rng};

/// Canonical tensors: (name, shape, values).
pub type Canon = Vec<(String, Vec<usize>, Vec<f32>)>;

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

use std::collections::BTreeMap;
use std::sync::Arc;

use florence2_wasm::gpu::readback::to_f32_blocking;
use florence2_wasm::gpu::Device;
use florence2_wasm::weights::{load_files, LoadOptions, MemFiles, Weights};

/// A config whose names are exactly those of the reference original->HF mapping (2 stages of depth 1,
/// 2 encoder and 2 decoder layers).
pub fn mapping_config_json() -> serde_json::Value {
    let mut v = tiny_config_json();
    v["vision_config"]["depths"] = serde_json::json!([1, 1]);
    v["text_config"]["encoder_layers"] = serde_json::json!(2);
    v["text_config"]["decoder_layers"] = serde_json::json!(2);
    v
}

/// The reference directory (`$FLORENCE2_REFERENCE_DIR`, else `../shared/reference` beside the crate).
/// Panics, with the path, when it is missing: inside the reference suite that is a failure.
#[cfg(feature = "reference-data")]
pub fn reference_dir() -> std::path::PathBuf {
    let p = match std::env::var_os("FLORENCE2_REFERENCE_DIR") {
        Some(d) => std::path::PathBuf::from(d),
        None => std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/reference"),
    };
    assert!(
        p.is_dir(),
        "the reference suite needs the reference data directory {} (set FLORENCE2_REFERENCE_DIR)",
        p.display()
    );
    p
}

/// A file of the reference directory (must exist).
#[cfg(feature = "reference-data")]
pub fn reference_file(rel: &str) -> std::path::PathBuf {
    let p = reference_dir().join(rel);
    assert!(p.exists(), "reference file {} is missing", p.display());
    p
}

/// The reference mapping `original -> HF-native`, read from the reference directory: only the reference
/// suite (`tests/reference/`, feature `reference-data`) has it; elsewhere this is a compile error.
#[cfg(feature = "reference-data")]
pub fn reference_mapping() -> BTreeMap<String, String> {
    let p = reference_file("key_mapping_original_to_hf_native.json");
    let text = std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("reference mapping {} is missing: {e}", p.display()));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["original_to_hf"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect()
}

/// HF-native -> original names (the reference mapping inverted).
#[cfg(feature = "reference-data")]
fn original_names() -> BTreeMap<String, String> {
    reference_mapping()
        .into_iter()
        .map(|(o, h)| (h, o))
        .collect()
}

/// Without the reference data there are no original names to build from: only the reference suite builds
/// the original/mlx variants (the committed fixtures `tiny*-orig`, `tiny*-mlx-bf16` cover those layouts
/// in the stand-alone tests).
#[cfg(not(feature = "reference-data"))]
fn original_names() -> BTreeMap<String, String> {
    panic!("original/mlx variants need the reference mapping: build them in tests/reference/ only")
}

/// Checkpoint naming/layout variants the tests build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    HfNative,
    /// Original names (from the reference mapping), raw `[C_last, D]` image projection, plus unused
    /// `vision_tower.norms.*` / `head.*` tensors, a zero `final_logits_bias` and an untied lm_head copy.
    Original,
    /// Original names with channels-last conv weights (mlx-community).
    Mlx,
}

/// Row-major 4-D permute for the test side (`out dim i = in dim perm[i]`).
pub fn permute4(x: &[f32], s: &[usize], perm: [usize; 4]) -> (Vec<f32>, Vec<usize>) {
    let os: Vec<usize> = perm.iter().map(|&p| s[p]).collect();
    let st = [s[1] * s[2] * s[3], s[2] * s[3], s[3], 1];
    let mut out = Vec::with_capacity(x.len());
    for a in 0..os[0] {
        for b in 0..os[1] {
            for c in 0..os[2] {
                for d in 0..os[3] {
                    let idx = [a, b, c, d];
                    let mut src = 0;
                    for i in 0..4 {
                        src += idx[i] * st[perm[i]];
                    }
                    out.push(x[src]);
                }
            }
        }
    }
    (out, os)
}

pub fn transpose2(x: &[f32], r: usize, c: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for i in 0..r {
        for j in 0..c {
            out[j * r + i] = x[i * c + j];
        }
    }
    out
}

/// Source tensors of a checkpoint variant built from canonical tensors (names from the reference
/// mapping for original/mlx). Returns the raw tensors in a shuffled-but-deterministic order.
pub fn variant_tensors(
    canon: &[(String, Vec<usize>, Vec<f32>)],
    variant: Variant,
    dt: Dt,
) -> Vec<RawTensor> {
    let inverse: BTreeMap<String, String> = if variant == Variant::HfNative {
        BTreeMap::new()
    } else {
        original_names()
    };
    let mut out = Vec::new();
    for (n, s, v) in canon {
        let (name, shape, vals) = match variant {
            Variant::HfNative => (n.clone(), s.clone(), v.clone()),
            _ => {
                let o = inverse
                    .get(n)
                    .unwrap_or_else(|| panic!("no original name for {n}"))
                    .clone();
                if o == "image_projection" {
                    (o, vec![s[1], s[0]], transpose2(v, s[0], s[1]))
                } else if s.len() == 4 && variant == Variant::Mlx {
                    let (p, ps) = permute4(v, s, [0, 2, 3, 1]);
                    (o, ps, p)
                } else {
                    (o, s.clone(), v.clone())
                }
            }
        };
        out.push(RawTensor::new(&name, dt, &shape, &vals));
    }
    if variant != Variant::HfNative {
        let c = canon
            .iter()
            .find(|(n, _, _)| n.ends_with("shared.weight"))
            .unwrap();
        out.push(RawTensor::new(
            "vision_tower.norms.1.weight",
            dt,
            &[12],
            &[3.0; 12],
        ));
        out.push(RawTensor::new(
            "vision_tower.head.weight",
            dt,
            &[2, 12],
            &[1.0; 24],
        ));
        out.push(RawTensor::new(
            "language_model.final_logits_bias",
            dt,
            &[1, c.1[0]],
            &vec![0.0; c.1[0]],
        ));
        out.push(RawTensor::new(
            "language_model.lm_head.weight",
            dt,
            &c.1,
            &c.2,
        ));
    }
    // Deterministic shuffle so file order differs from table order.
    let mut rng = Rng::new(99);
    for i in (1..out.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        out.swap(i, j);
    }
    out
}

/// A model directory in memory.
pub fn mem_model(config: &serde_json::Value, files: &[(&str, Vec<u8>)]) -> MemFiles {
    let mut m = MemFiles::new();
    m.insert("config.json", config.to_string().into_bytes());
    for (n, b) in files {
        m.insert(*n, b.clone());
    }
    m
}

pub fn load_mem(
    gpu: &Arc<Device>,
    files: &MemFiles,
) -> florence2_wasm::Result<(florence2_wasm::config::Florence2Config, Weights)> {
    pollster::block_on(load_files(
        gpu,
        files,
        LoadOptions::with_dtype(florence2_wasm::weights::WeightDType::Fp32),
    ))
}

/// Read every tensor back.
pub fn readback_all(gpu: &Arc<Device>, w: &Weights) -> BTreeMap<String, Vec<f32>> {
    w.names()
        .map(|n| {
            (
                n.to_owned(),
                to_f32_blocking(gpu, &w.get_any(n).unwrap()).unwrap(),
            )
        })
        .collect()
}

/// Stream `file` in chunks whose sizes come from `sizes` (cycled).
pub fn stream(
    cfg: &Florence2Config,
    file: &[u8],
    sizes: &[usize],
    known_len: bool,
) -> Result<Weights, florence2_wasm::Error> {
    let gpu = common::gpu();
    let mut asm = florence2_wasm::weights::Assembler::new(
        &gpu,
        cfg,
        LoadOptions::with_dtype(florence2_wasm::weights::WeightDType::Fp32),
    );
    let mut s = florence2_wasm::weights::StreamLoader::new(
        "model.safetensors",
        known_len.then_some(file.len() as u64),
    );
    let mut off = 0;
    let mut i = 0;
    while off < file.len() {
        let n = sizes[i % sizes.len()].min(file.len() - off);
        s.feed(&mut asm, &file[off..off + n])?;
        off += n;
        i += 1;
    }
    s.finish(&mut asm)?;
    asm.finish()
}

/// Any chunking (odd sizes, 3 bytes, the whole file, and 1 byte when `one_byte`) of one checkpoint
/// variant streams to exactly the ranged loader's tensors, which equal the canonical values rounded to
/// the source dtype.
pub fn check_any_chunking(
    gpu: &std::sync::Arc<Device>,
    cfg_json: &serde_json::Value,
    variant: Variant,
    dt: Dt,
    one_byte: bool,
) {
    let cfg = Florence2Config::from_json(cfg_json).unwrap();
    let canon = canonical_tensors(&cfg, 11);
    let mut rng = Rng::new(5);
    let odd: Vec<usize> = (0..64)
        .map(|_| 1 + (rng.next_u64() % 97) as usize)
        .collect();
    let file = write_safetensors(&variant_tensors(&canon, variant, dt), None);
    let (_, ranged) = load_mem(
        gpu,
        &mem_model(cfg_json, &[("model.safetensors", file.clone())]),
    )
    .unwrap();
    let want = readback_all(gpu, &ranged);
    let mut ways = vec![
        ("odd", odd),
        ("3 bytes", vec![3]),
        ("whole", vec![file.len()]),
    ];
    // 1-byte chunks (every element split) only where asked: it is slow on lavapipe.
    if one_byte {
        ways.push(("1 byte", vec![1]));
    }
    for (what, sizes) in ways {
        let w = stream(&cfg, &file, &sizes, what != "odd")
            .unwrap_or_else(|e| panic!("{variant:?} {what}: {e}"));
        let got = readback_all(gpu, &w);
        assert_eq!(got, want, "{variant:?} {dt:?} chunks {what}");
    }
    for (n, _, v) in &canon {
        let r: Vec<f32> = v.iter().map(|&x| dt.round(x)).collect();
        assert_eq!(want[n], r, "{variant:?} {n}");
    }
    eprintln!(
        "{variant:?} {dt:?}: {} bytes, streamed identically",
        file.len()
    );
}
