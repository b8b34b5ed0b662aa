//! Continuous batching (`pipeline::DecodeBatch`) on the committed demo model: tasks of every kind, greedy
//! and beam search (1 to 3 beams), with token limits that cut some answers, join a running batch at
//! different steps and leave as they finish; each answer (token ids, generated text, result) equals the
//! same task run alone, exactly, and the streamed tokens are the answer's. On lavapipe with fp32 and fp16
//! weights (f32 / f16 KV caches), and on the CPU backend. Exact equality, no tolerance: a batched step's
//! rows do not depend on each other (tests/model/text_decoder.rs checks the logits bit for bit), so any
//! difference is a bug.
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{fixtures, gpu};
use florence2_wasm::gpu::Device;
use florence2_wasm::pipeline::{
    cpu_device, BatchEvent, Callbacks, DecodeBatch, Image, NeverCancel, Pipeline, TaskInput,
    TaskOptions, TaskOutput,
};
use florence2_wasm::weights::{LoadOptions, WeightDType};
use serde_json::Value;

/// (image bytes, prompt, options, the batch step it joins at).
type Request = (Vec<u8>, String, TaskOptions, usize);

fn requests() -> Vec<Request> {
    let dir = fixtures::demo_model().join("samples");
    let meta: Value =
        serde_json::from_slice(&std::fs::read(dir.join("targets.json")).unwrap()).unwrap();
    let mut out = Vec::new();
    for (si, s) in meta.as_array().unwrap().iter().take(3).enumerate() {
        let bytes = std::fs::read(dir.join(s["file"].as_str().unwrap())).unwrap();
        for (ti, (task, t)) in s["targets"].as_object().unwrap().iter().enumerate() {
            let n = out.len();
            let options = TaskOptions {
                num_beams: Some(1 + n % 3),
                max_new_tokens: Some(if n % 4 == 3 { 9 } else { 96 }),
                ..Default::default()
            };
            let prompt = format!("{task}{}", t["text_input"].as_str().unwrap());
            out.push((
                bytes.clone(),
                prompt,
                options,
                [0, 0, 1, 3, 7][(si + ti) % 5],
            ));
        }
    }
    out
}

fn alone(p: &Pipeline, r: &Request) -> TaskOutput {
    let input = TaskInput::Image(Image::Encoded(&r.0));
    p.run_task_blocking(input, &r.1, &r.2, &NeverCancel, &Callbacks::default())
        .unwrap()
}

/// Run `reqs` through one batch, each joining at its step (`cancel_at`: (request, step) to cancel).
/// Returns the answers, the streamed ids per request, and the most tasks decoding together.
/// What a batched run gave: each task's answer and streamed tokens, the most tasks that decoded together,
/// and (batched steps, of them recorded anew).
type Batched = (
    BTreeMap<usize, TaskOutput>,
    BTreeMap<usize, Vec<u32>>,
    usize,
    (usize, usize),
);

fn batched(p: &Pipeline, reqs: &[Request], cancel_at: Option<(usize, usize)>) -> Batched {
    let mut batch = DecodeBatch::new(p);
    let (mut done, mut streamed) = (BTreeMap::new(), BTreeMap::<usize, Vec<u32>>::new());
    let mut most = 0;
    for step in 0.. {
        for (i, r) in reqs.iter().enumerate().filter(|(_, r)| r.3 == step) {
            let tp = p.tasks().parse(&r.1).unwrap();
            let input = TaskInput::Image(Image::Encoded(&r.0));
            let prepared =
                pollster::block_on(p.prepare(input, tp, &r.2, &NeverCancel, &Callbacks::default()))
                    .unwrap();
            batch.add(i, prepared).unwrap();
        }
        if let Some((who, at)) = cancel_at {
            if at == step {
                assert_eq!(batch.cancel(|&t| t == who), vec![who]);
            }
        }
        if batch.is_empty() && reqs.iter().all(|r| r.3 < step) {
            break;
        }
        most = most.max(batch.len());
        for ev in pollster::block_on(batch.step()) {
            match ev {
                BatchEvent::Tokens(i, t) => {
                    streamed.entry(i).or_default().extend(t.iter().map(|x| x.1))
                }
                BatchEvent::Done(i, out) => {
                    done.insert(i, (*out).unwrap());
                }
            }
        }
    }
    (done, streamed, most, batch.batched_steps())
}

fn check_on(g: &Arc<Device>, dtype: WeightDType) {
    let p = Pipeline::load_dir_with(g, &fixtures::demo_model(), LoadOptions::with_dtype(dtype))
        .unwrap();
    let reqs = requests();
    assert!(reqs.len() >= 10, "{} requests", reqs.len());
    let want: Vec<TaskOutput> = reqs.iter().map(|r| alone(&p, r)).collect();
    let (got, streamed, most, (steps, recorded)) = batched(&p, &reqs, None);
    let what = format!("{} {dtype:?}", g.describe());
    assert!(most >= 4, "{what}: at most {most} tasks decoded together");
    // A batched step is recorded once per set of tasks (a join or a leave) and replayed otherwise; the
    // CPU backend runs what it records, every step.
    let joins_and_leaves = 2 * reqs.len();
    if g.is_host() {
        assert_eq!(recorded, steps, "{what}");
    } else {
        assert!(
            recorded <= joins_and_leaves && recorded < steps,
            "{what}: {recorded} of {steps} batched steps recorded anew"
        );
    }
    assert_eq!(got.len(), reqs.len());
    for (i, w) in want.iter().enumerate() {
        let o = &got[&i];
        let q = &reqs[i].1;
        assert_eq!(o.token_ids, w.token_ids, "{what}: {q} ({:?})", reqs[i].2);
        assert_eq!(o.generated_text, w.generated_text, "{what}: {q}");
        assert_eq!(o.result_json(), w.result_json(), "{what}: {q}");
        assert_eq!(o.usage, w.usage, "{what}: {q}");
        assert_eq!(streamed[&i], w.token_ids[1..], "{what}: {q} streamed");
    }
    // Answers of different lengths (some cut by the limit), so tasks really left at different steps.
    let lens: std::collections::BTreeSet<usize> = want.iter().map(|w| w.token_ids.len()).collect();
    assert!(lens.len() >= 4, "{what}: answer lengths {lens:?}");

    // A task cancelled mid-batch leaves it; the others' answers do not change.
    let (got, _, _, _) = batched(&p, &reqs[..5], Some((1, 2)));
    assert!(!got.contains_key(&1));
    for i in [0, 2, 3, 4] {
        assert_eq!(
            got[&i].token_ids, want[i].token_ids,
            "{what}: after a cancel"
        );
    }
}

#[test]
fn batched_decoding_equals_each_task_alone_on_the_gpu() {
    check_on(&gpu(), WeightDType::Fp32);
    check_on(&gpu(), WeightDType::Fp16);
}

#[test]
fn batched_decoding_equals_each_task_alone_on_the_cpu_backend() {
    check_on(&cpu_device(), WeightDType::Fp32);
}
