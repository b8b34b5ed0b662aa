//! The committed fixture checkpoints (`tests/fixtures/models/*`, made by `scripts/fixtures/make_fixtures.py`):
//! the original-layout and mlx-bf16 re-saves and the f16 shards load to exactly the HF-native f32
//! tensors (after the same bf16/f16 rounding), whichever loader (ranged or streamed) is used.
#![cfg(not(target_arch = "wasm32"))]

use crate::weights_util;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use florence2_wasm::config::tensors::expected_tensors;
use florence2_wasm::config::Florence2Config;
use florence2_wasm::gpu::readback;
use florence2_wasm::gpu::Device;
use florence2_wasm::weights::{
    is_dense_conv_weight, is_matrix_weight, load_dir, load_dir_with, temporal_cosine_table,
    Assembler, LoadOptions, StreamLoader, WeightDType, Weights, FINAL_LOGITS_BIAS,
};
use weights_util::*;

fn model_dir(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/models")
        .join(name);
    assert!(
        p.join("config.json").exists(),
        "fixture {} is missing",
        p.display()
    );
    p
}

fn load(gpu: &Arc<Device>, name: &str) -> (Florence2Config, Weights, BTreeMap<String, Vec<f32>>) {
    let (cfg, w) = load_dir(gpu, &model_dir(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let all = readback_all(gpu, &w);
    (cfg, w, all)
}

/// Tensors whose first dimension is the vocabulary: the original checkpoints have 1445 rows, the
/// HF-native conversion pads to 1472; the shared rows must agree.
fn is_vocab_sized(name: &str) -> bool {
    name == "model.language_model.shared.weight" || name == "lm_head.weight"
}

fn compare(
    tag: &str,
    got: &BTreeMap<String, Vec<f32>>,
    want: &BTreeMap<String, Vec<f32>>,
    round: fn(f32) -> f32,
    got_rows: Option<(usize, usize)>,
) -> usize {
    let mut n = 0;
    for (name, w) in want {
        let g = got.get(name).unwrap_or_else(|| panic!("{tag}: no {name}"));
        let w: Vec<f32> = w.iter().map(|&x| round(x)).collect();
        if is_vocab_sized(name) {
            if let Some((rows, d)) = got_rows {
                assert_eq!(g.len(), rows * d, "{tag} {name}");
                assert_eq!(g[..], w[..rows * d], "{tag} {name}");
                n += 1;
                continue;
            }
        }
        assert_eq!(g, &w, "{tag} {name}");
        n += 1;
    }
    n
}

fn ident(x: f32) -> f32 {
    x
}
fn bf16(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}
fn f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

#[test]
fn fixture_variants_load_to_the_hf_native_tensors() {
    let gpu = gpu();
    for base in ["tiny2", "tiny4"] {
        let (cfg, w, hf) = load(&gpu, base);
        // Every expected tensor is there, the head is tied.
        for (n, s) in expected_tensors(&cfg) {
            w.get(&n, &s).unwrap();
        }
        assert!(w.same_buffer("lm_head.weight", "model.language_model.shared.weight"));
        assert!(!w.has(FINAL_LOGITS_BIAS));

        // The stored temporal table equals the closed form (f32 evaluation in both; the exp/sin/cos
        // implementations may differ by an ulp, and angles reach 99 rad: ~99 * 2^-24 ~ 6e-6 in the angle).
        let t = "model.multi_modal_projector.visual_temporal_embed.pos_idx_to_embed";
        let shape = w.get_any(t).unwrap().shape().to_vec();
        let synth = temporal_cosine_table(shape[0], shape[1]);
        let (d, peak) = common::max_diff(&synth, &hf[t]);
        eprintln!("{base}: synthesized temporal table vs stored: max |diff| {d:.2e} (peak {peak})");
        assert!(d <= 2e-5, "{d}");

        let d_model = cfg.text.d_model;
        for (variant, round) in [("orig", ident as fn(f32) -> f32), ("mlx-bf16", bf16)] {
            let name = format!("{base}-{variant}");
            let (ocfg, ow, got) = load(&gpu, &name);
            let v = ocfg.text.vocab_size;
            assert!(
                !ow.has(FINAL_LOGITS_BIAS),
                "{name}: zero bias must be dropped"
            );
            let n = compare(&name, &got, &hf, round, Some((v, d_model)));
            eprintln!(
                "{name}: {n} tensors equal to {base} (vocab {v} rows of {})",
                cfg.text.vocab_size
            );
        }
    }
    let (_, _, hf4) = load(&gpu, "tiny4");
    let (_, w, sharded) = load(&gpu, "tiny4-f16-sharded");
    let n = compare("tiny4-f16-sharded", &sharded, &hf4, f16, None);
    assert!(w.same_buffer("lm_head.weight", "model.language_model.shared.weight"));
    eprintln!("tiny4-f16-sharded: {n} tensors equal to f16(tiny4)");
}

/// Streamed in random chunks (which split f16 pairs and quantized rows anywhere) == ranged, for every
/// resident dtype.
#[test]
fn fixture_streamed_equals_ranged() {
    let gpu = gpu();
    // The quantized ones (made by scripts/fixtures/convert_checkpoint.py) too: their rows are gathered across
    // chunks, then copied or dequantized.
    for (name, dtype) in [
        "tiny2-mlx-bf16",
        "tiny4-f16-sharded",
        "tiny2-q8",
        "tiny2-orig-q4-sharded",
    ]
    .into_iter()
    .flat_map(|n| WeightDType::ALL.into_iter().map(move |d| (n, d)))
    {
        let dir = model_dir(name);
        let (cfg, w) = load_dir_with(&gpu, &dir, LoadOptions::with_dtype(dtype)).unwrap();
        let want = readback_all(&gpu, &w);
        drop(w);
        let mut asm = Assembler::new(&gpu, &cfg, LoadOptions::with_dtype(dtype));
        let index = std::fs::read(dir.join("model.safetensors.index.json")).ok();
        let shards: Vec<(String, Vec<String>)> = match &index {
            Some(b) => {
                let idx = florence2_wasm::weights::CheckpointIndex::parse(b).unwrap();
                asm.set_layout(florence2_wasm::weights::detect_layout(
                    idx.weight_map.keys().map(String::as_str),
                ));
                idx.shards
                    .iter()
                    .map(|s| (s.clone(), idx.names_in(s).map(str::to_owned).collect()))
                    .collect()
            }
            None => vec![("model.safetensors".into(), vec![])],
        };
        let mut rng = Rng::new(17);
        for (shard, names) in shards {
            let bytes = std::fs::read(dir.join(&shard)).unwrap();
            let mut s = StreamLoader::new(&shard, Some(bytes.len() as u64)).expect_names(names);
            let mut off = 0;
            while off < bytes.len() {
                let n = (1 + (rng.next_u64() % 4099) as usize).min(bytes.len() - off);
                s.feed(&mut asm, &bytes[off..off + n]).unwrap();
                off += n;
            }
            s.finish(&mut asm).unwrap();
        }
        let w = asm.finish().unwrap();
        assert_eq!(readback_all(&gpu, &w), want, "{name} {dtype}");
        eprintln!("{name} {dtype}: streamed in random chunks of 1..4099 bytes == ranged");
    }
}

/// Every fixture (HF-native f32, original layout, mlx bf16 channels-last, f16 shards) loads into every
/// resident dtype: matrix weights in the dtype's format (f16 where rows are not whole 32-weight blocks),
/// everything else f32, and each value equal to the host's conversion of the f32 load (f16 rounding, or
/// quantize + dequantize of the same rows). The engine's weight bytes equal the tensors' bytes.
#[test]
fn fixtures_load_into_every_dtype() {
    use florence2_wasm::gpu::{DType, DeviceOptions, MemKind};
    use florence2_wasm::quant;
    // A device of its own: the memory counter is per device and the other tests load concurrently.
    let gpu = pollster::block_on(Device::new(DeviceOptions::default())).unwrap();
    for name in [
        "tiny2",
        "tiny2-orig",
        "tiny2-mlx-bf16",
        "tiny4",
        "tiny4-orig",
        "tiny4-mlx-bf16",
        "tiny4-f16-sharded",
    ] {
        let (_, _, f32s) = load(&gpu, name);
        for dtype in [WeightDType::Fp16, WeightDType::Q8, WeightDType::Q4] {
            let before = gpu.memory().weights_bytes;
            let (_, w) = load_dir_with(&gpu, &model_dir(name), LoadOptions::with_dtype(dtype))
                .unwrap_or_else(|e| panic!("{name} {dtype}: {e}"));
            assert_eq!(
                gpu.memory().weights_bytes - before,
                w.byte_size(),
                "{name} {dtype}: counted weight bytes"
            );
            let (mut packed, mut quantized) = (0, 0);
            for n in w.names() {
                let t = w.get_any(n).unwrap();
                assert_eq!(t.mem_kind(), MemKind::Weights, "{name} {n}");
                let want = &f32s[n];
                let got = readback::to_f32_blocking(&gpu, &t).unwrap();
                let k = t.dim(-1);
                // The original layout's transposed image_projection (also in the mlx re-saves, which
                // keep the original names) is permuted on the GPU by the f32 layout kernels.
                let hf_native = matches!(name, "tiny2" | "tiny4" | "tiny4-f16-sharded");
                let permuted = !hf_native && n.ends_with("image_projection.weight");
                // The mlx re-saves store convolutions channels-last: permuted on the GPU, so f32.
                let conv_permuted = name.contains("mlx");
                let expect_dtype = if is_matrix_weight(n, t.shape()) && !permuted {
                    dtype.matrix_dtype(k)
                } else if is_dense_conv_weight(n, t.shape()) && !conv_permuted {
                    dtype.conv_dtype()
                } else {
                    DType::F32
                };
                assert_eq!(t.dtype(), expect_dtype, "{name} {dtype} {n}");
                let host: Vec<f32> = match expect_dtype.qformat() {
                    Some(fmt) => {
                        let mut bytes = Vec::new();
                        quant::quantize_rows(fmt, k, want, &mut bytes).unwrap();
                        quantized += 1;
                        quant::dequantize_rows(fmt, k, &bytes).unwrap()
                    }
                    None if expect_dtype == DType::F16 => {
                        packed += 1;
                        want.iter()
                            .map(|&x| half::f16::from_f32(x).to_f32())
                            .collect()
                    }
                    None => want.clone(),
                };
                assert_eq!(got, host, "{name} {dtype} {n}");
            }
            eprintln!(
                "{name} {dtype}: {packed} f16 + {quantized} quantized matrices; {} weight bytes",
                w.byte_size()
            );
            assert!(
                packed + quantized > 0,
                "{name} {dtype}: no matrix converted"
            );
            if dtype != WeightDType::Fp16 {
                assert!(quantized > 0, "{name} {dtype}: nothing quantized");
            }
        }
    }
}
