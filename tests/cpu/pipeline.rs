//! The whole model on the CPU backend (`Device::cpu`): the same `Pipeline` (one model definition; every
//! launcher runs its `crate::cpu` kernel on host memory) gives the Python reference's token ids on every
//! fixture case, greedy and 3-beam search, for every checkpoint layout with reference answers.
//!
//! Exact ids, not a tolerance: the CPU kernels compute the reference's f32 definitions, and the fixture
//! cases' top-2 logit margins are far above the backends' few-ulp differences (the GPU suite asserts
//! the same ids on lavapipe).
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use std::sync::Arc;

use common::fixtures::{cases, fixtures, ids_of};
use florence2_wasm::gpu::Device;
use florence2_wasm::pipeline::{Callbacks, Image, NeverCancel, Pipeline, TaskOptions};
use serde_json::Value;

fn cpu() -> Arc<Device> {
    Device::cpu(florence2_wasm::cpu::par::threads())
}

fn prompt_of(case: &Value) -> String {
    format!(
        "{}{}",
        case["task"].as_str().unwrap(),
        case["text_input"].as_str().unwrap()
    )
}

/// Every reference case of `reference` on the checkpoint `model`, greedy and 3 beams.
fn check_model(model: &str, reference: &str) {
    let p = Pipeline::load_dir(&cpu(), &fixtures().join("models").join(model)).unwrap();
    assert!(p.gpu().is_host());
    let cases = cases(reference);
    for case in &cases {
        let bytes = std::fs::read(
            fixtures()
                .join("images")
                .join(case["image"].as_str().unwrap()),
        )
        .unwrap();
        for (beams, kind) in [(1, "greedy"), (3, "beam3")] {
            let o = TaskOptions {
                max_new_tokens: Some(case["max_new_tokens"].as_u64().unwrap() as usize),
                num_beams: Some(beams),
                ..Default::default()
            };
            let out = p
                .run_task_blocking(
                    Image::Encoded(&bytes).into(),
                    &prompt_of(case),
                    &o,
                    &NeverCancel,
                    &Callbacks::default(),
                )
                .unwrap();
            let r = &case["results"][kind];
            let what = format!("{model} {} {} {kind}", case["image"], case["prompt"]);
            assert_eq!(out.token_ids, ids_of(&r["token_ids"]), "{what}");
            assert_eq!(out.generated_text, r["text"].as_str().unwrap(), "{what}");
        }
    }
    eprintln!(
        "{model}: {} cases x 2 decodings equal the reference on the CPU backend",
        cases.len()
    );
}

#[test]
fn every_layout_answers_like_the_reference_on_the_cpu_backend() {
    for (model, reference) in [
        ("tiny2", "tiny2"),
        ("tiny4", "tiny4"),
        ("tiny2-orig", "tiny2-orig"),
        ("tiny4-orig", "tiny4-orig"),
        ("tiny4-f16-sharded", "tiny4-f16-sharded"),
        ("tiny2-mlx-bf16", "tiny2-mlx-bf16"),
        ("tiny4-mlx-bf16", "tiny4-mlx-bf16"),
        ("tiny2-pt", "tiny2"),
        ("tiny2-orig-pt-legacy", "tiny2-orig"),
        ("tiny2-orig-pt-sharded", "tiny2-orig"),
    ] {
        check_model(model, reference);
    }
}

/// The block-quantized checkpoints have no reference of their own: the CPU backend answers exactly as
/// the GPU backend does. Both dequantize the same blocks (`d * q`, exact in f32) and accumulate in
/// f32, so they differ only by summation order, far below the fixture cases' top-2 margins.
#[test]
fn quantized_checkpoints_answer_as_on_the_gpu() {
    for (model, reference) in [
        ("tiny2-q8", "tiny2"),
        ("tiny2-q4", "tiny2"),
        ("tiny2-orig-q4-sharded", "tiny2-orig"),
    ] {
        let dir = fixtures().join("models").join(model);
        let on_cpu = Pipeline::load_dir(&cpu(), &dir).unwrap();
        let on_gpu = Pipeline::load_dir(&common::gpu(), &dir).unwrap();
        for case in &cases(reference) {
            let bytes = std::fs::read(
                fixtures()
                    .join("images")
                    .join(case["image"].as_str().unwrap()),
            )
            .unwrap();
            for beams in [1, 3] {
                let o = TaskOptions {
                    max_new_tokens: Some(case["max_new_tokens"].as_u64().unwrap() as usize),
                    num_beams: Some(beams),
                    ..Default::default()
                };
                let run = |p: &Pipeline| {
                    p.run_task_blocking(
                        Image::Encoded(&bytes).into(),
                        &prompt_of(case),
                        &o,
                        &NeverCancel,
                        &Callbacks::default(),
                    )
                    .unwrap()
                };
                let (c, g) = (run(&on_cpu), run(&on_gpu));
                let what = format!("{model} {} {} beams {beams}", case["image"], case["prompt"]);
                assert_eq!(c.token_ids, g.token_ids, "{what}");
                assert_eq!(c.result_json(), g.result_json(), "{what}");
            }
        }
    }
}

/// A soak on the CPU backend: 100 mixed calls (tasks, greedy and beams, on images and on kept
/// encodings, a refused prompt among them) leave the host memory the engine counts where it was after
/// loading: every activation, cache and encoding is released.
#[test]
fn hundred_mixed_calls_return_memory_to_its_baseline() {
    let p = Pipeline::load_dir(&cpu(), &fixtures().join("models").join("tiny4")).unwrap();
    let baseline = p.memory().current_bytes;
    let images: Vec<Vec<u8>> = ["scene.png", "grey.png"]
        .iter()
        .map(|n| std::fs::read(fixtures().join("images").join(n)).unwrap())
        .collect();
    let prompts = [
        "<OD>",
        "<CAPTION>",
        "<OCR_WITH_REGION>",
        "<CAPTION_TO_PHRASE_GROUNDING>a cat",
        "<NOT_A_TASK>",
    ];
    let mut refused = 0;
    for i in 0..100 {
        let bytes = &images[i % images.len()];
        let o = TaskOptions {
            max_new_tokens: Some(6 + i % 5),
            num_beams: Some(1 + i % 3),
            ..Default::default()
        };
        let encoded = (i % 4 == 0).then(|| p.encode_image(Image::Encoded(bytes)).unwrap());
        let input = match &encoded {
            Some(e) => e.into(),
            None => Image::Encoded(bytes).into(),
        };
        match p.run_task_blocking(
            input,
            prompts[i % prompts.len()],
            &o,
            &NeverCancel,
            &Callbacks::default(),
        ) {
            Ok(out) => assert!(out.token_ids.len() >= 2, "call {i}"),
            Err(e) => {
                assert!(
                    prompts[i % prompts.len()].starts_with("<NOT"),
                    "call {i}: {e}"
                );
                refused += 1;
            }
        }
    }
    assert_eq!(refused, 20);
    assert_eq!(
        p.memory().current_bytes,
        baseline,
        "host memory after 100 calls"
    );
    eprintln!("CPU soak: 100 calls, {baseline} bytes before and after");
}

/// `florence2 run --cpu-dot auto|int8|exact` chooses the CPU backend's quantized decode dots: with
/// each, the CLI gives the ids of this process's pipeline on the same weights with that dot
/// (`with_quant_dot`); `FLORENCE2_CPU_QUANT_DOT` chooses when the flag is absent, and the default is
/// `auto`: int8 for q4, exact for q8 (`serve` takes the same flag). The case (tiny2, `<OD>`, 60 greedy
/// tokens) is one whose int8 and exact answers differ in both formats, so a choice that did not reach
/// the engine fails.
#[test]
fn cli_cpu_dot_chooses_the_quantized_dots() {
    use florence2_wasm::cpu::qdot_int8::{with_quant_dot, QuantDot};
    use florence2_wasm::weights::{LoadOptions, WeightDType};
    let dir = fixtures().join("models").join("tiny2");
    let image = fixtures().join("images").join("scene.png");
    let bytes = std::fs::read(&image).unwrap();
    let o = TaskOptions {
        max_new_tokens: Some(60),
        num_beams: Some(1),
        ..Default::default()
    };
    let in_process = |dtype: WeightDType| {
        let p = Pipeline::load_dir_with(&cpu(), &dir, LoadOptions::with_dtype(dtype)).unwrap();
        let ids = |d: QuantDot| {
            with_quant_dot(d, || {
                let input = Image::Encoded(&bytes).into();
                let cb = Callbacks::default();
                p.run_task_blocking(input, "<OD>", &o, &NeverCancel, &cb)
                    .unwrap()
                    .token_ids
            })
        };
        let (exact, int8) = (ids(QuantDot::Exact), ids(QuantDot::Int8));
        assert_ne!(exact, int8, "{dtype}: the case's two answers differ");
        (exact, int8)
    };
    let cli = |dtype: &str, flag: Option<&str>, env: Option<&str>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_florence2"));
        cmd.env_remove("FLORENCE2_CPU_QUANT_DOT");
        if let Some(v) = env {
            cmd.env("FLORENCE2_CPU_QUANT_DOT", v);
        }
        cmd.args(["run", "--device", "cpu", "--dtype", dtype, "--task", "<OD>"])
            .args(["--num-beams", "1", "--max-new-tokens", "60", "--json"])
            .arg("--model")
            .arg(&dir)
            .arg("--image")
            .arg(&image);
        if let Some(f) = flag {
            cmd.args(["--cpu-dot", f]);
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{dtype} {flag:?} {env:?}: {err}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        ids_of(&v["token_ids"])
    };
    let (exact, int8) = in_process(WeightDType::Q4);
    assert_eq!(
        cli("q4", Some("exact"), Some("int8")),
        exact,
        "--cpu-dot exact"
    );
    assert_eq!(
        cli("q4", Some("int8"), Some("exact")),
        int8,
        "--cpu-dot int8"
    );
    assert_eq!(
        cli("q4", Some("auto"), Some("exact")),
        int8,
        "q4 --cpu-dot auto"
    );
    assert_eq!(
        cli("q4", None, Some("exact")),
        exact,
        "FLORENCE2_CPU_QUANT_DOT=exact"
    );
    assert_eq!(cli("q4", None, None), int8, "q4's default");
    let (exact, int8) = in_process(WeightDType::Q8);
    assert_eq!(cli("q8", None, None), exact, "q8's default");
    assert_eq!(
        cli("q8", None, Some("int8")),
        int8,
        "FLORENCE2_CPU_QUANT_DOT=int8"
    );
    // `serve` takes the same flag, and names a bad value before it loads anything.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_florence2"))
        .args(["serve", "--model", "x", "--cpu-dot", "fast"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("unknown quantized dot 'fast'"), "{err}");
}
