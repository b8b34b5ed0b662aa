//! The library `Pipeline` (src/pipeline/) on the committed fixtures (tests/fixtures, see its README):
//! - a task on an `EncodedImage` gives exactly the answer (token ids, generated text, result JSON,
//!   rendering) of the same task on the image itself, for every reference case and several tasks in a
//!   row on one encoding; both equal the Python reference's ids (greedy and 3-beam search);
//! - `florence2 run --task A --task B ...` prints the JSON array of the single-task runs;
//! - cancellation before the encoder and mid-decode, with the pipeline usable afterwards;
//! - stage and token callbacks; an encoding from another pipeline and bad prompts/options are refused.
//!
//! Identity is exact (not a tolerance): the same features tensor feeds the same kernels in the same
//! order, so any difference would be a bug in the reuse path.
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use std::cell::RefCell;
use std::collections::BTreeMap;

use common::fixtures::{cases, cli_run, fixtures, ids_of};
use common::gpu;
use florence2_wasm::pipeline::{
    Callbacks, CancelToken, EncodedImage, Image, NeverCancel, Pipeline, Stage, TaskOptions,
    TaskOutput,
};
use florence2_wasm::Error;
use serde_json::Value;

fn load(dir: &str) -> Pipeline {
    Pipeline::load_dir(&gpu(), &fixtures().join("models").join(dir)).unwrap()
}

fn image_bytes(name: &str) -> Vec<u8> {
    std::fs::read(fixtures().join("images").join(name)).unwrap()
}

fn prompt_of(case: &Value) -> String {
    format!(
        "{}{}",
        case["task"].as_str().unwrap(),
        case["text_input"].as_str().unwrap()
    )
}

fn options(case: &Value, beams: usize) -> TaskOptions {
    TaskOptions {
        max_new_tokens: Some(case["max_new_tokens"].as_u64().unwrap() as usize),
        num_beams: Some(beams),
        ..Default::default()
    }
}

fn run(
    p: &Pipeline,
    input: florence2_wasm::pipeline::TaskInput<'_>,
    prompt: &str,
    o: &TaskOptions,
) -> TaskOutput {
    p.run_task_blocking(input, prompt, o, &NeverCancel, &Callbacks::default())
        .unwrap()
}

fn assert_same(a: &TaskOutput, b: &TaskOutput, what: &str) {
    assert_eq!(a.task, b.task, "{what}");
    assert_eq!(a.token_ids, b.token_ids, "{what}: token ids");
    assert_eq!(a.generated_text, b.generated_text, "{what}: text");
    assert_eq!(a.result_json(), b.result_json(), "{what}: result");
    assert_eq!(a.text, b.text, "{what}: rendering");
    assert_eq!(a.image_size, b.image_size, "{what}: image size");
}

#[test]
fn tasks_on_an_encoded_image_equal_tasks_on_the_image() {
    for dir in ["tiny2", "tiny4"] {
        let p = load(dir);
        let cases = cases(dir);
        // Every case from its image (the reference), then every case again on one encoding per image,
        // all tasks of an image in a row (the features must survive each task unchanged).
        let mut fresh = BTreeMap::new();
        for (i, case) in cases.iter().enumerate() {
            let bytes = image_bytes(case["image"].as_str().unwrap());
            for (beams, kind) in [(1, "greedy"), (3, "beam3")] {
                let out = run(
                    &p,
                    Image::Encoded(&bytes).into(),
                    &prompt_of(case),
                    &options(case, beams),
                );
                let r = &case["results"][kind];
                let what = format!("{dir} {} {} {kind}", case["image"], case["prompt"]);
                assert_eq!(
                    out.token_ids,
                    ids_of(&r["token_ids"]),
                    "{what}: vs reference"
                );
                assert_eq!(out.generated_text, r["text"].as_str().unwrap(), "{what}");
                assert!(!out.reused_image);
                fresh.insert((i, beams), out);
            }
        }
        let mut images: BTreeMap<&str, EncodedImage> = BTreeMap::new();
        for case in &cases {
            let name = case["image"].as_str().unwrap();
            images
                .entry(name)
                .or_insert_with(|| p.encode_image(Image::Encoded(&image_bytes(name))).unwrap());
        }
        for round in 0..2 {
            for (i, case) in cases.iter().enumerate() {
                let img = &images[case["image"].as_str().unwrap()];
                for beams in [1, 3] {
                    let out = run(&p, img.into(), &prompt_of(case), &options(case, beams));
                    let what = format!(
                        "{dir} {} {} beams {beams} round {round}",
                        case["image"], case["prompt"]
                    );
                    assert!(out.reused_image, "{what}");
                    assert_eq!(out.timings.vision_ms, 0.0, "{what}: vision skipped");
                    assert_same(&fresh[&(i, beams)], &out, &what);
                }
            }
        }
        eprintln!(
            "{dir}: {} cases x 2 decodings identical on encoded images",
            cases.len()
        );
    }
}

#[test]
fn cli_runs_several_tasks_on_one_image_as_a_json_array() {
    let dir = "tiny4";
    let cases = cases(dir);
    // The cases on scene.png: several tasks on one image.
    let on_scene: Vec<&Value> = cases.iter().filter(|c| c["image"] == "scene.png").collect();
    assert!(
        on_scene.len() >= 2,
        "fixture has several tasks on scene.png"
    );
    let singles: Vec<Value> = on_scene
        .iter()
        .map(|c| {
            let mut c = (*c).clone();
            c["max_new_tokens"] = 20.into();
            cli_run(dir, &c, &["--num-beams", "1"])
        })
        .collect();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_florence2"));
    // The kernel tuner's cache goes under target/, not the user's cache directory.
    cmd.env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"));
    cmd.env("NODEVICE_SELECT", "1").args([
        "run",
        "--model",
        fixtures().join("models").join(dir).to_str().unwrap(),
        "--image",
        fixtures().join("images/scene.png").to_str().unwrap(),
        "--num-beams",
        "1",
        "--max-new-tokens",
        "20",
        "--json",
    ]);
    for c in &on_scene {
        cmd.args([
            "--task",
            c["task"].as_str().unwrap(),
            "--text",
            c["text_input"].as_str().unwrap(),
        ]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all: Value = serde_json::from_slice(&out.stdout).unwrap();
    let all = all.as_array().expect("a JSON array");
    assert_eq!(all.len(), singles.len());
    for (a, s) in all.iter().zip(&singles) {
        for k in ["task", "token_ids", "generated_text", "result", "text"] {
            assert_eq!(a[k], s[k], "{k}");
        }
    }
    assert!(
        all[1]["timings_ms"]["vision"].as_f64().unwrap() == 0.0,
        "second task reuses the encoding"
    );
}

#[test]
fn cancellation_before_the_encoder_and_mid_decode_leaves_the_pipeline_usable() {
    let p = load("tiny4");
    let case = &cases("tiny4")[0];
    let bytes = image_bytes(case["image"].as_str().unwrap());
    let prompt = prompt_of(case);
    let o = options(case, 1);
    let baseline = run(&p, Image::Encoded(&bytes).into(), &prompt, &o);
    assert!(
        baseline.token_ids.len() > 4,
        "the case decodes a few tokens"
    );

    let token = CancelToken::new();
    token.cancel();
    let stages = RefCell::new(Vec::new());
    let on_stage = |s: Stage| stages.borrow_mut().push(s);
    let cb = Callbacks {
        on_stage: Some(&on_stage),
        on_token: None,
    };
    let e = p
        .run_task_blocking(Image::Encoded(&bytes).into(), &prompt, &o, &token, &cb)
        .unwrap_err();
    assert!(matches!(e, Error::Cancelled), "{e}");
    assert!(
        !stages.borrow().contains(&Stage::Encoder),
        "stopped before the encoder"
    );

    // Cancel from the token callback after 2 tokens: the next step's check stops it.
    let token = CancelToken::new();
    let seen = RefCell::new(0);
    let on_token = |_: &str, _: u32| {
        *seen.borrow_mut() += 1;
        if *seen.borrow() == 2 {
            token.cancel();
        }
    };
    let cb = Callbacks {
        on_stage: None,
        on_token: Some(&on_token),
    };
    let e = p
        .run_task_blocking(Image::Encoded(&bytes).into(), &prompt, &o, &token, &cb)
        .unwrap_err();
    assert!(matches!(e, Error::Cancelled), "{e}");
    assert_eq!(*seen.borrow(), 2, "no step after the cancel");

    let again = run(&p, Image::Encoded(&bytes).into(), &prompt, &o);
    assert_same(&baseline, &again, "after cancellations");
}

#[test]
fn callbacks_report_stages_in_order_and_every_token() {
    let p = load("tiny4");
    let case = &cases("tiny4")[0];
    let bytes = image_bytes(case["image"].as_str().unwrap());
    let img = p.encode_image(Image::Encoded(&bytes)).unwrap();
    for beams in [1, 3] {
        for encoded in [false, true] {
            let stages = RefCell::new(Vec::new());
            let tokens = RefCell::new((String::new(), Vec::new()));
            let on_stage = |s: Stage| stages.borrow_mut().push(s);
            let on_token = |piece: &str, id: u32| {
                let mut t = tokens.borrow_mut();
                t.0.push_str(piece);
                t.1.push(id);
            };
            let cb = Callbacks {
                on_stage: Some(&on_stage),
                on_token: Some(&on_token),
            };
            let input = if encoded {
                (&img).into()
            } else {
                Image::Encoded(&bytes).into()
            };
            let out = p
                .run_task_blocking(
                    input,
                    &prompt_of(case),
                    &options(case, beams),
                    &NeverCancel,
                    &cb,
                )
                .unwrap();
            let mut want = vec![
                Stage::Preprocess,
                Stage::Vision,
                Stage::Encoder,
                Stage::Decode,
                Stage::Postprocess,
            ];
            if encoded {
                want.drain(..2);
            }
            assert_eq!(*stages.borrow(), want, "beams {beams} encoded {encoded}");
            let (text, ids) = tokens.into_inner();
            assert_eq!(
                ids,
                out.token_ids[1..],
                "every token but the start token, in order"
            );
            let rest = p.tokenizer().decode(&out.token_ids[1..], false).unwrap();
            assert_eq!(text, rest, "the pieces make up the answer's text");
        }
    }
}

#[test]
fn foreign_encodings_and_bad_requests_are_named_errors() {
    let a = load("tiny2");
    let b = load("tiny2");
    let bytes = image_bytes("scene.png");
    let img = a.encode_image(Image::Encoded(&bytes)).unwrap();
    assert_eq!(
        img.image_size(),
        (image::image_dimensions(fixtures().join("images/scene.png")).unwrap())
    );
    let o = TaskOptions::greedy();
    let e = b
        .run_task_blocking(
            (&img).into(),
            "<CAPTION>",
            &o,
            &NeverCancel,
            &Callbacks::default(),
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidInput(_)), "{e}");
    let e = a
        .run_task_blocking(
            (&img).into(),
            "<NOPE>",
            &o,
            &NeverCancel,
            &Callbacks::default(),
        )
        .unwrap_err();
    assert!(matches!(e, Error::Prompt(_)), "{e}");
    let bad = TaskOptions {
        num_beams: Some(0),
        ..Default::default()
    };
    let e = a
        .run_task_blocking(
            (&img).into(),
            "<CAPTION>",
            &bad,
            &NeverCancel,
            &Callbacks::default(),
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidInput(_)), "{e}");
    let e = a.encode_image(Image::Encoded(b"not an image")).unwrap_err();
    assert!(matches!(e, Error::Image(_)), "{e}");
    // Still usable.
    run(
        &a,
        (&img).into(),
        "<CAPTION>",
        &TaskOptions {
            max_new_tokens: Some(4),
            ..o
        },
    );
}

#[test]
fn repeated_requests_hold_the_same_memory_and_release_it() {
    // Every request allocates its buffers (vision arena, encoder scratch, cross K/V, KV caches sized to
    // its max_new_tokens) and releases them when it ends: three identical `<OD>` beam-search requests
    // must give the same answer, the same peak and the same number of buffer allocations, and leave the
    // activation bytes where they were (only the weights stay resident). A device of its own: memory
    // counters are per device, and other tests run in parallel.
    let g = std::sync::Arc::new(
        pollster::block_on(florence2_wasm::gpu::Device::new(Default::default())).unwrap(),
    );
    let p = Pipeline::load_dir(&g, &fixtures().join("models").join("tiny2")).unwrap();
    let bytes = image_bytes("scene.png");
    let o = TaskOptions {
        max_new_tokens: Some(12),
        num_beams: Some(3),
        ..Default::default()
    };
    let base = g.memory();
    let mut seen = Vec::new();
    for i in 0..3 {
        let before = g.memory();
        g.reset_peak_memory();
        let out = run(&p, Image::Encoded(&bytes).into(), "<OD>", &o);
        let m = g.memory();
        assert_eq!(
            m.activations_bytes, base.activations_bytes,
            "request {i} left activations behind"
        );
        assert_eq!(m.weights_bytes, base.weights_bytes);
        let allocs = m.allocations - before.allocations;
        let peak = m.peak_activations_bytes - before.activations_bytes;
        eprintln!("request {i}: peak activations {peak} B, {allocs} buffers");
        seen.push((out.token_ids, peak, allocs));
    }
    assert!(seen.windows(2).all(|w| w[0] == w[1]), "{seen:?}");
}

#[test]
fn the_vision_phase_holds_no_pixel_tensor_and_decoding_no_spent_features() {
    // The pipeline uploads the pixels from the CPU straight into the vision tower's arena, so its
    // vision phase holds exactly what DaViT + projector hold when run on a pixel tensor, minus that
    // tensor (1 x 3 x H x W f32): the counted bytes differ by exactly the pixels. (A pipeline that
    // kept a pixel tensor through the forward, as before, would show equal peaks.) A device of its
    // own: memory counters are per device, and other tests run in parallel.
    let g = std::sync::Arc::new(
        pollster::block_on(florence2_wasm::gpu::Device::new(Default::default())).unwrap(),
    );
    let p = Pipeline::load_dir(&g, &fixtures().join("models").join("tiny2")).unwrap();
    let (h, w) = (p.processor().height, p.processor().width);
    let pixel_bytes = (3 * h * w * 4) as u64;
    let bytes = image_bytes("scene.png");

    let before = g.memory();
    g.reset_peak_memory();
    let px = florence2_wasm::gpu::Tensor::zeros(
        &g,
        &[1, 3, h, w],
        florence2_wasm::gpu::DType::F32,
        "pixels",
    )
    .unwrap();
    let feats = p.model().encode_image(&px).unwrap();
    let with_tensor = g.memory().peak_activations_bytes - before.activations_bytes;
    drop((feats, px));
    assert_eq!(g.memory().activations_bytes, before.activations_bytes);

    g.reset_peak_memory();
    let img = p.encode_image(Image::Encoded(&bytes)).unwrap();
    let m = g.memory();
    let pipeline = m.peak_activations_bytes - before.activations_bytes;
    eprintln!(
        "vision phase: {pipeline} B through the pipeline, {with_tensor} B with a pixel tensor \
         ({pixel_bytes} B)"
    );
    assert_eq!(pipeline + pixel_bytes, with_tensor);
    // Only the image features stay.
    assert_eq!(
        m.activations_bytes - before.activations_bytes,
        img.byte_size()
    );

    // While decoding, a task on an image holds no image features of its own (the encoder has read
    // them): with `img` held by the caller in both runs, the activations at the first token are the
    // same as for the task on `img` itself (keeping them would add one more set of features).
    let greedy = TaskOptions {
        max_new_tokens: Some(4),
        num_beams: Some(1),
        ..Default::default()
    };
    let at_first_token = |input: florence2_wasm::pipeline::TaskInput<'_>| -> u64 {
        let seen = RefCell::new(None);
        let on_token = |_: &str, _: u32| {
            seen.borrow_mut()
                .get_or_insert_with(|| g.memory().activations_bytes);
        };
        let cb = Callbacks {
            on_token: Some(&on_token),
            ..Default::default()
        };
        p.run_task_blocking(input, "<CAPTION>", &greedy, &NeverCancel, &cb)
            .unwrap();
        seen.into_inner().expect("a token")
    };
    let on_image = at_first_token(Image::Encoded(&bytes).into());
    let on_encoding = at_first_token((&img).into());
    eprintln!("at the first token: {on_image} B (on the image), {on_encoding} B (on the encoding)");
    assert_eq!(on_image, on_encoding);
}
