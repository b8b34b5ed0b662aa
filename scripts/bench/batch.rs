//! Batched decode-step benchmark: the time of one decoder step for R requests (greedy, one row each)
//! run one after another, each its own recorded step and submit (`Decoder::step_planned`, how the
//! server ran them before batching), against one `Decoder::step_batch` for all R, with the CPU time of
//! recording the batched step; R = 1, 2, 4, 8, on the committed demo model (or `BATCH_BENCH_MODEL=DIR`),
//! its resident weights fp16 (`BATCH_BENCH_DTYPE`), on `BATCH_BENCH_DEVICE` (gpu, the default, or cpu).
//! Cross K/V come from the model's encoder on its sample images. Then the vision tower and the encoder
//! (with the cross K/V) for B = 2, 4, 8 images or prompts, one at a time against one batch. Alternating
//! rounds, medians.
//!
//! `cargo bench --bench batch`; under `cargo test` (no `--bench` argument) it only builds.

use std::sync::Arc;
use std::time::Instant;

#[path = "util.rs"]
mod util;
use util::cpu_secs;

use florence2_wasm::gpu::{Device, DeviceOptions, Recorder};
use florence2_wasm::model::bart::DecoderState;
use florence2_wasm::pipeline::{cpu_device, Callbacks, Image, NeverCancel, Pipeline, TaskInput};
use florence2_wasm::weights::{LoadOptions, WeightDType};

const STEPS: usize = 8;
const ROUNDS: usize = 5;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::var("BATCH_BENCH_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| root.join("www/models/florence2-shapes"));
    let dtype: WeightDType = std::env::var("BATCH_BENCH_DTYPE")
        .unwrap_or_else(|_| "fp16".into())
        .parse()
        .expect("dtype");
    let gpu: Arc<Device> = match std::env::var("BATCH_BENCH_DEVICE").as_deref() {
        Ok("cpu") => cpu_device(),
        _ => pollster::block_on(Device::new(DeviceOptions::default())).expect("a GPU adapter"),
    };
    let p = Pipeline::load_dir_with(&gpu, &dir, LoadOptions::with_dtype(dtype)).expect("model");
    println!("{} on {}, {dtype:?}", dir.display(), gpu.describe());
    let samples: Vec<Vec<u8>> = std::fs::read_dir(dir.join("samples"))
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "png"))
                .map(|p| std::fs::read(p).expect("sample"))
                .collect()
        })
        .unwrap_or_default();
    let image = |i: usize| samples[i % samples.len()].clone();
    let dec = &p.model().decoder;
    let crosses: Vec<_> = (0..8)
        .map(|i| {
            let bytes = image(i);
            let tp = p.tasks().parse("<CAPTION>").expect("prompt");
            let input = TaskInput::Image(Image::Encoded(&bytes));
            let o = Default::default();
            let pr =
                pollster::block_on(p.prepare(input, tp, &o, &NeverCancel, &Callbacks::default()));
            pr.expect("prepare")
        })
        .collect();
    vision(&p);
    encoder(&p);
    println!(
        "R | one at a time ms/step | batched ms/step | ratio | batched record CPU ms \
         | replayed ms/step | replayed record CPU ms"
    );
    for r in [1usize, 2, 4, 8] {
        let states: Vec<DecoderState> = crosses[..r]
            .iter()
            .map(|pr| {
                dec.new_state(&gpu, pr.cross(), 1, STEPS + 1)
                    .expect("state")
            })
            .collect();
        let scratch = dec.batch_scratch(&gpu, r).expect("scratch");
        let mut states = states;
        let (mut alone, mut batched, mut record) = (Vec::new(), Vec::new(), Vec::new());
        let (mut replayed, mut replay_cpu) = (Vec::new(), Vec::new());
        // The batched step recorded once (what DecodeBatch replays while its tasks stay the same).
        let mut plan = None;
        for round in 0..=ROUNDS {
            // Alone: each request's planned step, its own submit, waited for.
            let t = Instant::now();
            for pos in 0..STEPS as u32 {
                for s in states.iter_mut() {
                    s.write_tokens(&[2 + pos]).expect("tokens");
                    let mut rec = Recorder::new(&gpu);
                    dec.step_planned(&mut rec, pos, s).expect("step");
                    rec.submit().expect("submit");
                    gpu.wait_idle().expect("wait");
                }
            }
            let a = t.elapsed().as_secs_f64() * 1e3 / STEPS as f64;
            // Batched: one step for all, one submit, waited for; recorded anew, then replayed.
            let (b, cpu) = batched_steps(&gpu, &states, &mut |rec, refs| {
                dec.step_batch(rec, refs, &scratch)
            });
            let (c, cpu_replay) = batched_steps(&gpu, &states, &mut |rec, refs| {
                rec.replay_cached(&mut plan, |rec| dec.step_batch(rec, refs, &scratch))
            });
            if round > 0 {
                alone.push(a);
                batched.push(b);
                record.push(cpu);
                replayed.push(c);
                replay_cpu.push(cpu_replay);
            }
        }
        let (a, b) = (median(alone), median(batched));
        println!(
            "{r} | {a:.2} | {b:.2} | {:.2}x | {:.2} | {:.2} | {:.2}",
            a / b,
            median(record),
            median(replayed),
            median(replay_cpu)
        );
    }
}

/// STEPS batched decoder steps of `states`, each recorded by `record`, submitted and waited for: (wall ms
/// per step, CPU ms per step of recording and submitting).
fn batched_steps(
    gpu: &Arc<Device>,
    states: &[DecoderState],
    record: &mut dyn FnMut(&mut Recorder, &[&DecoderState]) -> florence2_wasm::Result<()>,
) -> (f64, f64) {
    let t = Instant::now();
    let mut cpu = 0.0;
    for pos in 0..STEPS as u32 {
        for s in states {
            s.write_tokens(&[2 + pos]).expect("tokens");
            s.write_step(pos).expect("step");
        }
        let c = cpu_secs();
        let mut rec = Recorder::new(gpu);
        let refs: Vec<&DecoderState> = states.iter().collect();
        record(&mut rec, &refs).expect("batched step");
        rec.submit().expect("submit");
        cpu += cpu_secs() - c;
        gpu.wait_idle().expect("wait");
    }
    let per = |x: f64| x * 1e3 / STEPS as f64;
    (per(t.elapsed().as_secs_f64()), per(cpu))
}

/// The vision tower + projector for B images: one at a time vs one batch of B (and whether each image's
/// features are bit-identical either way).
fn vision(p: &Pipeline) {
    use florence2_wasm::gpu::readback;
    let dir_px = |seed: usize| -> Vec<f32> {
        let cfg = p.processor();
        let n = 3 * cfg.height * cfg.width;
        (0..n)
            .map(|i| (((i * 31 + seed * 17) % 255) as f32 / 127.5) - 1.0)
            .collect()
    };
    let cfg = p.processor();
    let (h, w) = (cfg.height, cfg.width);
    let gpu = p.gpu();
    println!("B | vision one at a time ms | batched ms | ratio | bit-identical");
    for b in [2usize, 4, 8] {
        let imgs: Vec<Vec<f32>> = (0..b).map(dir_px).collect();
        let (mut one, mut all) = (Vec::new(), Vec::new());
        let mut same = true;
        for round in 0..=3 {
            let t = Instant::now();
            let singles: Vec<_> = imgs
                .iter()
                .map(|v| p.model().encode_pixels(v, [1, 3, h, w]).expect("vision"))
                .collect();
            gpu.wait_idle().expect("wait");
            let a = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            let cat: Vec<f32> = imgs.concat();
            let batch = p
                .model()
                .encode_pixels_batch(&cat, [b, 3, h, w])
                .expect("batch");
            gpu.wait_idle().expect("wait");
            let c = t.elapsed().as_secs_f64() * 1e3;
            if round == 0 {
                let got = readback::to_f32_blocking(gpu, &batch).expect("read");
                let per = got.len() / b;
                for (i, s) in singles.iter().enumerate() {
                    let want = readback::to_f32_blocking(gpu, s).expect("read");
                    same &= got[i * per..(i + 1) * per]
                        .iter()
                        .zip(&want)
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                }
            } else {
                one.push(a);
                all.push(c);
            }
        }
        let (a, c) = (median(one), median(all));
        println!("{b} | {a:.1} | {c:.1} | {:.2}x | {same}", a / c);
    }
}

/// The BART encoder + cross-attention K/V for B `<CAPTION>` prompts on B images' features: one at a
/// time (`Florence2::encode_prompt`) vs one batch (`Florence2::encode_prompts`).
fn encoder(p: &Pipeline) {
    let cfg = p.processor();
    let (h, w) = (cfg.height, cfg.width);
    let gpu = p.gpu();
    let prompt = p.tasks().parse("<CAPTION>").expect("task").encoder_text();
    let ids = p.tokenizer().encode_prompt(&prompt).expect("ids");
    let feats: Vec<_> = (0..8)
        .map(|seed| {
            let px: Vec<f32> = (0..3 * h * w)
                .map(|i| (((i * 13 + seed * 29) % 255) as f32 / 127.5) - 1.0)
                .collect();
            p.model().encode_pixels(&px, [1, 3, h, w]).expect("vision")
        })
        .collect();
    println!("B | encoder one at a time ms | batched ms | ratio");
    for b in [2usize, 4, 8] {
        let (mut one, mut all) = (Vec::new(), Vec::new());
        for round in 0..=ROUNDS {
            let t = Instant::now();
            let singles: Vec<_> = feats[..b]
                .iter()
                .map(|f| p.model().encode_prompt(f, &ids).expect("encoder"))
                .collect();
            gpu.wait_idle().expect("wait");
            let a = t.elapsed().as_secs_f64() * 1e3;
            drop(singles);
            let t = Instant::now();
            let pairs: Vec<_> = feats[..b].iter().map(|f| (f, &ids[..])).collect();
            let batch = p.model().encode_prompts(&pairs).expect("batch");
            gpu.wait_idle().expect("wait");
            let c = t.elapsed().as_secs_f64() * 1e3;
            drop(batch);
            if round > 0 {
                one.push(a);
                all.push(c);
            }
        }
        let (a, c) = (median(one), median(all));
        println!("{b} | {a:.2} | {c:.2} | {:.2}x", a / c);
    }
}
