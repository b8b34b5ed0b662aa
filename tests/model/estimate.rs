//! The memory estimate (`src/estimate/`) against what the engine allocates, on every fixture model and
//! weight format:
//! - `weights_bytes` equals the resident weight bytes the engine counts after the load, to the byte,
//!   for every checkpoint whose tensors the estimate reads from safetensors headers; where such a
//!   checkpoint has a `final_logits_bias` (original layout) it is counted, and the loader drops it when
//!   it is all zeros (only its values tell): then the estimate is that tensor's bytes above. For the
//!   PyTorch fixtures (no header read) it is an upper bound that exceeds the count by at most what an
//!   unknown layout may add (the transposed `image_projection` kept f32, a `final_logits_bias`, an LM
//!   head stored apart).
//! - `peak_bytes` (for the request's own prompt length) is at least a whole `<OD>` request's measured
//!   peak (beam search as the model's generation config says, the default `max_new_tokens`, so the KV
//!   caches span the position table) and at most the image features' bytes above it: the estimate
//!   keeps the features through decoding (a reused `EncodedImage` holds them there; a fresh image's are
//!   released before), which is its only slack (0 B where the vision phase is the peak).
//!
//! One device of its own, used by one test at a time (memory counters are per device).
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use std::sync::{Arc, Mutex, OnceLock};

use common::fixtures::fixtures;
use florence2_wasm::estimate::{EstimateOptions, ModelFacts};
use florence2_wasm::gpu::{Device, MemReport};
use florence2_wasm::pipeline::{Callbacks, Image, NeverCancel, Pipeline, TaskOptions, Usage};
use florence2_wasm::weights::{DTypePlan, DirFiles, LoadOptions, WeightDType};

/// A device of this file's own, one user at a time.
fn device() -> std::sync::MutexGuard<'static, Arc<Device>> {
    static GPU: OnceLock<Mutex<Arc<Device>>> = OnceLock::new();
    GPU.get_or_init(|| Mutex::new(pollster::block_on(Device::new(Default::default())).unwrap()))
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

fn model_dirs() -> Vec<String> {
    let mut dirs: Vec<String> = std::fs::read_dir(fixtures().join("models"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    dirs
}

fn facts(dir: &str) -> ModelFacts {
    let files = DirFiles::new(&fixtures().join("models").join(dir));
    pollster::block_on(ModelFacts::read(&files)).unwrap()
}

fn opts(g: &Device) -> EstimateOptions {
    EstimateOptions {
        max_binding: g.caps.max_storage_binding,
        ..Default::default()
    }
}

#[test]
fn weights_bytes_equal_what_the_engine_holds_after_loading() {
    let g = device();
    let (mut exact, mut with_bias) = (0, 0);
    for dir in model_dirs() {
        let f = facts(&dir);
        for dtype in WeightDType::ALL {
            let est = f.estimate(dtype, &opts(&g)).unwrap();
            let before = g.memory().weights_bytes;
            let p = Pipeline::load_dir_with(
                &g,
                &fixtures().join("models").join(&dir),
                LoadOptions::with_dtype(dtype),
            )
            .unwrap();
            let held = g.memory().weights_bytes - before;
            drop(p);
            eprintln!(
                "{dir} {dtype}: estimate {} B, engine {held} B (exact: {}, stored {})",
                est.weights_bytes, est.exact, est.stored
            );
            let cfg = &f.config;
            let (v, d) = (cfg.text.vocab_size, cfg.text.d_model);
            let bias = 4 * v as u64;
            if est.exact {
                assert_eq!(est.weights_bytes, held, "{dir} {dtype}");
                exact += 1;
            } else if est.stored != "unknown" {
                // Headers read: the only difference is the all-zero final_logits_bias the loader drops.
                assert_eq!(est.weights_bytes, held + bias, "{dir} {dtype}");
                with_bias += 1;
            } else {
                // A final_logits_bias, image_projection f32, an LM head apart (all f32 at most).
                let c = *cfg.vision.embed_dim.last().unwrap();
                let slack = bias + (4 * d * c + 4 * v * d) as u64;
                assert!(
                    est.weights_bytes >= held && est.weights_bytes - held <= slack,
                    "{dir} {dtype}: estimate {} vs {held} (slack {slack})",
                    est.weights_bytes
                );
            }
        }
    }
    // 5 fixtures exact, 5 with an all-zero final_logits_bias (original layout), 3 PyTorch ones.
    assert_eq!((exact, with_bias), (4 * 5, 4 * 5));
}

/// Load `dir` as `dtype` on `g` and run `<OD>` on `image` (3 beams, the defaults): the memory held
/// before the request (the weights), the request's peak above it, and its token usage.
fn od_request(
    g: &Arc<Device>,
    dir: &str,
    dtype: WeightDType,
    image: &[u8],
) -> (MemReport, u64, Usage) {
    let p = Pipeline::load_dir_with(
        g,
        &fixtures().join("models").join(dir),
        LoadOptions::with_dtype(dtype),
    )
    .unwrap();
    let base = g.memory();
    g.reset_peak_memory();
    let out = p
        .run_task_blocking(
            Image::Encoded(image).into(),
            "<OD>",
            &TaskOptions::default(),
            &NeverCancel,
            &Callbacks::default(),
        )
        .unwrap();
    let peak = g.memory().peak_bytes - base.activations_bytes;
    (base, peak, out.usage)
}

#[test]
fn peak_bytes_bound_a_whole_request() {
    let g = device();
    let image = std::fs::read(fixtures().join("images").join("scene.png")).unwrap();
    for dir in ["tiny2", "tiny4"] {
        let f = facts(dir);
        for dtype in WeightDType::ALL {
            let (_, peak, usage) = od_request(&g, dir, dtype, &image);
            // The estimate for this request's prompt length.
            let o = EstimateOptions {
                prompt_tokens: usage.prompt_tokens,
                ..opts(&g)
            };
            let est = f.estimate(dtype, &o).unwrap();
            let image_tokens = usage.encoder_tokens - usage.prompt_tokens;
            let features = (4 * image_tokens * f.config.text.d_model) as u64;
            eprintln!(
                "{dir} {dtype}: peak estimate {} B (weights {}, vision {}, encoder {}, decode {}), \
                 measured {peak} B, {:+} B; with the default 32-token prompt {} B",
                est.peak_bytes,
                est.weights_bytes,
                est.vision_bytes,
                est.encoder_bytes,
                est.decode_bytes,
                est.peak_bytes as i64 - peak as i64,
                f.estimate(dtype, &opts(&g)).unwrap().peak_bytes,
            );
            assert!(
                est.peak_bytes >= peak,
                "{dir} {dtype}: {} < {peak}",
                est.peak_bytes
            );
            assert!(
                est.peak_bytes - peak <= features,
                "{dir} {dtype}: {} over, more than the features' {features}",
                est.peak_bytes - peak
            );
        }
    }
}

#[test]
fn the_cpu_backend_holds_what_its_estimate_says() {
    // The CPU backend pads no convolution weight and allocates one channel-attention scratch less.
    let g = Device::cpu(1);
    let image = std::fs::read(fixtures().join("images").join("scene.png")).unwrap();
    for dir in ["tiny2", "tiny4"] {
        let f = facts(dir);
        for dtype in [WeightDType::Fp32, WeightDType::Q4] {
            let (base, peak, usage) = od_request(&g, dir, dtype, &image);
            let o = EstimateOptions {
                prompt_tokens: usage.prompt_tokens,
                host: true,
                max_binding: g.caps.max_storage_binding,
                ..Default::default()
            };
            let est = f.estimate(dtype, &o).unwrap();
            let features =
                (4 * (usage.encoder_tokens - usage.prompt_tokens) * f.config.text.d_model) as u64;
            eprintln!(
                "cpu {dir} {dtype}: weights {} / {} B, peak {} / {peak} B",
                est.weights_bytes, base.weights_bytes, est.peak_bytes
            );
            assert_eq!(est.weights_bytes, base.weights_bytes, "{dir} {dtype}");
            assert!(
                est.peak_bytes >= peak && est.peak_bytes - peak <= features,
                "{dir} {dtype}: {} vs {peak}",
                est.peak_bytes
            );
        }
    }
}

/// `florence2` with `args` (the kernel cache under target/), its stdout as JSON.
fn cli(args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_florence2"))
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?}: {stderr}");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn cli_dtype_auto_reports_its_choice_and_estimate_agrees_with_the_load() {
    let model = fixtures().join("models").join("tiny2");
    let model = model.to_str().unwrap();
    let image = fixtures().join("images").join("scene.png");
    let run = cli(&[
        "run",
        "--model",
        model,
        "--image",
        image.to_str().unwrap(),
        "--task",
        "<OD>",
        "--dtype",
        "auto",
        "--device",
        "gpu",
        "--tuning",
        "off",
        "--json",
    ]);
    // Every format fits a tiny model: auto takes fp16.
    assert_eq!(run["dtype"], "fp16");
    let reason = run["dtype_reason"].as_str().unwrap();
    assert!(reason.starts_with("auto chose fp16"), "{reason}");
    let est = cli(&["estimate", "--model", model, "--device", "gpu"]);
    assert_eq!(est["auto"]["dtype"], "fp16");
    let fp16 = est["estimates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["dtype"] == "fp16")
        .unwrap();
    assert_eq!(fp16["weights_bytes"], run["memory"]["weights_bytes"]);
    assert_eq!(fp16["fits"], true);
    // The four formats and the two mixes auto considers.
    assert_eq!(est["estimates"].as_array().unwrap().len(), 6);
    let one = cli(&[
        "estimate", "--model", model, "--device", "gpu", "--dtype", "q4",
    ]);
    assert_eq!(one["estimates"].as_array().unwrap().len(), 1);
    assert!(one.get("auto").is_none());
}

#[test]
fn a_mix_estimates_the_bytes_the_engine_holds_per_part() {
    // A mix's weights equal the engine's count to the byte (headers read, no bias), and the CLI's
    // estimate and run agree on them and name the mix.
    let g = device();
    let mix: DTypePlan = "vision=fp16,text=q4".parse().unwrap();
    for dir in ["tiny2", "tiny4"] {
        let f = facts(dir);
        let est = f.estimate(mix, &opts(&g)).unwrap();
        assert!(est.exact, "{dir}");
        let before = g.memory().weights_bytes;
        let p = Pipeline::load_dir_with(
            &g,
            &fixtures().join("models").join(dir),
            LoadOptions::with_dtype(mix),
        )
        .unwrap();
        let held = g.memory().weights_bytes - before;
        assert_eq!(p.weight_dtype(), mix);
        drop(p);
        assert_eq!(est.weights_bytes, held, "{dir}");
        assert_eq!(est.part_bytes.sum(), held, "{dir}");
        let fp16 = f.estimate(WeightDType::Fp16, &opts(&g)).unwrap().part_bytes;
        assert_eq!(est.part_bytes.vision, fp16.vision, "{dir}");
    }
    drop(g);
    let model = fixtures().join("models").join("tiny2");
    let model = model.to_str().unwrap();
    let image = fixtures().join("images").join("scene.png");
    let run = cli(&[
        "run",
        "--model",
        model,
        "--image",
        image.to_str().unwrap(),
        "--task",
        "<OD>",
        "--dtype",
        "text=q4,vision=fp16",
        "--device",
        "gpu",
        "--tuning",
        "off",
        "--json",
    ]);
    assert_eq!(run["dtype"], "vision=fp16,text=q4");
    let est = cli(&[
        "estimate",
        "--model",
        model,
        "--device",
        "gpu",
        "--dtype",
        "vision=fp16,text=q4",
    ]);
    let one = est["estimates"].as_array().unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0]["dtype"], "vision=fp16,text=q4");
    assert_eq!(one[0]["weights_bytes"], run["memory"]["weights_bytes"]);
    let parts = &one[0]["part_bytes"];
    let sum: u64 = ["vision", "projector", "encoder", "decoder", "embed"]
        .iter()
        .map(|p| parts[p].as_u64().unwrap())
        .sum();
    assert_eq!(Some(sum), one[0]["weights_bytes"].as_u64());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_florence2"))
        .args([
            "estimate",
            "--model",
            model,
            "--dtype",
            "vision=fp16,txt=q4",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("unknown model part 'txt'") && err.contains("vision, projector"),
        "{err}"
    );
}
