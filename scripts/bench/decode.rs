//! Decode-step benchmark: beam search (3 beams) vs greedy, time per decoder step, on a decoder with
//! Florence-2-base's shapes (d_model 768, 6 layers, 12 heads, ffn 3072, vocabulary 51328) and random
//! weights, built in memory (HF-native names and shapes from `config::tensors::expected_tensors`; no
//! checkpoint file needed), against random cross-attention K/V of a base-sized encoder output (577 image
//! tokens + a 10-token prompt).
//!
//! `cargo bench --bench decode` (`DECODE_BENCH_STEPS=N` steps per run, default 24). Both modes run the
//! same number of decoder steps (no EOS can occur: its id is outside the vocabulary; no forced tokens;
//! no-repeat-n-gram 3 as the model card), in the same process, one warm-up run each (kernel compilation,
//! staging buffers) excluded, then alternating timed runs; the median per-step time of each is reported,
//! with the ratio. A step includes the decoder for every row, the readback and (beam) log-softmax, top-k,
//! cache reorder and the CPU bookkeeping. Then a breakdown: the decoder step alone for 1 and 3 rows, and
//! log-softmax + top-16 of 3 vocabulary rows, and the CPU cost of one decoder step (record + submit,
//! the GPU's execution excluded) replayed from the plan recorded once per request
//! (`Decoder::step_planned`, what greedy and beam search use). Under `cargo test` (no `--bench`
//! argument) it only builds.
//!
//! `DECODE_BENCH_DTYPES=fp32,fp16,q8,q4` instead times the greedy step per resident weight dtype side by
//! side (matrices as the loader stores them for that dtype), each with the static kernel choices and
//! with the previous decode GEMV forced, alternating, in wall and CPU time, with the weight bytes a step
//! reads and a per-op GPU profile of one planned step per dtype (see `per_dtype`).

use std::sync::Arc;
use std::time::Instant;

#[path = "util.rs"]
mod util;
use util::{cpu_secs, endless_options, Rng};

use florence2_wasm::config::tensors::expected_tensors;
use florence2_wasm::gpu::registry::ShapeClass;
use florence2_wasm::gpu::{DType, Device, DeviceOptions, QFormat, Recorder, Tensor};
use florence2_wasm::model::bart::Decoder;
use florence2_wasm::model::generate;
use florence2_wasm::model::Florence2Config;
use florence2_wasm::weights::expected::is_matrix_weight;
use florence2_wasm::weights::{WeightDType, Weights};

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

fn decoder(gpu: &Arc<Device>, cfg: &Florence2Config) -> Decoder {
    decoder_as(gpu, cfg, WeightDType::Fp32).0
}

/// The random base-shaped decoder with its matrix weights resident as `dtype` (the loader's rule:
/// `WeightDType::matrix_dtype` for every `is_matrix_weight`), and the weight bytes one greedy step reads
/// (every weight except the two embedding tables, of which a step reads one row each, plus the tied
/// LM head, which is the token embedding read whole).
fn decoder_as(gpu: &Arc<Device>, cfg: &Florence2Config, dtype: WeightDType) -> (Decoder, u64) {
    let mut read_bytes = 0u64;
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
        let t = if is_matrix_weight(&name, &shape) {
            let k = *shape.last().unwrap_or(&0);
            match dtype.matrix_dtype(k) {
                DType::F16 => Tensor::from_f32_as_f16(gpu, &shape, &data, &name),
                DType::Q8 => Tensor::from_f32_quantized(gpu, &shape, &data, QFormat::Q8, &name),
                DType::Q4 => Tensor::from_f32_quantized(gpu, &shape, &data, QFormat::Q4, &name),
                _ => Tensor::from_f32(gpu, &shape, &data, &name),
            }
        } else {
            Tensor::from_f32(gpu, &shape, &data, &name)
        }
        .unwrap();
        if !name.contains("embed_positions") {
            // The token embedding is read whole as the LM head (tied), and one row as the embedding.
            read_bytes += t.byte_size();
        }
        w.insert(name.clone(), t);
    }
    let t = &cfg.text;
    let shared = w
        .get(&format!("{lm}shared.weight"), &[t.vocab_size, t.d_model])
        .unwrap();
    let dec = Decoder::new(
        t,
        w.pp("model").pp("language_model").pp("decoder"),
        shared.clone(),
        shared,
        None,
    )
    .unwrap();
    (dec, read_bytes)
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
    let gpu = pollster::block_on(Device::new(DeviceOptions::default())).expect("a GPU adapter");
    println!("adapter: {}", gpu.describe());
    let cfg = base_config();
    if let Ok(list) = std::env::var("DECODE_BENCH_DTYPES") {
        per_dtype(&gpu, &cfg, &list, steps);
        return;
    }
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

    let opts = |beams: usize| endless_options(steps, beams);
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
    // rows at position 12 (replayed from its plan), and the beam extras (log-softmax + top-16 of 3 rows).
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
        let planned = timed(&mut |rec: &mut Recorder| {
            dec.step_planned(rec, 12, &mut state).unwrap();
        });
        println!("  decoder step alone (submit + GPU), {b} row(s): {planned:.2} ms");
    }
    // CPU cost of a step replayed from the plan recorded once (`Decoder::step_planned`: the step buffer's
    // write + the encode), + submit; the GPU's execution excluded (the wait comes after the clock stops).
    // Median of 20 after a warm-up (which builds the plan); for 3 rows also after a beam reorder of the
    // 12 filled cache rows moving 2 of the 3 beams (what a beam step adds: buffer copies, recorded per
    // step since the indices change), alternating.
    println!("  CPU per decoder step (record + submit, GPU time excluded):");
    let modes = ["planned", "planned + reorder [1, 0, 0]"];
    for b in [1usize, 3] {
        let mut state = dec.new_state(&gpu, &cross, b, 32).unwrap();
        let n_modes = if b == 3 { 2 } else { 1 };
        let (mut rec_ms, mut sub_ms) = (vec![Vec::new(); 2], vec![Vec::new(); 2]);
        let mut dispatches = [0; 2];
        for i in 0..21 {
            for m in 0..n_modes {
                let t = Instant::now();
                let mut rec = Recorder::new(&gpu);
                if m == 1 {
                    state.reorder(&mut rec, &[1, 0, 0], 12).unwrap();
                }
                dec.step_planned(&mut rec, 12, &mut state).unwrap();
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
        for m in 0..n_modes {
            let (r, s) = (median(rec_ms[m].clone()), median(sub_ms[m].clone()));
            println!(
                "    {b} row(s), {} ({} dispatches): record {r:.3} ms + submit {s:.3} ms = {:.3} ms",
                modes[m],
                dispatches[m],
                r + s
            );
        }
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

/// `DECODE_BENCH_DTYPES=fp32,fp16,q8,q4`: the greedy decode step per resident weight dtype, side by side
/// in one run, each with the static kernel choices ("new") and with every decode linear forced to
/// `gemv_subgroup` (the static decode GEMV before the block GEMV: "old"), all cells alternating, 3
/// rounds; wall ms per step and CPU ms per step (lavapipe's threads: the work), the ratios to fp32, the
/// weight bytes a step reads; then one planned step per dtype with the GPU profiler: time per op kind.
fn per_dtype(gpu: &Arc<Device>, cfg: &Florence2Config, list: &str, steps: usize) {
    let dtypes: Vec<WeightDType> = list
        .split(',')
        .map(|s| s.trim().parse().expect("DECODE_BENCH_DTYPES"))
        .collect();
    let d = cfg.text.d_model;
    let s = 577 + 10;
    let enc = Tensor::from_f32(gpu, &[1, s, d], &Rng(7).fill(s * d, 1.0), "enc").unwrap();
    let mut models = Vec::new();
    for &dt in &dtypes {
        let (dec, bytes) = decoder_as(gpu, cfg, dt);
        let mut rec = Recorder::new(gpu);
        let cross = dec.cross_kv(&mut rec, &enc).unwrap();
        rec.submit().unwrap();
        gpu.wait_idle().unwrap();
        models.push((dt, dec, cross, bytes));
    }
    // The decode linears' classes (every N, K of the decoder and the LM head, 1 and 3 rows).
    let t = &cfg.text;
    let ns = [d, 2 * d, 3 * d, t.decoder_ffn_dim, t.vocab_size];
    let ks = [d, t.decoder_ffn_dim];
    let set_old = |on: bool| {
        gpu.choices.clear();
        if on {
            for &(dt, ..) in &models {
                for &n in &ns {
                    for &k in &ks {
                        for m in [1, 3] {
                            gpu.choices.set(
                                ShapeClass::linear(m, n, k, dt.matrix_dtype(k)),
                                "gemv_subgroup",
                            );
                        }
                    }
                }
            }
        }
    };
    let opts = endless_options(steps, 1);
    let run = |i: usize| -> (f64, f64) {
        let (_, dec, cross, _) = &models[i];
        let c = cpu_secs();
        let t = Instant::now();
        let ids = pollster::block_on(generate::generate(
            dec,
            gpu,
            cross,
            &opts,
            Default::default(),
        ))
        .unwrap();
        assert_eq!(ids.len(), steps + 1, "every run makes {steps} steps");
        (
            t.elapsed().as_secs_f64() * 1e3 / steps as f64,
            (cpu_secs() - c) * 1e3 / steps as f64,
        )
    };
    let modes = ["old (gemv_subgroup)", "new (static choice)"];
    // Warm-up: every (mode, dtype) once (kernels, plans).
    for old in [true, false] {
        set_old(old);
        for i in 0..models.len() {
            run(i);
        }
    }
    let mut wall = vec![vec![Vec::new(); models.len()]; 2];
    let mut cpu = vec![vec![Vec::new(); models.len()]; 2];
    for _ in 0..3 {
        for (mi, old) in [true, false].into_iter().enumerate() {
            set_old(old);
            for i in 0..models.len() {
                let (w, c) = run(i);
                wall[mi][i].push(w);
                cpu[mi][i].push(c);
            }
        }
    }
    println!(
        "greedy decode step per resident dtype, {steps} steps, median of 3 alternating rounds \
         (ratios to fp32 of the same mode; CPU = lavapipe's threads' CPU time per step):"
    );
    println!(
        "  {:<20} {:>5} {:>14} {:>9} {:>9} {:>10} {:>10}",
        "mode", "dtype", "weights/step", "wall ms", "CPU ms", "wall/fp32", "CPU/fp32"
    );
    for mi in 0..2 {
        let w0 = median(wall[mi][0].clone());
        let c0 = median(cpu[mi][0].clone());
        for (i, (dt, _, _, bytes)) in models.iter().enumerate() {
            let (w, c) = (median(wall[mi][i].clone()), median(cpu[mi][i].clone()));
            println!(
                "  {:<20} {:>5} {:>11.1} MB {w:>9.2} {c:>9.2} {:>10.3} {:>10.3}",
                modes[mi],
                dt.to_string(),
                *bytes as f64 / 1e6,
                w / w0,
                c / c0
            );
        }
    }
    for (i, (dt, ..)) in models.iter().enumerate() {
        println!(
            "  {dt} new/old: wall {:.3}, CPU {:.3}",
            median(wall[1][i].clone()) / median(wall[0][i].clone()),
            median(cpu[1][i].clone()) / median(cpu[0][i].clone())
        );
    }
    // Where a step's GPU time goes, per dtype (static choices): one planned step, profiled.
    set_old(false);
    if gpu.profiler.enable(gpu, true).is_ok() {
        for (dt, dec, cross, _) in &models {
            let mut state = dec.new_state(gpu, cross, 1, 32).unwrap();
            for pos in 0..3 {
                let mut rec = Recorder::new(gpu);
                dec.step_planned(&mut rec, pos, &mut state).unwrap();
                rec.submit().unwrap();
                gpu.wait_idle().unwrap();
            }
            let _ = pollster::block_on(gpu.profiler.take(gpu)).unwrap();
            let mut rec = Recorder::new(gpu);
            dec.step_planned(&mut rec, 3, &mut state).unwrap();
            rec.submit().unwrap();
            gpu.wait_idle().unwrap();
            let entries = pollster::block_on(gpu.profiler.take(gpu)).unwrap();
            let total: f64 = entries.iter().map(|e| e.ms).sum();
            let mut by: Vec<(String, f64, usize)> = Vec::new();
            for e in &entries {
                let key = if e.op.contains("matmul") {
                    let lm = e.shape.contains(&format!("N={}", t.vocab_size));
                    format!("{} {}", if lm { "LM head" } else { "linear" }, e.op)
                } else {
                    e.op.clone()
                };
                match by.iter_mut().find(|b| b.0 == key) {
                    Some(b) => {
                        b.1 += e.ms;
                        b.2 += 1;
                    }
                    None => by.push((key, e.ms, 1)),
                }
            }
            by.sort_by(|a, b| b.1.total_cmp(&a.1));
            println!(
                "  profile {dt}: {total:.2} ms GPU over {} dispatches",
                entries.len()
            );
            for (k, ms, n) in by.iter().take(8) {
                println!(
                    "    {k:<44} {n:>3} x  {ms:>8.3} ms  {:>5.1}%",
                    100.0 * ms / total
                );
            }
        }
        let _ = gpu.profiler.enable(gpu, false);
    }
}
