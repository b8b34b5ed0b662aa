//! Checkpoint layouts: the original->HF naming rules against the reference mapping, and HF-native,
//! original and mlx-community checkpoints in f32/f16/bf16 loading to the same canonical f32 tensors.

use crate::weights_util::*;
use florence2_wasm::config::tensors::expected_tensors;
use florence2_wasm::config::Florence2Config;
use florence2_wasm::weights::names::{canonical_name, original_to_canonical};
use florence2_wasm::weights::{detect_layout, Layout, FINAL_LOGITS_BIAS};

#[test]
fn rules_reproduce_reference_mapping() {
    let m = reference_mapping();
    assert!(
        m.len() > 100,
        "reference mapping has only {} entries",
        m.len()
    );
    let mut bad = Vec::new();
    for (orig, hf) in &m {
        let got = original_to_canonical(orig);
        if got.as_deref() != Some(hf.as_str()) {
            bad.push(format!("{orig}: got {got:?}, want {hf}"));
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {} entries differ:\n{}",
        bad.len(),
        m.len(),
        bad.join("\n")
    );
    assert_eq!(
        detect_layout(m.keys().map(String::as_str)),
        Layout::Original
    );
    assert_eq!(
        detect_layout(m.values().map(String::as_str)),
        Layout::HfNative
    );
    // HF-native names pass through unchanged.
    for hf in m.values() {
        assert_eq!(
            canonical_name(Layout::HfNative, hf).as_deref(),
            Some(hf.as_str())
        );
    }
    eprintln!("{} reference entries reproduced", m.len());
}

#[test]
fn unused_original_tensors_are_ignored() {
    for n in [
        "vision_tower.norms.3.weight",
        "vision_tower.head.weight",
        "vision_tower.blocks.0.0.spatial_block.window_attn.fn.relative_bias",
        "vision_tower.convs.x.proj.weight",
        "something.else",
    ] {
        assert_eq!(original_to_canonical(n), None, "{n}");
    }
    assert_eq!(
        original_to_canonical("language_model.final_logits_bias").as_deref(),
        Some(FINAL_LOGITS_BIAS)
    );
    assert_eq!(
        original_to_canonical("language_model.lm_head.weight").as_deref(),
        Some("lm_head.weight")
    );
}

#[test]
fn mapping_config_covers_reference_exactly() {
    // The test config's table is exactly the reference mapping's HF-native side.
    let cfg = Florence2Config::from_json(&mapping_config_json()).unwrap();
    let mut table: Vec<String> = expected_tensors(&cfg).into_iter().map(|(n, _)| n).collect();
    let mut refs: Vec<String> = reference_mapping().into_values().collect();
    table.sort();
    refs.sort();
    assert_eq!(table, refs);
}

#[test]
fn all_layouts_and_dtypes_load_identically() {
    let gpu = gpu();
    let cfg_json = mapping_config_json();
    let cfg = Florence2Config::from_json(&cfg_json).unwrap();
    let canon = canonical_tensors(&cfg, 7);
    let mut n_checked = 0;
    for variant in [Variant::HfNative, Variant::Original, Variant::Mlx] {
        for dt in [Dt::F32, Dt::F16, Dt::BF16] {
            let raw = variant_tensors(&canon, variant, dt);
            let files = mem_model(
                &cfg_json,
                &[("model.safetensors", write_safetensors(&raw, None))],
            );
            let (_, w) =
                load_mem(&gpu, &files).unwrap_or_else(|e| panic!("{variant:?} {dt:?}: {e}"));
            let got = readback_all(&gpu, &w);
            for (n, _, v) in &canon {
                let want: Vec<f32> = v.iter().map(|&x| dt.round(x)).collect();
                assert_eq!(got[n], want, "{variant:?} {dt:?} {n}");
                n_checked += 1;
            }
            if variant == Variant::HfNative {
                assert!(!w.has(FINAL_LOGITS_BIAS));
            } else {
                // All zeros: dropped (the model adds it only when it matters).
                assert!(!w.has(FINAL_LOGITS_BIAS), "{variant:?}");
                assert!(!w
                    .names()
                    .any(|n| n.contains("norms")
                        || n.contains("head.weight") && n != "lm_head.weight"));
            }
            let shared = &got["model.language_model.shared.weight"];
            assert_eq!(&got["lm_head.weight"], shared, "{variant:?} {dt:?} lm_head");
        }
    }
    eprintln!("{n_checked} tensors compared exactly across 3 layouts x 3 dtypes");
}

#[test]
fn mlx_metadata_resolves_ambiguous_conv_shapes() {
    // in_channels 3 and a 3x3 first patch: (O, 3, 3, 3) reads the same either way; the mlx metadata
    // (or any unambiguous channels-last conv in the same file, e.g. a depthwise one) decides.
    let gpu = gpu();
    let mut cfg_json = mapping_config_json();
    cfg_json["vision_config"]["patch_size"] = serde_json::json!([3, 3]);
    cfg_json["vision_config"]["patch_padding"] = serde_json::json!([1, 1]);
    let cfg = Florence2Config::from_json(&cfg_json).unwrap();
    let canon = canonical_tensors(&cfg, 8);
    let raw = variant_tensors(&canon, Variant::Mlx, Dt::F32);
    for meta in [Some(serde_json::json!({"format": "mlx"})), None] {
        let files = mem_model(
            &cfg_json,
            &[("model.safetensors", write_safetensors(&raw, meta.clone()))],
        );
        let (_, w) = load_mem(&gpu, &files).unwrap();
        let got = readback_all(&gpu, &w);
        let (n, _, v) = canon
            .iter()
            .find(|(n, _, _)| n == "model.vision_tower.convs.0.conv.weight")
            .unwrap();
        // With the metadata, or without it from the file's unambiguous depthwise convs.
        assert_eq!(&got[n], v, "meta {meta:?}: channels-last must be undone");
    }
}

#[test]
fn nonzero_final_logits_bias_is_kept() {
    let gpu = gpu();
    let cfg_json = mapping_config_json();
    let cfg = Florence2Config::from_json(&cfg_json).unwrap();
    let canon = canonical_tensors(&cfg, 9);
    let mut raw = variant_tensors(&canon, Variant::Original, Dt::BF16);
    let v = cfg.text.vocab_size;
    let bias: Vec<f32> = (0..v).map(|i| i as f32 * 0.25 - 3.0).collect();
    let t = raw
        .iter_mut()
        .find(|t| t.name == "language_model.final_logits_bias")
        .unwrap();
    *t = RawTensor::new(&t.name.clone(), Dt::BF16, &[1, v], &bias);
    let (_, w) = load_mem(
        &gpu,
        &mem_model(
            &cfg_json,
            &[("model.safetensors", write_safetensors(&raw, None))],
        ),
    )
    .unwrap();
    let got = readback_all(&gpu, &w);
    assert_eq!(got[FINAL_LOGITS_BIAS], bias);
    // The original checkpoint's explicit lm_head is its own buffer (not tied).
    assert!(!w.same_buffer("lm_head.weight", "model.language_model.shared.weight"));
}
