//! Decode-step timing on a base-shaped BART decoder with random weights (d_model 768, 6 layers, 12
//! heads, ffn 3072, vocab 51328, 590 encoder tokens). Ignored by default (it allocates ~400 MB and takes
//! a while on lavapipe): `cargo test --release --test text_perf -- --ignored --nocapture`.
#![cfg(not(target_arch = "wasm32"))]
mod common;

use std::time::Instant;

use common::{gpu, Rng};
use florence2_wasm::gpu::{readback, DType, Recorder, Tensor};
use florence2_wasm::model::bart::Decoder;
use florence2_wasm::model::config::TextConfig;
use florence2_wasm::model::generate::{self, GenerateOptions};
use florence2_wasm::ops;
use florence2_wasm::weights::Weights;

fn base_text_config() -> TextConfig {
    TextConfig {
        d_model: 768,
        encoder_layers: 6,
        decoder_layers: 6,
        encoder_attention_heads: 12,
        decoder_attention_heads: 12,
        encoder_ffn_dim: 3072,
        decoder_ffn_dim: 3072,
        vocab_size: 51328,
        max_position_embeddings: 1024,
        bos_token_id: 0,
        pad_token_id: 1,
        eos_token_id: 2,
        decoder_start_token_id: 2,
        forced_bos_token_id: Some(0),
        forced_eos_token_id: Some(2),
        scale_embedding: false,
        activation_function: "gelu".into(),
    }
}

#[test]
#[ignore]
fn base_decode_step_time() {
    let g = gpu();
    let cfg = base_text_config();
    let (d, f, v) = (cfg.d_model, cfg.decoder_ffn_dim, cfg.vocab_size);
    let mut rng = Rng::new(7);
    let mut w = Weights::new();
    let mut put = |name: String, shape: &[usize], scale: f32| {
        let n: usize = shape.iter().product();
        w.insert(
            name,
            Tensor::from_f32(&g, shape, &rng.vec(n, scale), "w").unwrap(),
        );
    };
    let p = "model.language_model.decoder";
    put(format!("{p}.embed_positions.weight"), &[1026, d], 0.1);
    put(format!("{p}.layernorm_embedding.weight"), &[d], 1.0);
    put(format!("{p}.layernorm_embedding.bias"), &[d], 0.1);
    for l in 0..cfg.decoder_layers {
        for a in ["self_attn", "encoder_attn"] {
            for pr in ["q_proj", "k_proj", "v_proj", "out_proj"] {
                put(format!("{p}.layers.{l}.{a}.{pr}.weight"), &[d, d], 0.036);
                put(format!("{p}.layers.{l}.{a}.{pr}.bias"), &[d], 0.01);
            }
        }
        for ln in [
            "self_attn_layer_norm",
            "encoder_attn_layer_norm",
            "final_layer_norm",
        ] {
            put(format!("{p}.layers.{l}.{ln}.weight"), &[d], 1.0);
            put(format!("{p}.layers.{l}.{ln}.bias"), &[d], 0.1);
        }
        put(format!("{p}.layers.{l}.fc1.weight"), &[f, d], 0.036);
        put(format!("{p}.layers.{l}.fc1.bias"), &[f], 0.01);
        put(format!("{p}.layers.{l}.fc2.weight"), &[d, f], 0.018);
        put(format!("{p}.layers.{l}.fc2.bias"), &[d], 0.01);
    }
    put("shared".into(), &[v, d], 0.05);
    let shared = w.get("shared", &[v, d]).unwrap();
    let dec = Decoder::new(&cfg, w.pp(p), shared.clone(), shared.clone(), None).unwrap();
    let s = 590;
    let enc = Tensor::from_f32(&g, &[1, s, d], &rng.vec(s * d, 1.0), "enc").unwrap();
    let mut rec = Recorder::new(&g);
    let cross = dec.cross_kv(&mut rec, &enc).unwrap();
    rec.submit().unwrap();
    readback::to_f32_blocking(&g, &cross.k[0]).unwrap();

    // LM head alone (1 x 768 @ 768 x 51328), the largest single op of a step.
    let x = Tensor::from_f32(&g, &[1, d], &rng.vec(d, 1.0), "x").unwrap();
    let logits = Tensor::zeros(&g, &[1, v], DType::F32, "logits").unwrap();
    let mut lm = Vec::new();
    for _ in 0..6 {
        let t = Instant::now();
        let mut rec = Recorder::new(&g);
        ops::matmul::linear(&mut rec, &x, &shared, None, ops::matmul::Act::None, &logits).unwrap();
        let pnd = rec.read_back(&x);
        rec.submit().unwrap();
        pollster::block_on(pnd.bytes(&g)).unwrap();
        lm.push(t.elapsed().as_secs_f64() * 1e3);
    }

    // Greedy steps (no bans: one argmax readback per step).
    let opts = GenerateOptions {
        max_new_tokens: 21,
        no_repeat_ngram_size: 0,
        forced_bos_token_id: None,
        forced_eos_token_id: None,
        eos_token_ids: vec![u32::MAX],
        decoder_start_token_id: 2,
        num_beams: 1,
        length_penalty: 1.0,
        early_stopping: Default::default(),
    };
    // Warm-up (pipeline creation), then the timed run.
    pollster::block_on(generate::greedy(
        &dec,
        &g,
        &cross,
        &GenerateOptions {
            max_new_tokens: 2,
            ..opts.clone()
        },
        &|| false,
    ))
    .unwrap();
    let t = Instant::now();
    let ids = pollster::block_on(generate::greedy(&dec, &g, &cross, &opts, &|| false)).unwrap();
    let total = t.elapsed().as_secs_f64() * 1e3;
    lm.sort_by(f64::total_cmp);
    eprintln!(
        "base decoder: {} steps in {total:.0} ms = {:.1} ms/step; LM head alone {:.1} ms (median of 6)",
        ids.len() - 1,
        total / (ids.len() - 1) as f64,
        lm[lm.len() / 2]
    );
}
