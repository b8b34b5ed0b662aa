//! Loading synthetic HF-native checkpoints from disk (`load_dir`): every tensor reads back exactly, the
//! LM head is tied when absent, the temporal table is synthesized when absent.
#![cfg(not(target_arch = "wasm32"))]

use crate::weights_util;

use std::path::PathBuf;

use florence2_wasm::gpu::readback::to_f32_blocking;
use florence2_wasm::weights::{load_dir, temporal_cosine_table};
use weights_util::*;

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("f2w-weights-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn hf_native_f32_roundtrip() {
    let gpu = gpu();
    let cfg = tiny_config();
    let tensors = canonical_tensors(&cfg, 1);
    let raw: Vec<RawTensor> = tensors
        .iter()
        .map(|(n, s, v)| RawTensor::new(n, Dt::F32, s, v))
        .collect();
    let dir = temp_dir("hf-f32");
    std::fs::write(dir.join("config.json"), tiny_config_json().to_string()).unwrap();
    std::fs::write(dir.join("model.safetensors"), write_safetensors(&raw, None)).unwrap();

    let (cfg2, w) = load_dir(&gpu, &dir).unwrap();
    assert_eq!(cfg2, cfg);
    for (n, s, v) in &tensors {
        let t = w.get(n, s).unwrap();
        let got = to_f32_blocking(&gpu, &t).unwrap();
        assert_eq!(&got, v, "{n}");
    }
    // Tied head: same values as the shared embedding.
    let v = cfg.text.vocab_size;
    let d = cfg.text.d_model;
    let head = w.get("lm_head.weight", &[v, d]).unwrap();
    let shared = w
        .get("model.language_model.shared.weight", &[v, d])
        .unwrap();
    assert_eq!(
        to_f32_blocking(&gpu, &head).unwrap(),
        to_f32_blocking(&gpu, &shared).unwrap()
    );
    assert!(w.same_buffer("lm_head.weight", "model.language_model.shared.weight"));
    // Views.
    let vt = w.pp("model").pp("vision_tower");
    assert!(vt.has("convs.0.conv.weight"));
    assert!(!vt.has("convs.9.conv.weight"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn temporal_table_synthesized_when_absent() {
    let gpu = gpu();
    let cfg = tiny_config();
    let name = "model.multi_modal_projector.visual_temporal_embed.pos_idx_to_embed";
    let raw: Vec<RawTensor> = canonical_tensors(&cfg, 2)
        .iter()
        .filter(|(n, _, _)| n != name)
        .map(|(n, s, v)| RawTensor::new(n, Dt::F32, s, v))
        .collect();
    let dir = temp_dir("no-temporal");
    std::fs::write(dir.join("config.json"), tiny_config_json().to_string()).unwrap();
    std::fs::write(dir.join("model.safetensors"), write_safetensors(&raw, None)).unwrap();
    let (_, w) = load_dir(&gpu, &dir).unwrap();
    let t = w.get(name, &[4, 12]).unwrap();
    let got = to_f32_blocking(&gpu, &t).unwrap();
    assert_eq!(got, temporal_cosine_table(4, 12));
    // Row 0 is sin(0), cos(0), ... = 0, 1, 0, 1.
    assert_eq!(&got[..4], &[0.0, 1.0, 0.0, 1.0]);
    let _ = std::fs::remove_dir_all(&dir);
}
