//! Model benchmark: `<CAPTION>` at 768x768 with 20 new tokens on a base-shaped random checkpoint, phase by
//! phase, beside PyTorch on the same checkpoint and the same cores when the Python reference is installed.
//!
//! `cargo bench --bench model` (under `cargo test --all-targets`, which passes no `--bench`, it does
//! nothing). What it does:
//! 1. Makes (once; reused when present) a Florence-2-base-shaped checkpoint with seeded random values in the
//!    HF-native layout, f32 and f16, under `target/bench-model/base-{f32,f16}/` (`MODEL_BENCH_DIR`
//!    overrides the root): `model.safetensors` (names and shapes from `config::tensors::expected_tensors`
//!    on the embedded base config), `config.json`, `preprocessor_config.json` (768x768),
//!    `generation_config.json`.
//!    No tokenizer: the model is driven with the `<CAPTION>` prompt ids directly. No torch needed.
//! 2. Measures the kernel ceiling in the same run: the best `ops::matmul::linear` variant on 2304x512x2048
//!    (DaViT stage 2 MLP) and 585x768x3072 (encoder FFN), and the GPU copy bandwidth.
//! 3. Per checkpoint dtype: `weights::load_dir` (time, RSS), then one cold end-to-end pass (first dtype
//!    only: `encode` + greedy, kernel compilation included), then a warm pass phase by phase, one
//!    submit per phase, each waited for: preprocess (CPU), vision (DaViT), projector, encoder (prompt
//!    embedding + 6 layers), cross K/V, each decode step (embedding .. LM head + argmax + 4-byte
//!    readback), and beam-shaped steps (3 rows, top-6 readback, cache reorder). Then (first dtype) the
//!    DaViT block ops one by one, per stage. Prints each
//!    phase's time, FLOPs / time beside the GEMM ceiling, the decode steps' weight-read bandwidth beside
//!    the copy bandwidth, and the peak RSS per phase (lavapipe's "GPU memory" is host memory, so RSS
//!    counts weights + activations; the weights' GPU bytes are also printed).
//! 4. When `python3 -c "import torch, transformers"` works, runs `scripts/bench/reference_model.py` on the
//!    f32 checkpoint (2 threads) and prints our / PyTorch per phase.
//!
//! Environment: `MODEL_BENCH_DEVICE` (gpu, the default: the wgpu adapter; cpu: the CPU backend; auto),
//! `MODEL_BENCH_TUNING` (auto|off|exhaustive, default off: the static kernel choices; run
//! twice to compare), `MODEL_BENCH_TUNING_BUDGET_MS` (auto's budget; default a load's, `none`: every
//! class), `MODEL_BENCH_COMPARE=N` (with tuning on: N alternating end-to-end rounds static vs tuned in
//! one process, the fair comparison on a loaded machine), `MODEL_BENCH_DTYPES` (checkpoint dtypes, default `f32`), `MODEL_BENCH_RESIDENT` (resident
//! weight dtypes each checkpoint is loaded as, default `fp32,fp16,q8,q4`: a row each in the final
//! side-by-side table with weight bytes, engine-counted peak GPU bytes, phase times, decode ms per step
//! and weight bytes read per step), `MODEL_BENCH_TOKENS` (default 20),
//! `MODEL_BENCH_NO_REF=1` skips PyTorch, `MODEL_BENCH_COLD=0` skips the cold end-to-end pass,
//! `MODEL_BENCH_BREAKDOWN=0` skips the per-op DaViT breakdown (first dtype only; GPU only),
//! `MODEL_BENCH_REUSE=0` skips the image-encoding reuse ratio (first dtype only: a `<CAPTION>` task from
//! the image vs later tasks on its kept features, same run),
//! `MODEL_BENCH_TOKENIZER=<florence2 tokenizer.json>` checks the hard-coded prompt ids against it,
//! `MODEL_BENCH_STEP_ROUNDS=N` (default 3; 0 skips): at the end, every resident dtype's decode step
//! again with all models loaded and the dtypes alternating round by round (greedy and beam-3 through
//! `generate`'s planned steps, wall and CPU time per step, ratios to the first dtype): the side-by-side
//! decode figures, which the phase table above (one dtype after the other) cannot give on a shared
//! machine.
//!
//! `MODEL_BENCH_MEMORY=1` measures only the GPU memory the engine counts, per resident dtype (the
//! docs/performance.md's table): one request's peak for `<CAPTION>` and `<OD>` at 768x768 with 3 beams and the
//! default `max_new_tokens` 1024, as `Pipeline::run_task` runs it (pixels uploaded into the vision
//! arena, DaViT + projector, encoder + cross K/V, encoder input/output and image features released,
//! beam search), phase by phase. Every
//! buffer of a request is allocated before or at its first decode steps (the KV caches for the whole
//! `max_new_tokens` up front, the beam reorder spare on the first reorder), so the search is cancelled
//! after `MODEL_BENCH_MEMORY_STEPS` (default 4) steps: the peak is that of the whole request, at a
//! fraction of the time. Prints where the decode-phase bytes are (KV caches, cross K/V, ...).
//! `MODEL_BENCH_MEMORY_MODEL=large` does the same on a Florence-2-large-shaped checkpoint
//! (`target/bench-model/large-f32/`, 3.1 GB). `MODEL_BENCH_KV=f32` keeps the decoder's KV caches and
//! cross K/V in f32 for every resident dtype (the default is f16 for fp16/q8/q4: `Decoder::kv_dtype`), to
//! compare both in one build.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

#[path = "util.rs"]
mod util;
use util::cpu_secs;

use florence2_wasm::config::tensors::{davit_mlp_hidden, expected_tensors};
use florence2_wasm::config::Florence2Config;
use florence2_wasm::gpu::tune;
use florence2_wasm::gpu::QFormat;
use florence2_wasm::gpu::{staging_buffer, DType, Device, DeviceOptions, Recorder, Tensor};
use florence2_wasm::model::florence2::Florence2;
use florence2_wasm::model::workloads;
use florence2_wasm::ops;
use florence2_wasm::ops::matmul::{Act, LinearVariant};
use florence2_wasm::pipeline::{open_device, DeviceChoice};
use florence2_wasm::processor::image::{preprocess, ImageProcessorConfig};
use florence2_wasm::weights::{self, temporal_cosine_table, WeightDType};

/// Florence-2-base, HF-native (`transformers` 5.24 `config.json` of the base model).
const BASE_CONFIG: &str = r#"{
  "architectures": ["Florence2ForConditionalGeneration"],
  "dtype": "float32",
  "image_token_id": 51289,
  "is_encoder_decoder": true,
  "model_type": "florence2",
  "text_config": {
    "activation_dropout": 0.1, "activation_function": "gelu", "attention_dropout": 0.1,
    "bos_token_id": 0, "classifier_dropout": 0.0, "d_model": 768, "decoder_attention_heads": 12,
    "decoder_ffn_dim": 3072, "decoder_layerdrop": 0.0, "decoder_layers": 6, "decoder_start_token_id": 2,
    "dropout": 0.1, "encoder_attention_heads": 12, "encoder_ffn_dim": 3072, "encoder_layerdrop": 0.0,
    "encoder_layers": 6, "eos_token_id": 2, "forced_eos_token_id": 2, "init_std": 0.02,
    "is_decoder": false, "max_position_embeddings": 1024, "model_type": "bart", "pad_token_id": 1,
    "scale_embedding": false, "tie_word_embeddings": true, "use_cache": true, "vocab_size": 51328
  },
  "tie_word_embeddings": true,
  "transformers_version": "5.24.0",
  "vision_config": {
    "activation_function": "gelu", "depths": [1, 1, 9, 1], "drop_path_rate": 0.1,
    "embed_dim": [128, 256, 512, 1024], "in_channels": 3, "initializer_range": 0.02,
    "max_position_embeddings": 50, "max_temporal_embeddings": 100, "mlp_ratio": 4.0,
    "model_type": "florence_vision", "num_groups": [4, 8, 16, 32], "num_heads": [4, 8, 16, 32],
    "patch_padding": [3, 1, 1, 1], "patch_prenorm": [false, true, true, true],
    "patch_size": [7, 3, 3, 3], "patch_stride": [4, 2, 2, 2], "projection_dim": 768,
    "qkv_bias": true, "window_size": 12
  }
}"#;

const PREPROCESSOR_CONFIG: &str = r#"{
  "do_normalize": true, "do_rescale": true, "do_resize": true,
  "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225],
  "image_processor_type": "CLIPImageProcessor", "processor_class": "Florence2Processor",
  "resample": 3, "rescale_factor": 0.00392156862745098,
  "size": {"height": 768, "width": 768}
}"#;

/// As the released checkpoints' `generation_config.json`.
const GENERATION_CONFIG: &str = r#"{
  "bos_token_id": 0, "decoder_start_token_id": 2, "early_stopping": true, "eos_token_id": 2,
  "forced_bos_token_id": 0, "forced_eos_token_id": 2, "no_repeat_ngram_size": 3, "num_beams": 3,
  "pad_token_id": 1
}"#;

/// `<CAPTION>` = "What does the image describe?" as the processor encodes it (`<s>` ... `</s>`): checked
/// with `processor::tokenizer::Florence2Tokenizer::encode_prompt` on the real Florence-2 tokenizer
/// (`florence2_tokenizer.json` of microsoft/Florence-2-base; run with `MODEL_BENCH_TOKENIZER=` to recheck).
const CAPTION_IDS: [u32; 8] = [0, 2264, 473, 5, 2274, 6190, 116, 2];

/// `<OD>` = "Locate the objects with category and location." as the processor encodes it (checked like
/// [`CAPTION_IDS`] with `MODEL_BENCH_TOKENIZER=`).
const OD_IDS: [u32; 11] = [0, 574, 22486, 5, 8720, 19, 4120, 8, 2259, 4, 2];

const IMAGE_SIDE: usize = 768;

// ---------------------------------------------------------------------------------------------------
// Small utilities

fn env_or(key: &str, default: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| default.to_owned())
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// A field of /proc/self/status in bytes (VmRSS, VmHWM), 0 elsewhere.
fn proc_status_bytes(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// Reset the process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0: `5` > clear_refs).
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

/// Seeded xorshift64* uniform in [-1, 1).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let u = (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32;
        2.0 * u - 1.0
    }
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

// ---------------------------------------------------------------------------------------------------
// The random checkpoint

/// Seeded values with sensible scales for tensor `name` of `shape`: LayerNorm gamma 1 +- 0.2 and beta
/// +- 0.1 (non-trivial), biases +- 0.02, weights uniform with std 1/sqrt(fan_in) (0.02 for embeddings and
/// position tables, as `init_std`), the real cosine temporal table.
fn tensor_values(name: &str, shape: &[usize], cfg: &Florence2Config) -> Vec<f32> {
    let n: usize = shape.iter().product();
    if name == weights::expected::TEMPORAL_TABLE {
        return temporal_cosine_table(shape[0], shape[1]);
    }
    let mut rng = Rng::new(fnv(name));
    let is_norm = name.contains("norm") || name.contains("layernorm");
    let (offset, amp) = if is_norm && name.ends_with(".weight") {
        (1.0, 0.2)
    } else if is_norm && name.ends_with(".bias") {
        (0.0, 0.1)
    } else if name.ends_with(".bias") {
        (0.0, 0.02)
    } else if name.contains("embed") || name.contains("shared") {
        (0.0, 0.02 * 3f32.sqrt())
    } else {
        // (out, in, ...) weights: uniform(-a, a) with std 1/sqrt(fan_in); depthwise convs have fan_in 9.
        let fan_in: usize = shape[1..].iter().product::<usize>().max(1);
        (0.0, (3.0 / fan_in as f32).sqrt())
    };
    let _ = cfg;
    (0..n).map(|_| offset + amp * rng.next()).collect()
}

/// Write the checkpoint to `dir` unless its `model.safetensors` is already there.
fn ensure_checkpoint(dir: &Path, cfg: &Florence2Config, f16: bool) -> std::io::Result<()> {
    ensure_checkpoint_of(dir, cfg, BASE_CONFIG, f16)
}

/// Florence-2-large's shapes (its `config.json`'s sizes on the base config): d_model 1024, 12 + 12
/// layers of 16 heads, FFN 4096; DaViT embed_dim 256..2048, heads and groups 8..64.
fn large_config_json() -> String {
    let mut c: serde_json::Value = serde_json::from_str(BASE_CONFIG).expect("config json");
    let t = &mut c["text_config"];
    t["d_model"] = 1024.into();
    for k in [
        "encoder_layers",
        "decoder_layers",
        "encoder_attention_heads",
        "decoder_attention_heads",
    ] {
        t[k] = if k.ends_with("layers") { 12 } else { 16 }.into();
    }
    t["encoder_ffn_dim"] = 4096.into();
    t["decoder_ffn_dim"] = 4096.into();
    let v = &mut c["vision_config"];
    v["embed_dim"] = serde_json::json!([256, 512, 1024, 2048]);
    v["num_heads"] = serde_json::json!([8, 16, 32, 64]);
    v["num_groups"] = serde_json::json!([8, 16, 32, 64]);
    v["projection_dim"] = 1024.into();
    serde_json::to_string(&c).expect("json")
}

fn ensure_checkpoint_of(
    dir: &Path,
    cfg: &Florence2Config,
    config_json: &str,
    f16: bool,
) -> std::io::Result<()> {
    let st = dir.join("model.safetensors");
    if st.exists() {
        println!("checkpoint: reusing {}", dir.display());
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    let t = Instant::now();
    let mut data: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, shape) in expected_tensors(cfg) {
        let v = tensor_values(&name, &shape, cfg);
        let bytes: Vec<u8> = if f16 {
            v.iter()
                .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                .collect()
        } else {
            bytemuck::cast_slice(&v).to_vec()
        };
        data.push((name, shape, bytes));
    }
    let dtype = if f16 {
        safetensors::Dtype::F16
    } else {
        safetensors::Dtype::F32
    };
    let views: Vec<(String, safetensors::tensor::TensorView)> = data
        .iter()
        .map(|(n, s, b)| {
            let view =
                safetensors::tensor::TensorView::new(dtype, s.clone(), b).expect("tensor view");
            (n.clone(), view)
        })
        .collect();
    let meta = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    let tmp = dir.join("model.safetensors.tmp");
    safetensors::serialize_to_file(views, Some(meta), &tmp).expect("serialize");
    std::fs::rename(&tmp, &st)?;
    let mut config: serde_json::Value = serde_json::from_str(config_json).expect("config json");
    config["dtype"] = (if f16 { "float16" } else { "float32" }).into();
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&config).expect("json"),
    )?;
    std::fs::write(dir.join("preprocessor_config.json"), PREPROCESSOR_CONFIG)?;
    std::fs::write(dir.join("generation_config.json"), GENERATION_CONFIG)?;
    println!(
        "checkpoint: wrote {} ({:.0} MiB) in {:.1} s",
        dir.display(),
        mib(std::fs::metadata(&st)?.len()),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// FLOP counts (multiply-add = 2 FLOPs) from the config

fn vision_flops(cfg: &Florence2Config, grids: &[(usize, usize)]) -> f64 {
    let v = &cfg.vision;
    let mut f = 0f64;
    let mut c_in = v.in_channels;
    for (s, &(h, w)) in grids.iter().enumerate() {
        let c = v.embed_dim[s] as f64;
        let n = (h * w) as f64;
        let k = v.patch_size[s] as f64;
        f += 2.0 * n * c * c_in as f64 * k * k; // conv embed
        let hidden = davit_mlp_hidden(v.embed_dim[s], v.mlp_ratio) as f64;
        let ws = v.window_size;
        let padded = (h.div_ceil(ws) * ws * w.div_ceil(ws) * ws) as f64;
        let groups = v.num_groups[s] as f64;
        let per_half_linear = 2.0 * n * (3.0 * c * c + c * c + 2.0 * c * hidden);
        let dw = 2.0 * 2.0 * n * c * 9.0;
        let win_attn = 2.0 * 2.0 * padded * (ws * ws) as f64 * c; // q k^T and attn v
        let ch_attn = 2.0 * 2.0 * n * c * (c / groups);
        f += v.depths[s] as f64 * (2.0 * (per_half_linear + dw) + win_attn + ch_attn);
        c_in = v.embed_dim[s];
    }
    f
}

fn projector_flops(cfg: &Florence2Config, tokens: usize) -> f64 {
    2.0 * tokens as f64
        * *cfg.vision.embed_dim.last().unwrap_or(&0) as f64
        * cfg.text.d_model as f64
}

fn encoder_flops(cfg: &Florence2Config, s: usize) -> f64 {
    let t = &cfg.text;
    let (s, d, f) = (s as f64, t.d_model as f64, t.encoder_ffn_dim as f64);
    t.encoder_layers as f64
        * (2.0 * s * 4.0 * d * d + 2.0 * 2.0 * s * s * d + 2.0 * 2.0 * s * d * f)
}

fn cross_kv_flops(cfg: &Florence2Config, s: usize) -> f64 {
    let t = &cfg.text;
    t.decoder_layers as f64 * 2.0 * 2.0 * s as f64 * (t.d_model * t.d_model) as f64
}

/// Bytes one decode step reads: the decoder's matrix weights (all decoder linears except the cross K/V
/// projections, and the LM head) at `wbytes` bytes per weight (the resident dtype), its f32 biases and
/// layer norms, plus the KV caches and cross K/V it attends over (f32 with fp32 weights, f16 otherwise:
/// `Decoder::kv_dtype`).
fn decode_step_bytes(cfg: &Florence2Config, s: usize, pos: usize, wbytes: f64) -> f64 {
    let t = &cfg.text;
    let (d, f, v) = (t.d_model, t.decoder_ffn_dim, t.vocab_size);
    let matrices = t.decoder_layers * (6 * d * d + 2 * d * f) + v * d;
    let small = t.decoder_layers * (6 * d + f + d + 6 * d);
    let caches = t.decoder_layers * 2 * (s + pos + 1) * d;
    let kv_bytes = if wbytes >= 4.0 { 4.0 } else { 2.0 };
    wbytes * matrices as f64 + 4.0 * small as f64 + kv_bytes * caches as f64
}

/// Bytes per matrix weight of a resident dtype (quantized: a d_model-wide row with its scales).
fn weight_bytes_per_elem(dtype: WeightDType, k: usize) -> f64 {
    match dtype {
        WeightDType::Fp32 => 4.0,
        WeightDType::Fp16 => 2.0,
        WeightDType::Q8 => QFormat::Q8.row_bytes(k) as f64 / k as f64,
        WeightDType::Q4 => QFormat::Q4.row_bytes(k) as f64 / k as f64,
    }
}

// ---------------------------------------------------------------------------------------------------
// Kernel ceilings measured in this run

fn time_submit(gpu: &Arc<Device>, reps: usize, mut record: impl FnMut(&mut Recorder)) -> f64 {
    let mut times = Vec::new();
    for i in 0..=reps {
        // On the CPU backend the work runs while it is recorded: time from the recorder's start.
        let t0 = Instant::now();
        let mut rec = Recorder::new(gpu);
        record(&mut rec);
        let t = if gpu.is_host() { t0 } else { Instant::now() };
        rec.submit().expect("submit");
        gpu.wait_idle().expect("wait");
        if i > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    median(&times)
}

fn rand_tensor(gpu: &Device, shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut r = Rng::new(seed);
    let v: Vec<f32> = (0..n).map(|_| r.next() * 0.5).collect();
    Tensor::from_f32(gpu, shape, &v, "bench").expect("tensor")
}

/// Best GFLOP/s over the linear variants that can run (m, k, n) here, and its variant.
fn gemm_rate(gpu: &Arc<Device>, m: usize, k: usize, n: usize) -> (f64, LinearVariant) {
    let x = rand_tensor(gpu, &[m, k], 1);
    let w = rand_tensor(gpu, &[n, k], 2);
    let b = rand_tensor(gpu, &[n], 3);
    let out = Tensor::zeros(gpu, &[m, n], DType::F32, "out").expect("out");
    let mut best = (0.0, LinearVariant::Reg8x8);
    for v in [
        LinearVariant::Reg8x8,
        LinearVariant::Subgroup,
        LinearVariant::SubgroupC4,
        LinearVariant::SubgroupR16,
    ] {
        // Variants the device cannot run fail at record time: skip them.
        let mut probe = Recorder::new(gpu);
        if ops::matmul::linear(
            &mut probe,
            &x,
            &w,
            ops::matmul::LinearArgs::default().bias(Some(&b)).variant(v),
            &out,
        )
        .is_err()
        {
            continue;
        }
        drop(probe);
        let t = time_submit(gpu, 3, |rec| {
            ops::matmul::linear(
                rec,
                &x,
                &w,
                ops::matmul::LinearArgs::default().bias(Some(&b)).variant(v),
                &out,
            )
            .expect("linear")
        });
        let rate = 2.0 * (m * k * n) as f64 / t / 1e9;
        println!(
            "  linear {m}x{k}x{n} {v:?}: {:.1} ms, {rate:.1} GFLOP/s",
            t * 1e3
        );
        if rate > best.0 {
            best = (rate, v);
        }
    }
    best
}

/// GB/s of a GPU buffer-to-buffer copy (read + write bytes counted) and of the LM-head GEMV (weight bytes).
fn copy_bandwidth(gpu: &Arc<Device>) -> f64 {
    let n = 32 << 20; // 128 MiB of f32
    let a = Tensor::zeros(gpu, &[n], DType::F32, "copy.a").expect("a");
    let b = Tensor::zeros(gpu, &[n], DType::F32, "copy.b").expect("b");
    let t = time_submit(gpu, 3, |rec| rec.copy(&a, &b).expect("copy"));
    2.0 * (n * 4) as f64 / t / 1e9
}

// ---------------------------------------------------------------------------------------------------
// The model run

#[derive(Default, Clone)]
struct Phases {
    load_s: f64,
    load_peak_rss: u64,
    weights_bytes: u64,
    /// Engine-counted GPU bytes: peak of weights + activations over the warm pass (beam-shaped steps
    /// included) and the peak of the activations alone.
    peak_gpu: u64,
    peak_act: u64,
    cold_total_s: f64,
    preprocess_s: f64,
    vision_s: f64,
    vision_cpu: f64,
    encoder_cpu: f64,
    steps_cpu: Vec<f64>,
    total_cpu: f64,
    vision_dispatches: usize,
    vision_peak_rss: u64,
    projector_s: f64,
    encoder_s: f64,
    encoder_dispatches: usize,
    cross_kv_s: f64,
    steps_s: Vec<f64>,
    beam_steps_s: Vec<f64>,
    step_dispatches: usize,
    total_s: f64,
    peak_rss: u64,
    seq_len: usize,
    image_tokens: usize,
    grids: Vec<(usize, usize)>,
}

fn synthetic_image() -> image::RgbImage {
    // A smooth gradient with some texture, at 1024x768 so the resize does real work.
    let (w, h) = (1024u32, 768u32);
    image::RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([
            (x * 255 / w) as u8,
            (y * 255 / h) as u8,
            (((x ^ y) & 0xff) as u8).wrapping_mul(3),
        ])
    })
}

fn wait(gpu: &Device) {
    gpu.wait_idle().expect("wait_idle");
}

/// Image-encoding reuse, same run: a first `<CAPTION>` task from the image (preprocess, DaViT +
/// projector, encoder, greedy decode: what `Pipeline::run_task` does on an image) against later tasks on
/// the kept image features (encoder + decode: what it does on an `EncodedImage`), each waited for, all
/// with compiled kernels. Prints the median later/first ratio (issue 12's target: <= 25%).
fn encoding_reuse(
    gpu: &Arc<Device>,
    model: &Florence2,
    pcfg: &ImageProcessorConfig,
    img: &image::RgbImage,
    opts: &florence2_wasm::model::generate::GenerateOptions,
    warm: bool,
) {
    let greedy = florence2_wasm::model::generate::GenerateOptions {
        num_beams: 1,
        ..opts.clone()
    };
    let first = || {
        let t = Instant::now();
        let px = preprocess(img, pcfg).expect("preprocess");
        let pixels =
            Tensor::from_f32(gpu, &[1, 3, pcfg.height, pcfg.width], &px, "pixels").expect("px");
        let features = model.encode_image(&pixels).expect("encode_image"); // (1, N, D)
        let enc = model
            .encode_prompt(&features, &CAPTION_IDS)
            .expect("encode_prompt");
        let ids = pollster::block_on(model.generate(&enc.cross, &greedy, Default::default()))
            .expect("generate");
        (t.elapsed().as_secs_f64(), features, ids)
    };
    if !warm {
        first(); // compile the kernels
    }
    let (first_s, features, ids) = first();
    let mut later = Vec::new();
    for _ in 0..2 {
        let t = Instant::now();
        let enc = model
            .encode_prompt(&features, &CAPTION_IDS)
            .expect("encode_prompt");
        let again = pollster::block_on(model.generate(&enc.cross, &greedy, Default::default()))
            .expect("generate");
        later.push(t.elapsed().as_secs_f64());
        assert_eq!(
            again, ids,
            "a task on the kept features decodes the same ids"
        );
    }
    let later_s = median(&later);
    println!(
        "  encoding reuse (<CAPTION>, {} greedy tokens): first task {:.2} s, later task on the encoded \
         image {:.2} s (median of {}) = {:.1}% of the first (target <= 25%)",
        ids.len() - 1,
        first_s,
        later_s,
        later.len(),
        100.0 * later_s / first_s
    );
}

fn run_model(
    gpu: &Arc<Device>,
    dir: &Path,
    resident: WeightDType,
    tokens: usize,
    cold: bool,
    breakdown: bool,
    reuse: bool,
) -> Phases {
    let mut ph = Phases::default();
    reset_peak_rss();
    let rss0 = proc_status_bytes("VmRSS:");
    let t = Instant::now();
    let (cfg, w) = weights::load_dir_with(gpu, dir, weights::LoadOptions::with_dtype(resident))
        .expect("load_dir");
    wait(gpu);
    ph.load_s = t.elapsed().as_secs_f64();
    ph.load_peak_rss = proc_status_bytes("VmHWM:").saturating_sub(rss0);
    ph.weights_bytes = gpu.memory().weights_bytes;
    gpu.reset_peak_memory();
    let model = Florence2::new(gpu, cfg.clone(), &w).expect("Florence2::new");
    drop(w);
    let pcfg = ImageProcessorConfig::from_json_bytes(
        &std::fs::read(dir.join("preprocessor_config.json")).expect("preprocessor_config"),
    )
    .expect("preprocessor config");
    let img = synthetic_image();
    // Kernel tuning as a load does it (MODEL_BENCH_TUNING=auto|off|exhaustive, default off = the static
    // choices; no cache, so "auto" really times): run once with each to compare the phases.
    let tuning: tune::Tuning = env_or("MODEL_BENCH_TUNING", "off")
        .parse()
        .expect("MODEL_BENCH_TUNING");
    // MODEL_BENCH_TUNING_BUDGET_MS: auto's time budget (default: a load's; "none" = every class).
    let budget = match env_or("MODEL_BENCH_TUNING_BUDGET_MS", "default").as_str() {
        "default" => Some(tune::AUTO_BUDGET_MS),
        "none" => None,
        b => Some(b.parse::<f64>().expect("MODEL_BENCH_TUNING_BUDGET_MS")),
    };
    gpu.choices.clear();
    let t = Instant::now();
    let work = workloads::model_workload(
        &model.config,
        pcfg.height,
        pcfg.width,
        3,
        model.shared.dtype(),
    );
    let work: Vec<(&dyn tune::TuneCase, f64)> =
        work.iter().map(|(c, w)| (c.as_ref(), *w)).collect();
    let report = pollster::block_on(tune::tune_cases(
        model.gpu(),
        &work,
        &tune::TuneOptions::new(tuning).with_budget_ms(budget),
        &tune::CacheLocation::None,
    ))
    .expect("tuning");
    if tuning != tune::Tuning::Off {
        println!(
            "tuning {}: {:.2} s, {} classes\n{}",
            tuning.name(),
            t.elapsed().as_secs_f64(),
            report.rows.len(),
            report.table()
        );
    }

    let opts = model.generate_options(tokens);
    // Random weights may pick EOS early; the benchmark decodes exactly `tokens` steps, so no EOS.
    let opts = florence2_wasm::model::generate::GenerateOptions {
        eos_token_ids: vec![],
        forced_eos_token_id: None,
        ..opts
    };

    // MODEL_BENCH_COMPARE=N (with tuning on): N rounds, each an end-to-end `<CAPTION>` (encode + greedy
    // `tokens` steps) with the static choices and one with the tuned ones, alternating, so both see the
    // same machine load; medians and the tuned/static ratio per round.
    let rounds: usize = env_or("MODEL_BENCH_COMPARE", "0")
        .parse()
        .expect("MODEL_BENCH_COMPARE");
    if rounds > 0 && tuning != tune::Tuning::Off {
        let tuned = gpu.choices.snapshot();
        let greedy = florence2_wasm::model::generate::GenerateOptions {
            num_beams: 1,
            ..opts.clone()
        };
        let pass = || {
            let t = Instant::now();
            let px = preprocess(&img, &pcfg).expect("preprocess");
            let pixels =
                Tensor::from_f32(gpu, &[1, 3, pcfg.height, pcfg.width], &px, "pixels").expect("px");
            let enc = model.encode(&pixels, &CAPTION_IDS).expect("encode");
            pollster::block_on(model.generate(&enc.cross, &greedy, Default::default()))
                .expect("generate");
            t.elapsed().as_secs_f64()
        };
        // One untimed pass of each compiles every kernel both use.
        gpu.choices.clear();
        pass();
        for (c, v) in &tuned {
            gpu.choices.set(*c, v);
        }
        pass();
        let (mut st, mut tu) = (Vec::new(), Vec::new());
        for r in 0..rounds {
            gpu.choices.clear();
            st.push(pass());
            for (c, v) in &tuned {
                gpu.choices.set(*c, v);
            }
            tu.push(pass());
            println!(
                "  round {r}: static {:.2} s, tuned {:.2} s, tuned/static {:.3}",
                st[r],
                tu[r],
                tu[r] / st[r]
            );
        }
        println!(
            "end-to-end <CAPTION> ({tokens} greedy tokens), {rounds} alternating rounds: static {:.2} s, \
             tuned {:.2} s (medians), tuned/static {:.3}",
            median(&st),
            median(&tu),
            median(&tu) / median(&st)
        );
    }

    if cold {
        let t = Instant::now();
        let px = preprocess(&img, &pcfg).expect("preprocess");
        let pixels =
            Tensor::from_f32(gpu, &[1, 3, pcfg.height, pcfg.width], &px, "pixels").expect("px");
        let enc = model.encode(&pixels, &CAPTION_IDS).expect("encode");
        let greedy = florence2_wasm::model::generate::GenerateOptions {
            num_beams: 1,
            ..opts.clone()
        };
        let ids = pollster::block_on(model.generate(&enc.cross, &greedy, Default::default()))
            .expect("generate");
        ph.cold_total_s = t.elapsed().as_secs_f64();
        println!(
            "  cold pass (kernels compiled on the way): {:.2} s, {} ids",
            ph.cold_total_s,
            ids.len()
        );
    }
    if reuse {
        encoding_reuse(gpu, &model, &pcfg, &img, &opts, cold);
    }

    // Warm pass, phase by phase.
    reset_peak_rss();
    let t_all = Instant::now();
    let c_all = cpu_secs();
    let t = Instant::now();
    let px = preprocess(&img, &pcfg).expect("preprocess");
    ph.preprocess_s = t.elapsed().as_secs_f64();
    let (ih, iw) = (pcfg.height, pcfg.width);
    let pixels = Tensor::from_f32(gpu, &[1, 3, ih, iw], &px, "pixels").expect("pixels");
    ph.grids = model.vision.stage_grids(ih, iw).expect("grids");

    let t = Instant::now();
    let c = cpu_secs();
    let mut rec = Recorder::new(gpu);
    let (feats, grid) = model
        .vision
        .forward(&mut rec, &pixels, None)
        .expect("vision");
    ph.vision_dispatches = rec.dispatch_count();
    rec.submit().expect("submit");
    wait(gpu);
    ph.vision_s = t.elapsed().as_secs_f64();
    ph.vision_cpu = cpu_secs() - c;
    ph.vision_peak_rss = proc_status_bytes("VmHWM:");

    let t = Instant::now();
    let mut rec = Recorder::new(gpu);
    let image = model
        .projector
        .forward(&mut rec, &feats, grid)
        .expect("projector"); // (1, 1+N, D)
    rec.submit().expect("submit");
    wait(gpu);
    ph.projector_s = t.elapsed().as_secs_f64();
    drop(feats);

    // Encoder: prompt embedding, [image ++ prompt], 6 layers (as `Florence2::encode` without placeholders).
    let d = cfg.text.d_model;
    let n_img = image.dim(1);
    let seq = n_img + CAPTION_IDS.len();
    ph.image_tokens = n_img;
    ph.seq_len = seq;
    let t = Instant::now();
    let c = cpu_secs();
    let mut rec = Recorder::new(gpu);
    let embeds = Tensor::zeros(gpu, &[seq, d], DType::F32, "embeds").expect("embeds");
    let ids = Tensor::from_u32(gpu, &[CAPTION_IDS.len()], &CAPTION_IDS, "ids").expect("ids");
    let text = Tensor::zeros(gpu, &[CAPTION_IDS.len(), d], DType::F32, "text").expect("text");
    ops::embedding::embedding(&mut rec, &ids, &model.shared, &text).expect("embedding");
    let row = (d * 4) as u64;
    rec.copy_range(&image, 0, &embeds, 0, n_img as u64 * row)
        .expect("copy");
    rec.copy_range(
        &text,
        0,
        &embeds,
        n_img as u64 * row,
        CAPTION_IDS.len() as u64 * row,
    )
    .expect("copy");
    let inputs = embeds.reshape(&[1, seq, d]).expect("reshape");
    let hidden = model.encoder.forward(&mut rec, &inputs).expect("encoder");
    ph.encoder_dispatches = rec.dispatch_count();
    rec.submit().expect("submit");
    wait(gpu);
    ph.encoder_s = t.elapsed().as_secs_f64();
    ph.encoder_cpu = cpu_secs() - c;

    let t = Instant::now();
    let mut rec = Recorder::new(gpu);
    let cross = model.decoder.cross_kv(&mut rec, &hidden).expect("cross kv");
    rec.submit().expect("submit");
    wait(gpu);
    ph.cross_kv_s = t.elapsed().as_secs_f64();

    // Decode steps: argmax only (no processors), exactly `tokens` steps, 4 bytes read back per step.
    let max_len = tokens + 1;
    let mut state = model
        .decoder
        .new_state(gpu, &cross, 1, max_len)
        .expect("state");
    let out = Tensor::zeros(gpu, &[1], DType::U32, "argmax").expect("argmax");
    let staging = staging_buffer(gpu, out.byte_size());
    let mut last = cfg.text.decoder_start_token_id;
    for pos in 0..tokens {
        let t = Instant::now();
        let c = cpu_secs();
        state.write_tokens(&[last]).expect("write tokens");
        let mut rec = Recorder::new(gpu);
        let logits = model
            .decoder
            .step_planned(&mut rec, pos as u32, &mut state)
            .expect("step");
        ops::reduce::argmax_rows(&mut rec, &logits, &out).expect("argmax");
        ph.step_dispatches = rec.dispatch_count();
        let p = rec.read_back_into(&out, &staging).expect("readback");
        rec.submit().expect("submit");
        let got = pollster::block_on(p.u32s(gpu)).expect("u32s");
        last = got[0];
        ph.steps_s.push(t.elapsed().as_secs_f64());
        ph.steps_cpu.push(cpu_secs() - c);
    }
    ph.total_s = t_all.elapsed().as_secs_f64();

    // Beam-shaped steps (3 rows, as beam search runs them; beam search is not on main yet): the batch-3
    // decoder step, log-softmax, top-6 per row read back, and a cache reorder by beam index (a rotation:
    // every row moves) before each step after the first.
    let beams = 3;
    let mut bstate = model
        .decoder
        .new_state(gpu, &cross, beams, max_len)
        .expect("beam state");
    let v = cfg.text.vocab_size;
    let lsm = Tensor::zeros(gpu, &[beams, v], DType::F32, "beam.lsm").expect("lsm");
    let tk_vals = Tensor::zeros(gpu, &[beams, 2 * beams], DType::F32, "beam.vals").expect("vals");
    let tk_ids = Tensor::zeros(gpu, &[beams, 2 * beams], DType::U32, "beam.ids").expect("ids");
    let st_vals = staging_buffer(gpu, tk_vals.byte_size());
    let st_ids = staging_buffer(gpu, tk_ids.byte_size());
    let mut last = vec![cfg.text.decoder_start_token_id; beams];
    for pos in 0..tokens {
        let t = Instant::now();
        bstate.write_tokens(&last).expect("write tokens");
        let mut rec = Recorder::new(gpu);
        if pos > 0 {
            bstate.reorder(&mut rec, &[1, 2, 0], pos).expect("reorder");
        }
        let logits = model
            .decoder
            .step_planned(&mut rec, pos as u32, &mut bstate)
            .expect("step");
        ops::softmax::log_softmax_rows(&mut rec, &logits, &lsm).expect("log_softmax");
        ops::reduce::topk_rows(&mut rec, &lsm, 2 * beams, &tk_vals, &tk_ids).expect("topk");
        let pv = rec.read_back_into(&tk_vals, &st_vals).expect("readback");
        let pi = rec.read_back_into(&tk_ids, &st_ids).expect("readback");
        rec.submit().expect("submit");
        let _vals = pollster::block_on(pv.f32s(gpu)).expect("vals");
        let ids = pollster::block_on(pi.u32s(gpu)).expect("ids");
        for (b, slot) in last.iter_mut().enumerate() {
            *slot = ids[b * 2 * beams];
        }
        ph.beam_steps_s.push(t.elapsed().as_secs_f64());
    }
    ph.total_cpu = cpu_secs() - c_all;
    ph.peak_rss = proc_status_bytes("VmHWM:");
    let m = gpu.memory();
    ph.peak_gpu = m.peak_bytes;
    ph.peak_act = m.peak_activations_bytes;
    if breakdown {
        println!(
            "  DaViT per-op breakdown (sum of one-submit ops x blocks; compare with vision total):"
        );
        let mut sum = 0.0;
        for (s, &g) in ph.grids.clone().iter().enumerate() {
            sum += block_breakdown(gpu, &model, s, g);
        }
        println!(
            "  blocks of all stages by ops: {:.1} ms (vision measured {:.1} ms)",
            sum * 1e3,
            ph.vision_s * 1e3
        );
    }
    ph
}

// ---------------------------------------------------------------------------------------------------
// Op-level breakdown of one DaViT block (spatial + channel half), the model's own weights and ops, each op
// its own submit: where a block's time goes.

fn block_breakdown(gpu: &Arc<Device>, model: &Florence2, s: usize, (h, w): (usize, usize)) -> f64 {
    let vt = &model.vision;
    let blk = &vt.blocks[s][0];
    let (sp, ch) = (&blk.spatial_block, &blk.channel_block);
    let c = vt.convs[s].embed_dim;
    let heads = vt.num_heads[s];
    let groups = vt.num_groups[s];
    let ws = vt.window_size;
    let rows = h * w;
    let hidden = sp.ffn.fc1.weight.dim(0);
    let nw = h.div_ceil(ws) * w.div_ceil(ws);
    let wrows = nw * ws * ws;
    let z = |shape: &[usize]| Tensor::zeros(gpu, shape, DType::F32, "bd").expect("zeros");
    let a = rand_tensor(gpu, &[1, h, w, c], 7);
    let b = z(&[1, h, w, c]);
    let n = z(&[1, h, w, c]);
    let p = z(&[rows, c]);
    let hid = z(&[rows, hidden]);
    let cqkv = z(&[1, rows, 3 * c]);
    let win = z(&[nw, ws * ws, c]);
    let wqkv = z(&[nw, ws * ws, 3 * c]);
    let r2 = |t: &Tensor, sh: &[usize]| t.reshape(sh).expect("reshape");
    let scale = ((c / heads) as f32).powf(-0.5);
    let lin = |m: usize, k: usize, nn: usize| 2.0 * (m * k * nn) as f64;
    type Rec<'a> = Box<dyn Fn(&mut Recorder) + 'a>;
    let ops_list: Vec<(&str, f64, Rec)> = vec![
        (
            "dwconv3x3 + residual (x4)",
            0.0,
            Box::new(|r: &mut Recorder| {
                ops::conv::dwconv3x3_residual(r, &a, &sp.conv1.weight, &sp.conv1.bias, &b)
                    .expect("dw")
            }),
        ),
        (
            "layer_norm (x4)",
            0.0,
            Box::new(|r: &mut Recorder| {
                sp.norm1
                    .forward(r, &r2(&b, &[rows, c]), &r2(&n, &[rows, c]))
                    .expect("ln")
            }),
        ),
        (
            "window_partition",
            0.0,
            Box::new(|r: &mut Recorder| {
                ops::window::window_partition(r, &n, ws, &win).expect("wp")
            }),
        ),
        (
            "spatial qkv linear",
            lin(wrows, c, 3 * c),
            Box::new(|r: &mut Recorder| {
                sp.attn
                    .qkv
                    .forward(
                        r,
                        &r2(&win, &[wrows, c]),
                        Act::None,
                        &r2(&wqkv, &[wrows, 3 * c]),
                    )
                    .expect("qkv")
            }),
        ),
        (
            "window_attention (fused)",
            4.0 * (wrows * ws * ws * c) as f64,
            Box::new(|r: &mut Recorder| {
                ops::window_attn::window_attention(r, &wqkv, heads, scale, &win).expect("wa")
            }),
        ),
        (
            "window_reverse",
            0.0,
            Box::new(|r: &mut Recorder| {
                ops::window::window_reverse(r, &win, ws, h, w, &n).expect("wr")
            }),
        ),
        (
            "proj linear (x2)",
            lin(rows, c, c),
            Box::new(|r: &mut Recorder| {
                sp.attn
                    .proj
                    .forward(r, &r2(&n, &[rows, c]), Act::None, &p)
                    .expect("proj")
            }),
        ),
        (
            "residual add (x4)",
            0.0,
            Box::new(|r: &mut Recorder| {
                ops::elementwise::add(r, &r2(&b, &[rows, c]), &p, &r2(&a, &[rows, c])).expect("add")
            }),
        ),
        (
            "mlp fc1 + gelu (x2)",
            lin(rows, c, hidden),
            Box::new(|r: &mut Recorder| {
                sp.ffn
                    .fc1
                    .forward(r, &r2(&n, &[rows, c]), Act::Gelu, &hid)
                    .expect("fc1")
            }),
        ),
        (
            "mlp fc2 (x2)",
            lin(rows, hidden, c),
            Box::new(|r: &mut Recorder| sp.ffn.fc2.forward(r, &hid, Act::None, &p).expect("fc2")),
        ),
        (
            "channel qkv linear",
            lin(rows, c, 3 * c),
            Box::new(|r: &mut Recorder| {
                ch.attn
                    .qkv
                    .forward(
                        r,
                        &r2(&n, &[rows, c]),
                        Act::None,
                        &r2(&cqkv, &[rows, 3 * c]),
                    )
                    .expect("cqkv")
            }),
        ),
        (
            "channel_attention",
            4.0 * (rows * c * (c / groups)) as f64,
            Box::new(|r: &mut Recorder| {
                ops::channel_attn::channel_attention(r, &cqkv, groups, &r2(&n, &[1, rows, c]))
                    .expect("ca")
            }),
        ),
    ];
    // How many times each op runs per block (spatial + channel half).
    let times_per_block = [4.0, 4.0, 1.0, 1.0, 1.0, 1.0, 2.0, 4.0, 2.0, 2.0, 1.0, 1.0];
    println!("  stage {s} block ops ({h}x{w} tokens, C {c}), one submit each (median of 2 after a warm-up):");
    let mut rows_out = Vec::new();
    let mut total = 0.0;
    for ((name, flops, f), k) in ops_list.iter().zip(times_per_block) {
        let t = time_submit(gpu, 2, |r| f(r));
        total += t * k;
        rows_out.push((name, t, *flops, k));
    }
    for (name, t, flops, k) in rows_out {
        let rate = if flops > 0.0 {
            format!("{:>6.1} GFLOP/s", flops / t / 1e9)
        } else {
            format!("{:>6.2} GB/s r+w", 2.0 * (rows * c * 4) as f64 / t / 1e9)
        };
        println!(
            "    {name:<28} {:>8.2} ms  {rate}  {:>4.1}% of the block",
            t * 1e3,
            100.0 * t * k / total
        );
    }
    println!(
        "    block total {:.1} ms -> {} blocks {:.1} ms",
        total * 1e3,
        vt.blocks[s].len(),
        total * 1e3 * vt.blocks[s].len() as f64
    );
    total * vt.blocks[s].len() as f64
}

// ---------------------------------------------------------------------------------------------------
// PyTorch reference

fn reference_available() -> bool {
    Command::new("python3")
        .args(["-c", "import torch, transformers"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn run_reference(dir: &Path, tokens: usize) -> Option<serde_json::Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/bench/reference_model.py");
    let ids: Vec<String> = CAPTION_IDS.iter().map(|i| i.to_string()).collect();
    let out = Command::new("python3")
        .arg(script)
        .arg("--model")
        .arg(dir)
        .args(["--tokens", &tokens.to_string(), "--ids", &ids.join(",")])
        .output()
        .ok()?;
    if !out.status.success() {
        println!(
            "PyTorch reference failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l.trim()).ok())
}

// ---------------------------------------------------------------------------------------------------
// Memory only (MODEL_BENCH_MEMORY=1)

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}

/// (dtype, weight bytes, vision phase, per task (encoder phase, decode phase)).
type MemRow = (
    WeightDType,
    u64,
    florence2_wasm::gpu::MemReport,
    Vec<(
        florence2_wasm::gpu::MemReport,
        florence2_wasm::gpu::MemReport,
    )>,
);

/// Engine-counted GPU memory of one request per task and resident dtype (see the module doc).
fn memory_table(gpu: &Arc<Device>, dir: &Path, residents: &[WeightDType], steps: usize) {
    use florence2_wasm::Error;
    use std::cell::Cell;
    let disk = std::fs::metadata(dir.join("model.safetensors"))
        .map(|m| m.len())
        .unwrap_or(0);
    println!(
        "\n== engine-counted GPU memory, {} ({:.1} MB f32 checkpoint), 768x768, 3 beams, max_new_tokens 1024, {steps} decode steps ==",
        dir.display(),
        mb(disk)
    );
    let pcfg = ImageProcessorConfig::from_json_bytes(
        &std::fs::read(dir.join("preprocessor_config.json")).expect("preprocessor_config"),
    )
    .expect("preprocessor config");
    let img = synthetic_image();
    let px = preprocess(&img, &pcfg).expect("preprocess");
    let tasks: [(&str, &[u32]); 2] = [("<CAPTION>", &CAPTION_IDS), ("<OD>", &OD_IDS)];
    let mut rows: Vec<MemRow> = Vec::new();
    let mut vision_plan = None;
    for &resident in residents {
        let t = Instant::now();
        let (cfg, w) = weights::load_dir_with(gpu, dir, weights::LoadOptions::with_dtype(resident))
            .expect("load_dir");
        let mut model = Florence2::new(gpu, cfg.clone(), &w).expect("Florence2::new");
        if env_or("MODEL_BENCH_KV", "auto") == "f32" {
            model
                .decoder
                .set_kv_dtype(florence2_wasm::gpu::DType::F32)
                .expect("f32 KV");
        }
        drop(w);
        wait(gpu);
        let weights_bytes = gpu.memory().weights_bytes;
        println!(
            "{resident}: loaded in {:.1} s, weights {:.1} MB, KV caches and cross K/V {:?}",
            t.elapsed().as_secs_f64(),
            mb(weights_bytes),
            model.decoder.kv_dtype()
        );
        // As Pipeline::run_task on an image: the pixels go from the CPU into the vision arena,
        // DaViT + projector.
        gpu.reset_peak_memory();
        let t = Instant::now();
        let image = model
            .encode_pixels(&px, [1, 3, pcfg.height, pcfg.width])
            .expect("vision");
        wait(gpu);
        let vision = gpu.memory();
        println!(
            "  vision + projector: {:.1} s, peak {:.1} MB (activations {:.1} MB)",
            t.elapsed().as_secs_f64(),
            mb(vision.peak_bytes),
            mb(vision.peak_activations_bytes)
        );
        let mut per_task = Vec::new();
        for (name, ids) in tasks {
            gpu.reset_peak_memory();
            let t = Instant::now();
            let enc = model.encode_prompt(&image, ids).expect("encoder");
            wait(gpu);
            let encoder = gpu.memory();
            let encoder_s = t.elapsed().as_secs_f64();
            let florence2_wasm::model::florence2::EncoderOutput {
                cross,
                hidden,
                inputs_embeds,
                ..
            } = enc;
            drop((hidden, inputs_embeds));
            gpu.reset_peak_memory();
            let t = Instant::now();
            let mut opts = model.generate_options(1024);
            opts.num_beams = 3;
            let polls = Cell::new(0usize);
            let cancel = || {
                polls.set(polls.get() + 1);
                polls.get() > steps
            };
            let obs = florence2_wasm::model::generate::Observer::cancel(&cancel);
            match pollster::block_on(model.generate(&cross, &opts, obs)) {
                Ok(ids) => println!("  {name}: finished after {} ids", ids.len()),
                Err(Error::Cancelled) => {}
                Err(e) => panic!("generate: {e}"),
            }
            wait(gpu);
            let decode = gpu.memory();
            drop(cross);
            println!(
                "  {name}: encoder {encoder_s:.1} s, peak {:.1} MB; decode ({} steps) {:.1} s, peak {:.1} MB",
                mb(encoder.peak_bytes),
                polls.get().min(steps),
                t.elapsed().as_secs_f64(),
                mb(decode.peak_bytes)
            );
            per_task.push((encoder, decode));
        }
        drop(image);
        rows.push((resident, weights_bytes, vision, per_task));
        if vision_plan.is_none() {
            let (binding, dims) = (gpu.caps.max_storage_binding, (pcfg.height, pcfg.width));
            vision_plan = Some((
                model
                    .vision
                    .tower_shape()
                    .and_then(|t| t.arena_plan(binding, 1, dims))
                    .expect("arena plan"),
                model
                    .vision
                    .tower_shape()
                    .and_then(|t| t.mlp_chunk_rows(binding, 1, dims))
                    .expect("mlp chunks"),
                model
                    .vision
                    .stage_grids(pcfg.height, pcfg.width)
                    .expect("grids"),
            ));
        }
        drop(model);
    }

    // Where the vision-phase bytes are: the DaViT arena as planned, plus the image features.
    if let Some((plan, chunks, grids)) = vision_plan {
        let mlp: Vec<String> = chunks
            .iter()
            .zip(&grids)
            .map(|(&r, &(h, w))| format!("{}x{r}", (h * w).div_ceil(r)))
            .collect();
        println!(
            "\nvision phase, by construction: DaViT arena {:.1} MB (ra, rb {:.1} MB each, padded-window \
             buffer {:.1} MB, big {:.1} MB, q/k/v {:.1} MB; MLP row chunks per stage (chunks x rows): {}), \
             then the image features",
            mb(plan.bytes()),
            mb(4 * plan.stream as u64),
            mb(4 * plan.windows as u64),
            mb(4 * plan.big as u64),
            mb(12 * plan.split as u64),
            mlp.join(", ")
        );
    }
    // Where the decode-phase bytes are, from the shapes (f32 activations).
    let cfg = Florence2Config::from_json_str(
        &std::fs::read_to_string(dir.join("config.json")).expect("config.json"),
    )
    .expect("config");
    let t = &cfg.text;
    let (l, d, v, beams, max_len) = (t.decoder_layers, t.d_model, t.vocab_size, 3usize, 1023usize);
    let kv = (2 * l * beams * max_len * d) as u64;
    let spare = (beams * florence2_wasm::model::bart::REORDER_CHUNK_ROWS * d) as u64;
    let cross = (2 * l * 1000 * d) as u64;
    println!(
        "\ndecode phase, by construction: self-attention KV caches {:.1} MB f32 / {:.1} MB f16 (2 x {l} layers x ({beams}, {max_len}, {d})), \
         reorder spare {:.1} / {:.1} MB, cross K/V {:.1} / {:.1} MB per 1000 encoder tokens (2 x {l} x (S, {d})), \
         logits + log-probs {:.1} MB, image features {:.1} MB (f16 K/V: fp16, q8, q4 unless MODEL_BENCH_KV=f32)",
        mb(4 * kv),
        mb(2 * kv),
        mb(4 * spare),
        mb(2 * spare),
        mb(4 * cross),
        mb(2 * cross),
        mb((2 * beams * v * 4) as u64),
        mb((577 * d * 4) as u64),
    );
    println!(
        "\n| dtype | weights MB | vision peak MB (act.) | <CAPTION> peak MB (encoder / decode act.) | <OD> peak MB (encoder / decode act.) |"
    );
    println!("|---|---|---|---|---|");
    for (dt, w, vision, per_task) in &rows {
        let cells: Vec<String> = per_task
            .iter()
            .map(|(e, d)| {
                let peak = vision.peak_bytes.max(e.peak_bytes).max(d.peak_bytes);
                format!(
                    "{:.1} ({:.1} / {:.1})",
                    mb(peak),
                    mb(e.peak_activations_bytes),
                    mb(d.peak_activations_bytes)
                )
            })
            .collect();
        println!(
            "| {dt} | {:.1} | {:.1} ({:.1}) | {} |",
            mb(*w),
            mb(vision.peak_bytes),
            mb(vision.peak_activations_bytes),
            cells.join(" | ")
        );
    }
}

// ---------------------------------------------------------------------------------------------------

fn main() {
    // `cargo test --all-targets` runs harness-less benches too (without `--bench`): do nothing there.
    if !std::env::args().any(|a| a == "--bench") {
        println!(
            "model benchmark: run it with `cargo bench --bench model` (skipped under cargo test)"
        );
        return;
    }
    let tokens: usize = env_or("MODEL_BENCH_TOKENS", "20")
        .parse()
        .expect("MODEL_BENCH_TOKENS");
    let dtypes = env_or("MODEL_BENCH_DTYPES", "f32");
    let residents: Vec<WeightDType> = env_or("MODEL_BENCH_RESIDENT", "fp32,fp16,q8,q4")
        .split(',')
        .map(|s| s.trim().parse().expect("MODEL_BENCH_RESIDENT"))
        .collect();
    let root = std::env::var("MODEL_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-model"));
    let cold = env_or("MODEL_BENCH_COLD", "1") != "0";

    if let Ok(tok) = std::env::var("MODEL_BENCH_TOKENIZER") {
        let bytes = std::fs::read(&tok).expect("tokenizer file");
        let t = florence2_wasm::processor::tokenizer::Florence2Tokenizer::from_json_bytes(&bytes)
            .expect("tokenizer");
        let ids = t
            .encode_prompt("What does the image describe?")
            .expect("encode");
        assert_eq!(ids, CAPTION_IDS, "hard-coded <CAPTION> ids differ");
        println!("<CAPTION> ids {ids:?} verified against {tok}");
        let ids = t
            .encode_prompt("Locate the objects with category and location.")
            .expect("encode");
        assert_eq!(ids, OD_IDS, "hard-coded <OD> ids differ");
        println!("<OD> ids {ids:?} verified against {tok}");
    }

    let cfg = Florence2Config::from_json_str(BASE_CONFIG).expect("base config");
    // MODEL_BENCH_DEVICE=gpu (default: the wgpu adapter, lavapipe here) | cpu (the CPU backend) | auto.
    let device: DeviceChoice = env_or("MODEL_BENCH_DEVICE", "gpu")
        .parse()
        .expect("MODEL_BENCH_DEVICE");
    let gpu = pollster::block_on(open_device(device, DeviceOptions::default())).expect("device");
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("adapter: {}", gpu.describe());
    println!(
        "machine load (1/5/15 min): {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );

    if env_or("MODEL_BENCH_MEMORY", "0") != "0" {
        let steps: usize = env_or("MODEL_BENCH_MEMORY_STEPS", "4")
            .parse()
            .expect("MODEL_BENCH_MEMORY_STEPS");
        // MODEL_BENCH_MEMORY_MODEL=large: Florence-2-large's shapes (issue 10: fp16 <= 1.8 GB).
        let dir = if env_or("MODEL_BENCH_MEMORY_MODEL", "base") == "large" {
            let json = large_config_json();
            let large = Florence2Config::from_json_str(&json).expect("large config");
            let dir = root.join("large-f32");
            ensure_checkpoint_of(&dir, &large, &json, false).expect("checkpoint");
            dir
        } else {
            let dir = root.join("base-f32");
            ensure_checkpoint(&dir, &cfg, false).expect("checkpoint");
            dir
        };
        memory_table(&gpu, &dir, &residents, steps);
        return;
    }

    println!("\n== kernel ceilings (this run) ==");
    let (g1, v1) = gemm_rate(&gpu, 2304, 512, 2048);
    let (g2, v2) = gemm_rate(&gpu, 585, 768, 3072);
    let gemm = g1.max(g2);
    let copy_gbs = copy_bandwidth(&gpu);
    println!("best GEMM: {g1:.1} GFLOP/s ({v1:?}, 2304x512x2048), {g2:.1} GFLOP/s ({v2:?}, 585x768x3072)");
    println!("copy bandwidth: {copy_gbs:.2} GB/s (read + write)");

    let mut results: Vec<(String, WeightDType, Phases)> = Vec::new();
    for dt in dtypes.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let f16 = match dt {
            "f32" => false,
            "f16" => true,
            other => panic!("unknown dtype {other}"),
        };
        let dir = root.join(format!("base-{dt}"));
        ensure_checkpoint(&dir, &cfg, f16).expect("checkpoint");
        for &resident in &residents {
            println!("\n== {dt} checkpoint, resident {resident} ==");
            // The per-op breakdown launches the GPU kernels on their GPU weight layouts: GPU only.
            let breakdown =
                results.is_empty() && !gpu.is_host() && env_or("MODEL_BENCH_BREAKDOWN", "1") != "0";
            // Kernels are cached per device: only the first run's pass is cold.
            let reuse = results.is_empty() && env_or("MODEL_BENCH_REUSE", "1") != "0";
            let ph = run_model(
                &gpu,
                &dir,
                resident,
                tokens,
                cold && results.is_empty(),
                breakdown,
                reuse,
            );
            results.push((format!("{dt}->{resident}"), resident, ph));
        }
    }

    // MODEL_BENCH_STEP_ROUNDS=N (default 3): the decode step of every resident dtype again, all models
    // loaded at once and the dtypes alternating round by round (the phases above ran one dtype after
    // the other, minutes apart, on a shared machine).
    let rounds: usize = env_or("MODEL_BENCH_STEP_ROUNDS", "3")
        .parse()
        .expect("MODEL_BENCH_STEP_ROUNDS");
    let step_rounds = if rounds > 0 {
        alternating_steps(&gpu, &root.join("base-f32"), &residents, tokens, rounds)
    } else {
        Vec::new()
    };

    let reference = if std::env::var("MODEL_BENCH_NO_REF").is_ok() {
        println!("\nPyTorch reference: skipped (MODEL_BENCH_NO_REF)");
        None
    } else if !reference_available() {
        println!("\nPyTorch reference: not installed (python3 -c 'import torch, transformers' fails): skipped");
        None
    } else {
        println!("\n== PyTorch reference (f32 checkpoint, 2 threads) ==");
        let r = run_reference(&root.join("base-f32"), tokens);
        if let Some(r) = &r {
            println!("{r}");
        }
        r
    };
    let ref_s = |k: &str| {
        reference
            .as_ref()
            .and_then(|r| r.get(k))
            .and_then(|x| x.as_f64())
    };

    for (dt, resident, ph) in &results {
        let steps = &ph.steps_s;
        let step_med = median(steps);
        let step_min = steps.iter().cloned().fold(f64::INFINITY, f64::min);
        let step_max = steps.iter().cloned().fold(0.0, f64::max);
        let vf = vision_flops(&cfg, &ph.grids);
        let pf = projector_flops(&cfg, ph.image_tokens);
        let ef = encoder_flops(&cfg, ph.seq_len);
        let cf = cross_kv_flops(&cfg, ph.seq_len);
        let step_bytes = decode_step_bytes(
            &cfg,
            ph.seq_len,
            tokens / 2,
            weight_bytes_per_elem(*resident, cfg.text.d_model),
        );
        let ratio = |ours: f64, k: &str| match ref_s(k) {
            Some(r) if r > 0.0 => format!("{:>7.2}x", ours / r),
            _ => "      -".to_owned(),
        };
        let refc = |k: &str| match ref_s(k) {
            Some(r) => format!("{:>9.1}", r * 1e3),
            None => "        -".to_owned(),
        };
        let rate = |f: f64, s: f64| {
            let r = f / s / 1e9;
            format!("{:>7.1} GFLOP/s ({:>3.0}% of GEMM)", r, 100.0 * r / gemm)
        };
        println!("\n== results: {dt} checkpoint, <CAPTION> {IMAGE_SIDE}x{IMAGE_SIDE}, {tokens} greedy tokens ==");
        println!(
            "load_dir: {:.2} s, weights on the GPU {:.0} MiB, load peak RSS growth {:.0} MiB",
            ph.load_s,
            mib(ph.weights_bytes),
            mib(ph.load_peak_rss)
        );
        if ph.cold_total_s > 0.0 {
            println!(
                "cold end-to-end (incl. kernel compilation): {:.2} s",
                ph.cold_total_s
            );
        }
        println!(
            "{:<22} {:>10} {:>9} {:>8}  rate",
            "phase (warm)", "ours ms", "torch ms", "ratio"
        );
        println!(
            "{:<22} {:>10.1} {} {}",
            "preprocess (CPU)",
            ph.preprocess_s * 1e3,
            refc("preprocess_s"),
            ratio(ph.preprocess_s, "preprocess_s")
        );
        println!(
            "{:<22} {:>10.1} {} {}  {:.1} GFLOP, {}, {} dispatches",
            "vision (DaViT)",
            ph.vision_s * 1e3,
            refc("vision_s"),
            ratio(ph.vision_s, "vision_s"),
            vf / 1e9,
            rate(vf, ph.vision_s),
            ph.vision_dispatches
        );
        println!(
            "{:<22} {:>10.1} {} {}  {:.2} GFLOP, {}",
            "projector",
            ph.projector_s * 1e3,
            refc("projector_s"),
            ratio(ph.projector_s, "projector_s"),
            pf / 1e9,
            rate(pf, ph.projector_s)
        );
        println!(
            "{:<22} {:>10.1} {} {}  {:.1} GFLOP, {}, {} dispatches, S = {}",
            "encoder (6 layers)",
            ph.encoder_s * 1e3,
            refc("encoder_s"),
            ratio(ph.encoder_s, "encoder_s"),
            ef / 1e9,
            rate(ef, ph.encoder_s),
            ph.encoder_dispatches,
            ph.seq_len
        );
        println!(
            "{:<22} {:>10.1} {:>9} {:>8}  {:.2} GFLOP, {}",
            "cross K/V (6 layers)",
            ph.cross_kv_s * 1e3,
            "-",
            "",
            cf / 1e9,
            rate(cf, ph.cross_kv_s)
        );
        println!(
            "{:<22} {:>10.1} {} {}  min {:.1} max {:.1} ms, {} dispatches, {:.0} MB read -> {:.2} GB/s ({:.0}% of copy)",
            "decode step (median)",
            step_med * 1e3,
            refc("step_greedy_s"),
            ratio(step_med, "step_greedy_s"),
            step_min * 1e3,
            step_max * 1e3,
            ph.step_dispatches,
            step_bytes / 1e6,
            step_bytes / step_med / 1e9,
            100.0 * step_bytes / step_med / 1e9 / copy_gbs
        );
        let model_s = ph.total_s - ph.preprocess_s;
        println!(
            "{:<22} {:>10.1} {} {}  (vision .. last step; + preprocess = {:.1} ms)",
            "total (warm)",
            model_s * 1e3,
            refc("total_greedy_s"),
            ratio(model_s, "total_greedy_s"),
            ph.total_s * 1e3
        );
        let ref_cpu = |k: &str| {
            reference
                .as_ref()
                .and_then(|r| r.get("cpu_s"))
                .and_then(|c| c.get(k))
                .and_then(|x| x.as_f64())
        };
        let cpu_line = |name: &str, ours: f64, k: &str| {
            let (r, q) = match ref_cpu(k) {
                Some(r) if r > 0.0 => (format!("{:.1}", r * 1e3), format!("{:.2}x", ours / r)),
                _ => ("-".to_owned(), "-".to_owned()),
            };
            println!(
                "  CPU time (all threads) {name}: ours {:.1} ms, torch {r} ms, ratio {q}",
                ours * 1e3
            );
        };
        cpu_line("vision", ph.vision_cpu, "vision_s");
        cpu_line("encoder", ph.encoder_cpu, "encoder_s");
        cpu_line("decode step (median)", median(&ph.steps_cpu), "-");
        cpu_line("total warm pass", ph.total_cpu, "total_greedy_s");
        let bmed = median(&ph.beam_steps_s);
        println!(
            "{:<22} {:>10.1} {} {}  {:.2}x our greedy step (torch beam-3 / greedy: {})",
            "beam-3-shaped step",
            bmed * 1e3,
            refc("step_beam3_s"),
            ratio(bmed, "step_beam3_s"),
            bmed / step_med,
            match (ref_s("step_beam3_s"), ref_s("step_greedy_s")) {
                (Some(b), Some(g)) if g > 0.0 => format!("{:.2}x", b / g),
                _ => "-".to_owned(),
            }
        );
        let steps_ms: Vec<String> = steps.iter().map(|s| format!("{:.1}", s * 1e3)).collect();
        println!("decode steps ms: [{}]", steps_ms.join(", "));
        println!(
            "peak RSS: {:.0} MiB in the vision phase, {:.0} MiB over the warm pass (process VmHWM)",
            mib(ph.vision_peak_rss),
            mib(ph.peak_rss)
        );
    }
    if let Some(b) = ref_s("step_beam3_s") {
        println!(
            "\nPyTorch beam-3 decode step (median): {:.1} ms ({:.2}x its greedy step)",
            b * 1e3,
            b / ref_s("step_greedy_s").unwrap_or(f64::NAN)
        );
    }
    println!(
        "\n== resident dtypes side by side (checkpoint->resident; GPU bytes counted by the engine; peak over \
         the warm pass incl. 3-row beam-shaped steps) =="
    );
    println!(
        "{:<12} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8}",
        "dtype",
        "weights",
        "peak GPU",
        "peak act",
        "vision",
        "encoder",
        "step",
        "beam3",
        "MB/step",
        "step/fp32"
    );
    let base_step = results
        .iter()
        .find(|(_, r, _)| *r == WeightDType::Fp32)
        .map(|(_, _, p)| median(&p.steps_s));
    for (dt, resident, ph) in &results {
        let step = median(&ph.steps_s);
        let bytes = decode_step_bytes(
            &cfg,
            ph.seq_len,
            tokens / 2,
            weight_bytes_per_elem(*resident, cfg.text.d_model),
        );
        println!(
            "{:<12} {:>7.0}MB {:>7.0}MB {:>7.0}MB {:>7.0}ms {:>7.0}ms {:>7.1}ms {:>7.1}ms {:>9.0} {:>8}",
            dt,
            ph.weights_bytes as f64 / 1e6,
            ph.peak_gpu as f64 / 1e6,
            ph.peak_act as f64 / 1e6,
            ph.vision_s * 1e3,
            ph.encoder_s * 1e3,
            step * 1e3,
            median(&ph.beam_steps_s) * 1e3,
            bytes / 1e6,
            match base_step {
                Some(b) if b > 0.0 => format!("{:.2}x", step / b),
                _ => "-".to_owned(),
            }
        );
    }
    if !step_rounds.is_empty() {
        println!(
            "\n== decode steps per resident dtype, alternating ({rounds} rounds of {tokens} greedy and \
             {tokens} beam-3 steps through `generate`'s planned steps; medians; CPU = all threads' CPU \
             time, the work, robust to other load on the machine) =="
        );
        println!(
            "{:<6} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9} {:>10}",
            "dtype",
            "MB/step",
            "step ms",
            "step/fp32",
            "CPU ms",
            "CPU/fp32",
            "beam3 ms",
            "beam/fp32",
            "bCPU/fp32"
        );
        let b = &step_rounds[0];
        for r in &step_rounds {
            println!(
                "{:<6} {:>9.0} {:>9.1} {:>8.3}x {:>9.1} {:>9.3}x {:>9.1} {:>8.3}x {:>9.3}x",
                r.dtype.to_string(),
                r.bytes / 1e6,
                r.greedy_ms,
                r.greedy_ms / b.greedy_ms,
                r.greedy_cpu_ms,
                r.greedy_cpu_ms / b.greedy_cpu_ms,
                r.beam_ms,
                r.beam_ms / b.beam_ms,
                r.beam_cpu_ms / b.beam_cpu_ms
            );
        }
    }
    println!(
        "\nfinal process peak RSS: {:.0} MiB",
        mib(proc_status_bytes("VmHWM:"))
    );
}

/// One resident dtype's decode steps in [`alternating_steps`] (ms per step, medians over rounds).
struct StepRow {
    dtype: WeightDType,
    bytes: f64,
    greedy_ms: f64,
    greedy_cpu_ms: f64,
    beam_ms: f64,
    beam_cpu_ms: f64,
}

/// Load the checkpoint once per resident dtype (all kept), attend over one seeded random encoder output
/// (585 tokens; a step's cost does not depend on the values), then `rounds` rounds, each running greedy
/// and beam-3 `generate` (`tokens` steps, no EOS possible, the planned decode steps) for every dtype in
/// turn. The first dtype is the ratio base.
fn alternating_steps(
    gpu: &Arc<Device>,
    dir: &Path,
    residents: &[WeightDType],
    tokens: usize,
    rounds: usize,
) -> Vec<StepRow> {
    use florence2_wasm::model::generate;
    let mut models = Vec::new();
    for &resident in residents {
        let (cfg, w) = weights::load_dir_with(gpu, dir, weights::LoadOptions::with_dtype(resident))
            .expect("load_dir");
        let model = Florence2::new(gpu, cfg.clone(), &w).expect("Florence2::new");
        drop(w);
        let d = cfg.text.d_model;
        let s = 585;
        let mut r = Rng::new(77);
        let enc: Vec<f32> = (0..s * d).map(|_| r.next()).collect();
        let enc = Tensor::from_f32(gpu, &[1, s, d], &enc, "enc").expect("enc");
        let mut rec = Recorder::new(gpu);
        let cross = model.decoder.cross_kv(&mut rec, &enc).expect("cross kv");
        rec.submit().expect("submit");
        wait(gpu);
        let bytes = decode_step_bytes(
            &cfg,
            s,
            tokens / 2,
            weight_bytes_per_elem(resident, cfg.text.d_model),
        );
        models.push((resident, cfg, model, cross, bytes));
    }
    let opts = |beams: usize| util::endless_options(tokens, beams);
    let run = |i: usize, beams: usize| -> (f64, f64) {
        let (_, _, model, cross, _) = &models[i];
        let c = cpu_secs();
        let t = Instant::now();
        let ids = pollster::block_on(generate::generate(
            &model.decoder,
            gpu,
            cross,
            &opts(beams),
            Default::default(),
        ))
        .expect("generate");
        assert_eq!(ids.len(), tokens + 1, "every run makes {tokens} steps");
        (
            t.elapsed().as_secs_f64() * 1e3 / tokens as f64,
            (cpu_secs() - c) * 1e3 / tokens as f64,
        )
    };
    for i in 0..models.len() {
        run(i, 1);
        run(i, 3);
    }
    let mut samples = vec![[Vec::new(), Vec::new(), Vec::new(), Vec::new()]; models.len()];
    for _ in 0..rounds {
        for (i, smp) in samples.iter_mut().enumerate() {
            let (w, c) = run(i, 1);
            smp[0].push(w);
            smp[1].push(c);
            let (w, c) = run(i, 3);
            smp[2].push(w);
            smp[3].push(c);
        }
    }
    models
        .iter()
        .zip(&samples)
        .map(|((dtype, _, _, _, bytes), smp)| StepRow {
            dtype: *dtype,
            bytes: *bytes,
            greedy_ms: median(&smp[0]),
            greedy_cpu_ms: median(&smp[1]),
            beam_ms: median(&smp[2]),
            beam_cpu_ms: median(&smp[3]),
        })
        .collect()
}
