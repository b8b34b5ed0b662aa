//! BART encoder, decoder and greedy generation against the Python reference (transformers'
//! `Florence2ForConditionalGeneration`, fp32, eager attention) on the committed fixtures
//! (`tests/fixtures/models/<cfg>`, `tests/fixtures/reference/<cfg>`; see tests/fixtures/README.md).
//!
//! Tolerances (f32 everywhere, both sides): the encoder output and the first-step logits are compared
//! with an absolute tolerance of 1e-4 x max(1, peak |reference|). Each LayerNorm'd activation is O(1..10);
//! every op contributes f32 rounding (~6e-8 relative) accumulated over K <= 192-term dot products and a
//! handful of layers in a different summation order than PyTorch's, which puts honest differences around
//! 1e-6..1e-5 relative; 1e-4 relative leaves headroom for that while still catching any real defect (a
//! wrong position offset, norm order or head split moves outputs by O(0.1..1)). Generated token ids and
//! texts must be identical: the fixture script picked seeds whose greedy top-1 / top-2 logit margin is
//! >= 2e-3 at every step, far above the logits error measured here.
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use common::fixtures::{cases, cli_run, fixtures, ids_of, options_of};

use std::sync::Arc;

use common::{gpu, max_diff};
use florence2_wasm::gpu::{readback, Device, Recorder, Tensor};
use florence2_wasm::model::bart::{Decoder, Encoder};
use florence2_wasm::model::florence2::Florence2;
use florence2_wasm::model::generate::{self, GenerateOptions};
use florence2_wasm::model::Florence2Config;
use florence2_wasm::processor::image::{
    decode_image, preprocess, ImageLimits, ImageProcessorConfig,
};
use florence2_wasm::processor::parse_task_prompt;
use florence2_wasm::processor::tokenizer::Florence2Tokenizer;
use florence2_wasm::weights::{self, Weights, FINAL_LOGITS_BIAS};

const CFGS: [&str; 2] = ["tiny2", "tiny4"];

struct Loaded {
    gpu: Arc<Device>,
    cfg: Florence2Config,
    weights: Weights,
}

fn load(cfg_name: &str) -> Loaded {
    let g = gpu();
    let (cfg, weights) =
        weights::load_dir(&g, &fixtures().join("models").join(cfg_name)).expect("fixture model");
    Loaded {
        gpu: g,
        cfg,
        weights,
    }
}

fn encoder(l: &Loaded) -> Encoder {
    Encoder::new(
        &l.cfg.text,
        l.weights.pp("model").pp("language_model").pp("encoder"),
    )
    .unwrap()
}

fn decoder(l: &Loaded) -> Decoder {
    let t = &l.cfg.text;
    let shared = l
        .weights
        .get(
            "model.language_model.shared.weight",
            &[t.vocab_size, t.d_model],
        )
        .unwrap();
    let lm_head = if l.weights.has("lm_head.weight") {
        l.weights
            .get("lm_head.weight", &[t.vocab_size, t.d_model])
            .unwrap()
    } else {
        shared.clone()
    };
    let flb = l
        .weights
        .has(FINAL_LOGITS_BIAS)
        .then(|| l.weights.get_any(FINAL_LOGITS_BIAS).unwrap());
    Decoder::new(
        t,
        l.weights.pp("model").pp("language_model").pp("decoder"),
        shared,
        lm_head,
        flb,
    )
    .unwrap()
}

/// (shape, values) of one tensor of the reference activations.
fn activation(cfg_name: &str, name: &str) -> (Vec<usize>, Vec<f32>) {
    let path = fixtures()
        .join("reference")
        .join(cfg_name)
        .join("activations.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(name).unwrap();
    assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
    (
        t.shape().to_vec(),
        bytemuck::pod_collect_to_vec::<u8, f32>(t.data()),
    )
}

/// The reference processor's pixel values of one fixture image.
fn pixel_reference(cfg_name: &str, image: &str) -> (Vec<usize>, Vec<f32>) {
    let path = fixtures()
        .join("reference")
        .join(cfg_name)
        .join("pixels.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(image).unwrap();
    (
        t.shape().to_vec(),
        bytemuck::pod_collect_to_vec::<u8, f32>(t.data()),
    )
}

fn check_rel(name: &str, got: &[f32], want: &[f32]) {
    let (d, peak) = max_diff(got, want);
    let tol = 1e-4 * peak.max(1.0);
    eprintln!("{name}: max |diff| = {d:.3e}, peak {peak:.3e}, tol {tol:.1e}");
    assert!(got.iter().all(|v| v.is_finite()), "{name}: non-finite");
    assert!(d <= tol, "{name}: max |diff| {d:e} > {tol:e}");
}

#[test]
fn encoder_output_matches_reference() {
    for name in CFGS {
        let l = load(name);
        let enc = encoder(&l);
        let (shape, emb) = activation(name, "encoder.inputs_embeds");
        let (_, want) = activation(name, "encoder.out");
        let x = Tensor::from_f32(&l.gpu, &shape, &emb, "inputs_embeds").unwrap();
        let mut rec = Recorder::new(&l.gpu);
        let out = enc.forward(&mut rec, &x).unwrap();
        rec.submit().unwrap();
        assert_eq!(out.shape(), &shape[..]);
        let got = readback::to_f32_blocking(&l.gpu, &out).unwrap();
        check_rel(&format!("{name} encoder.out"), &got, &want);
    }
}

#[test]
fn first_step_logits_match_reference() {
    for name in CFGS {
        let l = load(name);
        let dec = decoder(&l);
        let (shape, enc_out) = activation(name, "encoder.out");
        let (_, want) = activation(name, "decoder.logits0");
        let h = Tensor::from_f32(&l.gpu, &shape, &enc_out, "encoder_out").unwrap();
        let mut rec = Recorder::new(&l.gpu);
        let cross = dec.cross_kv(&mut rec, &h).unwrap();
        rec.submit().unwrap();
        let mut state = dec.new_state(&l.gpu, &cross, 1, 4).unwrap();
        state
            .write_tokens(&[l.cfg.text.decoder_start_token_id])
            .unwrap();
        let mut rec = Recorder::new(&l.gpu);
        let logits = dec.step_planned(&mut rec, 0, &mut state).unwrap();
        rec.submit().unwrap();
        let got = readback::to_f32_blocking(&l.gpu, &logits).unwrap();
        check_rel(&format!("{name} decoder.logits0"), &got, &want);
    }
}

/// Greedy generation from the reference encoder input of the activations case (scene.png, <CAPTION>):
/// BART + decoding loop + logits processors, independent of the vision tower and the processor.
#[test]
fn greedy_from_reference_encoder_input_matches_reference_ids() {
    for name in CFGS {
        let l = load(name);
        let enc = encoder(&l);
        let dec = decoder(&l);
        let (shape, emb) = activation(name, "encoder.inputs_embeds");
        let x = Tensor::from_f32(&l.gpu, &shape, &emb, "inputs_embeds").unwrap();
        let mut rec = Recorder::new(&l.gpu);
        let hidden = enc.forward(&mut rec, &x).unwrap();
        let cross = dec.cross_kv(&mut rec, &hidden).unwrap();
        rec.submit().unwrap();
        let case = cases(name)
            .into_iter()
            .find(|c| c["image"] == "scene.png" && c["task"] == "<CAPTION>")
            .expect("the activations case");
        let max_new = case["max_new_tokens"].as_u64().unwrap() as usize;
        let mut checked = 0;
        for (kind, r) in case["results"].as_object().unwrap() {
            if r["kwargs"]["num_beams"].as_u64() != Some(1) {
                continue;
            }
            let opts = options_of(r, max_new);
            let got = pollster::block_on(generate::greedy(&dec, &l.gpu, &cross, &opts, &|| false))
                .unwrap();
            let want = ids_of(&r["token_ids"]);
            eprintln!("{name} {kind}: {} tokens", got.len());
            assert_eq!(got, want, "{name} {kind}");
            checked += 1;
        }
        assert!(
            checked >= 2,
            "{name}: expected greedy and greedy_nrng0 results"
        );
    }
}

#[test]
fn generation_is_cancellable_and_bounded() {
    let l = load("tiny2");
    let enc = encoder(&l);
    let dec = decoder(&l);
    let (shape, emb) = activation("tiny2", "encoder.inputs_embeds");
    let x = Tensor::from_f32(&l.gpu, &shape, &emb, "inputs_embeds").unwrap();
    let mut rec = Recorder::new(&l.gpu);
    let hidden = enc.forward(&mut rec, &x).unwrap();
    let cross = dec.cross_kv(&mut rec, &hidden).unwrap();
    rec.submit().unwrap();
    let mut opts = GenerateOptions::from_config(&l.cfg, 5);
    // Cancelled before the first step.
    let err =
        pollster::block_on(generate::greedy(&dec, &l.gpu, &cross, &opts, &|| true)).unwrap_err();
    assert!(matches!(err, florence2_wasm::Error::Cancelled), "{err}");
    // No EOS id reachable (an id past the vocabulary): generation stops at max_new_tokens, and a
    // huge max_new_tokens is capped by max_position_embeddings (the decoder's position table).
    opts.eos_token_ids = vec![u32::MAX];
    opts.forced_eos_token_id = None;
    let got = pollster::block_on(generate::greedy(&dec, &l.gpu, &cross, &opts, &|| false)).unwrap();
    assert_eq!(got.len(), 6);
    assert_eq!(got[0], l.cfg.text.decoder_start_token_id);
    opts.max_new_tokens = 100_000;
    let got = pollster::block_on(generate::greedy(&dec, &l.gpu, &cross, &opts, &|| false)).unwrap();
    assert_eq!(got.len(), l.cfg.text.max_position_embeddings);
    opts.max_new_tokens = 0;
    let got = pollster::block_on(generate::greedy(&dec, &l.gpu, &cross, &opts, &|| false)).unwrap();
    assert_eq!(got, vec![l.cfg.text.decoder_start_token_id]);
}

// ---- the whole pipeline: image file -> processor -> model -> tokenizer ------------------------------

struct Pipeline {
    model: Florence2,
    tok: Florence2Tokenizer,
    pre: ImageProcessorConfig,
}

fn pipeline(cfg_name: &str) -> Pipeline {
    let l = load(cfg_name);
    let dir = fixtures().join("models").join(cfg_name);
    let tok =
        Florence2Tokenizer::from_json_bytes(&std::fs::read(dir.join("tokenizer.json")).unwrap())
            .unwrap();
    let pre = ImageProcessorConfig::from_json_bytes(
        &std::fs::read(dir.join("preprocessor_config.json")).unwrap(),
    )
    .unwrap();
    Pipeline {
        model: Florence2::new(&l.gpu, l.cfg, &l.weights).unwrap(),
        tok,
        pre,
    }
}

impl Pipeline {
    fn pixels(&self, image: &str) -> Tensor {
        let bytes = std::fs::read(fixtures().join("images").join(image)).unwrap();
        let rgb = decode_image(&bytes, &ImageLimits::default()).unwrap();
        let px = preprocess(&rgb, &self.pre).unwrap();
        Tensor::from_f32(
            self.model.gpu(),
            &[1, 3, self.pre.height, self.pre.width],
            &px,
            "pixels",
        )
        .unwrap()
    }

    fn prompt_ids(&self, prompt: &str) -> Vec<u32> {
        let tp = parse_task_prompt(prompt).unwrap();
        self.tok.encode_prompt(&tp.encoder_text()).unwrap()
    }
}

/// scene.png + <CAPTION> through the processor and the whole model: the encoder input (vision tower +
/// projector + prompt embedding, concatenated) and the encoder output match the reference's.
#[test]
fn full_pipeline_encoder_matches_reference() {
    for name in CFGS {
        let p = pipeline(name);
        let ids = p.prompt_ids("<CAPTION>");
        let enc = p.model.encode(&p.pixels("scene.png"), &ids).unwrap();
        let (shape, want_in) = activation(name, "encoder.inputs_embeds");
        let (_, want_out) = activation(name, "encoder.out");
        assert_eq!(enc.inputs_embeds.shape(), &shape[..]);
        let g = p.model.gpu();
        let got_in = readback::to_f32_blocking(g, &enc.inputs_embeds).unwrap();
        let got_out = readback::to_f32_blocking(g, &enc.hidden).unwrap();
        check_rel(
            &format!("{name} pipeline encoder.inputs_embeds"),
            &got_in,
            &want_in,
        );
        check_rel(&format!("{name} pipeline encoder.out"), &got_out, &want_out);
    }
}

/// Every fixture case, every greedy result (num_beams 1; with and without no-repeat-n-gram): identical
/// token ids and decoded text (special tokens kept) from the image file.
#[test]
fn full_pipeline_greedy_matches_reference_on_every_case() {
    for name in CFGS {
        let p = pipeline(name);
        let mut checked = 0;
        for case in cases(name) {
            let image = case["image"].as_str().unwrap();
            let prompt = case["prompt"].as_str().unwrap();
            let ids = p.prompt_ids(prompt);
            assert_eq!(
                ids,
                ids_of(&case["prompt_ids"]),
                "{name} {prompt}: prompt ids"
            );
            let px = p.pixels(image);
            // For information: the processor's pixels vs the reference processor's (the processor's
            // own tests own that tolerance; here the token ids below are what must match).
            let (_, want_px) = pixel_reference(name, image);
            let got_px = readback::to_f32_blocking(p.model.gpu(), &px).unwrap();
            let (d, _) = max_diff(&got_px, &want_px);
            eprintln!("{name} {image}: pixels max |diff| vs reference processor {d:.3e}");
            let enc = p.model.encode(&px, &ids).unwrap();
            let max_new = case["max_new_tokens"].as_u64().unwrap() as usize;
            for (kind, r) in case["results"].as_object().unwrap() {
                if r["kwargs"]["num_beams"].as_u64() != Some(1) {
                    continue;
                }
                let opts = options_of(r, max_new);
                let got =
                    pollster::block_on(p.model.generate(&enc.cross, &opts, Default::default()))
                        .unwrap();
                let text = p.tok.decode(&got, false).unwrap();
                assert_eq!(
                    got,
                    ids_of(&r["token_ids"]),
                    "{name} {image} {prompt} {kind}"
                );
                assert_eq!(
                    text,
                    r["text"].as_str().unwrap(),
                    "{name} {image} {prompt} {kind}"
                );
                checked += 1;
            }
        }
        eprintln!("{name}: {checked} greedy results identical");
        assert!(checked >= 12, "{name}: only {checked} greedy results");
    }
}

/// HF-native prompts carry one `<image>` placeholder per feature: the features replace them (the
/// reference's masked_scatter), which must give the same encoder input as prepending the features.
#[test]
fn image_placeholders_are_replaced_by_features() {
    let p = pipeline("tiny4");
    let case = &cases("tiny4")[0];
    let with_ph = ids_of(&case["input_ids"]);
    let n_img = case["num_image_tokens"].as_u64().unwrap() as usize;
    assert_eq!(with_ph.len(), n_img + ids_of(&case["prompt_ids"]).len());
    let px = p.pixels(case["image"].as_str().unwrap());
    let a = p.model.encode(&px, &with_ph).unwrap();
    let b = p.model.encode(&px, &ids_of(&case["prompt_ids"])).unwrap();
    let g = p.model.gpu();
    let (ea, eb) = (
        readback::to_f32_blocking(g, &a.inputs_embeds).unwrap(),
        readback::to_f32_blocking(g, &b.inputs_embeds).unwrap(),
    );
    assert_eq!(ea, eb);
    // A placeholder count that does not match the features is a named error.
    let err = p.model.encode(&px, &with_ph[1..]).unwrap_err();
    assert!(
        matches!(err, florence2_wasm::Error::InvalidInput(_)),
        "{err}"
    );
    // So is an id outside the vocabulary, and a prompt longer than the position table.
    let err = p.model.encode(&px, &[0, u32::MAX, 2]).unwrap_err();
    assert!(
        matches!(err, florence2_wasm::Error::InvalidInput(_)),
        "{err}"
    );
    let long = vec![5u32; p.model.config.text.max_position_embeddings];
    let err = p.model.encode(&px, &long).unwrap_err();
    assert!(
        matches!(err, florence2_wasm::Error::InvalidInput(_)),
        "{err}"
    );
}

// ---- the CLI: `florence2 run --json` ------------------------------------------------------------------

/// `florence2 run --num-beams 1 --json` (the other generation settings from the model dir's
/// generation_config.json, i.e. the reference's greedy kwargs) gives the reference's greedy ids and text: every case of the HF-native
/// fixtures, and the first case of every other layout / dtype (original names, mlx bf16, f16 shards).
#[test]
fn cli_run_json_matches_reference_greedy() {
    let dirs = [
        ("tiny2", usize::MAX),
        ("tiny4", usize::MAX),
        ("tiny2-orig", 1),
        ("tiny4-orig", 1),
        ("tiny2-mlx-bf16", 1),
        ("tiny4-mlx-bf16", 1),
        ("tiny4-f16-sharded", 1),
    ];
    for (dir, n) in dirs {
        for case in cases(dir).iter().take(n) {
            let r = &case["results"]["greedy"];
            let j = cli_run(dir, case, &["--num-beams", "1"]);
            let what = format!("{dir} {} {}", case["image"], case["prompt"]);
            assert_eq!(j["task"], case["task"], "{what}");
            assert_eq!(ids_of(&j["token_ids"]), ids_of(&r["token_ids"]), "{what}");
            assert_eq!(j["generated_text"], r["text"], "{what}");
            for k in ["load", "preprocess", "vision", "encoder", "decode"] {
                assert!(j["timings_ms"][k].as_f64().unwrap() >= 0.0, "{what}: {k}");
            }
            assert!(j["result"].is_object(), "{what}: {j}");
            eprintln!(
                "{what}: identical ({} tokens)",
                r["token_ids"].as_array().unwrap().len()
            );
        }
    }
}

#[test]
fn cli_run_usage_errors() {
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_florence2"))
            .env("NODEVICE_SELECT", "1")
            .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
            .args(args)
            .output()
            .unwrap()
    };
    let model = fixtures().join("models/tiny2");
    let image = fixtures().join("images/scene.png");
    let (m, i) = (model.to_str().unwrap(), image.to_str().unwrap());
    // Unknown task marker, bad --max-new-tokens, missing --image: usage errors (exit 2).
    for args in [
        vec!["run", "--model", m, "--image", i, "--task", "<NOPE>"],
        vec![
            "run",
            "--model",
            m,
            "--image",
            i,
            "--task",
            "<OD>",
            "--max-new-tokens",
            "x",
        ],
        vec!["run", "--model", m, "--task", "<OD>"],
    ] {
        let out = run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
    // A missing model dir is a runtime error (exit 1).
    let out = run(&[
        "run",
        "--model",
        "/nonexistent",
        "--image",
        i,
        "--task",
        "<OD>",
    ]);
    assert_eq!(out.status.code(), Some(1));
}
