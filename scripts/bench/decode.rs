//! Decode-step benchmark: beam search (3 beams) vs greedy, time per decoder step, on a decoder with
//! Florence-2-base's shapes (d_model 768, 6 layers, 12 heads, ffn 3072, vocabulary 51328) and random
//! weights, built in memory (HF-native names and shapes from `weights::expected::expected_tensors`; no
//! checkpoint file needed), against random cross-attention K/V of a base-sized encoder output (577 image
//! tokens + a 10-token prompt).
//!
//! `cargo bench --bench decode` (`DECODE_BENCH_STEPS=N` steps per run, default 24). Both modes run the
//! same number of decoder steps (no EOS can occur: its id is outside the vocabulary; no forced tokens;
//! no-repeat-n-gram 3 as the model card), in the same process, one warm-up run each (pipeline compilation,
//! staging buffers) excluded, then alternating timed runs; the median per-step time of each is reported,
//! with the ratio. A step includes the decoder for every row, the readback and (beam) log-softmax, top-k,
//! cache reorder and the CPU bookkeeping. Then a breakdown: the decoder step alone for 1 and 3 rows, and
//! log-softmax + top-16 of 3 vocabulary rows, and the CPU cost of one decoder step (record + submit,
//! the GPU's execution excluded) recorded at every call (`Decoder::step`) vs replayed from the plan
//! recorded once per request (`Decoder::step_planned`, what greedy and beam search use), side by side. Under `cargo test` (no `--bench` argument) it only builds.

use std::sync::Arc;
use std::time::Instant;

use florence2_wasm::gpu::{DType, Gpu, GpuOptions, Recorder, Tensor};
use florence2_wasm::model::bart::Decoder;
use florence2_wasm::model::generate::{self, EarlyStopping, GenerateOptions};
use florence2_wasm::model::Florence2Config;
use florence2_wasm::weights::expected::expected_tensors;
use florence2_wasm::weights::Weights;

/// Xorshift in [-a, a): deterministic, dependency-free.
struct Rng(u64);
impl Rng {
    fn fill(&mut self, n: usize, a: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                ((self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * a
            })
            .collect()
    }
}

fn base_config() -> Florence2Config {
    // The fixture config for its vision part (unused here), with Florence-2-base's text shapes.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/tiny2");
    let s = std::fs::read_to_string(dir.join("config.json")).expect("fixture config");
    let mut cfg = Florence2Config::from_json_str(&s).expect("config");
    let t = &mut cfg.text;
    t.d_model = 768;
    t.decoder_layers = 6;
    t.encoder_layers = 6;
    t.decoder_attention_heads = 12;
    t.encoder_attention_heads = 12;
    t.decoder_ffn_dim = 3072;
    t.encoder_ffn_dim = 3072;
    t.vocab_size = 51328;
    t.max_position_embeddings = 1024;
    cfg
}

fn decoder(gpu: &Arc<Gpu>, cfg: &Florence2Config) -> Decoder {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut w = Weights::new();
    let lm = "model.language_model.";
    for (name, shape) in expected_tensors(cfg) {
        if !(name.starts_with("model.language_model.decoder.")
            || name == format!("{lm}shared.weight"))
        {
            continue;
        }
        let n: usize = shape.iter().product();
        let fan_in = *shape.last().unwrap_or(&1) as f32;
        let data = if name.ends_with("layer_norm.weight")
            || name.ends_with("layernorm_embedding.weight")
        {
            vec![1.0; n]
        } else if shape.len() == 1 {
            rng.fill(n, 0.05)
        } else {
            rng.fill(n, (3.0 / fan_in).sqrt())
        };
        w.insert(
            name.clone(),
            Tensor::from_f32(gpu, &shape, &data, &name).unwrap(),
        );
    }
    let t = &cfg.text;
    let shared = w
        .get(&format!("{lm}shared.weight"), &[t.vocab_size, t.d_model])
        .unwrap();
    Decoder::new(
        t,
        w.pp("model").pp("language_model").pp("decoder"),
        shared.clone(),
        shared,
        None,
    )
    .unwrap()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("decode bench: run with `cargo bench --bench decode`");
        return;
    }
    let steps: usize = std::env::var("DECODE_BENCH_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(24);
    let reps = 3;
    let gpu = pollster::block_on(Gpu::new(GpuOptions::default())).expect("a GPU adapter");
    println!("adapter: {}", gpu.describe());
    let cfg = base_config();
    let t0 = Instant::now();
    let dec = decoder(&gpu, &cfg);
    let d = cfg.text.d_model;
    let s = 577 + 10;
    let enc = Tensor::from_f32(&gpu, &[1, s, d], &Rng(7).fill(s * d, 1.0), "enc").unwrap();
    let mut rec = Recorder::new(&gpu);
    let cross = dec.cross_kv(&mut rec, &enc).unwrap();
    rec.submit().unwrap();
    gpu.wait_idle().unwrap();
    println!(
        "random base-shaped decoder built in {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    let opts = |beams: usize| GenerateOptions {
        max_new_tokens: steps,
        no_repeat_ngram_size: 3,
        forced_bos_token_id: None,
        forced_eos_token_id: None,
        eos_token_ids: vec![u32::MAX],
        decoder_start_token_id: 2,
        num_beams: beams,
        length_penalty: 1.0,
        early_stopping: EarlyStopping::True,
    };
    let run = |beams: usize| -> f64 {
        let o = opts(beams);
        let t = Instant::now();
        let ids = pollster::block_on(generate::generate(
            &dec,
            &gpu,
            &cross,
            &o,
            Default::default(),
        ))
        .unwrap();
        assert_eq!(ids.len(), steps + 1, "every run makes {steps} steps");
        t.elapsed().as_secs_f64() * 1e3 / steps as f64
    };
    for b in [1, 3] {
        let ms = run(b);
        println!("warm-up num_beams {b}: {ms:.2} ms/step");
    }
    let (mut g, mut bm) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        g.push(run(1));
        bm.push(run(3));
    }
    let (g, bm) = (median(g), median(bm));
    println!("{steps} steps, median of {reps} runs each:");
    println!("  greedy (num_beams 1): {g:.2} ms/step");
    println!("  beam   (num_beams 3): {bm:.2} ms/step");
    println!("  ratio beam-3 / greedy: {:.2}x", bm / g);

    // Where a step's time goes (submit + wait each, medians of 5): the decoder step alone for 1 and 3
    // rows at position 12 (recorded at this call, and replayed from its plan), and the beam extras (log-softmax + top-16 of 3 rows).
    let timed = |f: &mut dyn FnMut(&mut Recorder)| -> f64 {
        let mut v = Vec::new();
        for i in 0..6 {
            let mut rec = Recorder::new(&gpu);
            f(&mut rec);
            let t = Instant::now();
            rec.submit().unwrap();
            gpu.wait_idle().unwrap();
            if i > 0 {
                v.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        median(v)
    };
    let vocab = cfg.text.vocab_size;
    for b in [1usize, 3] {
        let mut state = dec.new_state(&gpu, &cross, b, 32).unwrap();
        let tokens = state.tokens().clone();
        let step = timed(&mut |rec: &mut Recorder| {
            dec.step(rec, &tokens, 12, &mut state).unwrap();
        });
        let planned = timed(&mut |rec: &mut Recorder| {
            dec.step_planned(rec, 12, &mut state).unwrap();
        });
        println!(
            "  decoder step alone (submit + GPU), {b} row(s): recorded {step:.2} ms, planned {planned:.2} ms"
        );
    }
    // CPU cost of a step, recorded at every call (`Decoder::step`: launchers' shape checks, params, bind
    // groups, passes) vs replayed from the plan recorded once (`Decoder::step_planned`: the step buffer's
    // write + the encode), + submit; the GPU's execution excluded (the wait comes after the clock stops).
    // Both alternate in one run, median of 20 each after a warm-up (which builds the plan).
    println!("  CPU per decoder step (record + submit, GPU time excluded), recorded vs planned:");
    // Modes: the step recorded at this call, the planned step, and (3 rows) the planned step after a
    // beam reorder of the 12 filled cache rows moving 2 of the 3 beams (what a beam step adds: buffer
    // copies, recorded per step since the indices change).
    let modes = ["recorded", "planned ", "planned + reorder [1, 0, 0]"];
    for b in [1usize, 3] {
        let mut state = dec.new_state(&gpu, &cross, b, 32).unwrap();
        let tokens = state.tokens().clone();
        let n_modes = if b == 3 { 3 } else { 2 };
        let (mut rec_ms, mut sub_ms) = (vec![Vec::new(); 3], vec![Vec::new(); 3]);
        let mut dispatches = [0; 3];
        let bg0 = gpu.bind_groups_created();
        for i in 0..21 {
            for m in 0..n_modes {
                let t = Instant::now();
                let mut rec = Recorder::new(&gpu);
                match m {
                    0 => {
                        dec.step(&mut rec, &tokens, 12, &mut state).unwrap();
                    }
                    _ => {
                        if m == 2 {
                            state.reorder(&mut rec, &[1, 0, 0], 12).unwrap();
                        }
                        dec.step_planned(&mut rec, 12, &mut state).unwrap();
                    }
                }
                let recorded = t.elapsed().as_secs_f64() * 1e3;
                dispatches[m] = rec.dispatch_count();
                rec.submit().unwrap();
                let total = t.elapsed().as_secs_f64() * 1e3;
                gpu.wait_idle().unwrap();
                if i > 0 {
                    rec_ms[m].push(recorded);
                    sub_ms[m].push(total - recorded);
                }
            }
        }
        let bind_groups = gpu.bind_groups_created() - bg0;
        let mut tot = [0.0; 3];
        for m in 0..n_modes {
            let (r, s) = (median(rec_ms[m].clone()), median(sub_ms[m].clone()));
            tot[m] = r + s;
            println!(
                "    {b} row(s), {} ({} dispatches): record {r:.3} ms + submit {s:.3} ms = {:.3} ms",
                modes[m],
                dispatches[m],
                r + s
            );
        }
        println!(
            "    {b} row(s): planned / recorded = {:.3}; bind groups created in 21 steps per mode: \
             {bind_groups} (recorded {} per step, planned once: {})",
            tot[1] / tot[0],
            dispatches[0],
            bind_groups - 21 * dispatches[0] as u64
        );
    }
    let x = Tensor::from_f32(&gpu, &[3, vocab], &Rng(3).fill(3 * vocab, 5.0), "x").unwrap();
    let lp = Tensor::zeros(&gpu, &[3, vocab], DType::F32, "lp").unwrap();
    let vals = Tensor::zeros(&gpu, &[3, 16], DType::F32, "vals").unwrap();
    let ids = Tensor::zeros(&gpu, &[3, 16], DType::U32, "ids").unwrap();
    let extras = timed(&mut |rec: &mut Recorder| {
        florence2_wasm::ops::softmax::log_softmax_rows(rec, &x, &lp).unwrap();
        florence2_wasm::ops::reduce::topk_rows(rec, &lp, 16, &vals, &ids).unwrap();
    });
    println!("  log-softmax + top-16 of (3, {vocab}): {extras:.2} ms");
}
