//! Decoder state mechanics needed by beam search, on the tiny2 fixture weights: several batch rows
//! (beams) decode independently against one shared cross-attention K/V, and reordering the caches by beam
//! index on the GPU is exactly equivalent to having decoded the reordered histories.
//!
//! Every comparison here is exact (tolerance 0): the decoder's Linears run per row
//! (`LinearArgs::per_row`), so a row's logits do not depend on the batch size, on the other rows, or on
//! which requests share a batched step ([`Decoder::step_batch`]); a reorder moves whole rows.
//!
//! The reorder and cache-sizing tests run with f32 and with f16 KV caches (the caches of the non-fp32
//! weight formats): a reorder moves whole rows of bytes in the caches' dtype, so it stays exact.
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use common::{assert_close, gpu};
use florence2_wasm::gpu::{readback, DType, Recorder};
use florence2_wasm::model::bart::{CrossKv, Decoder, DecoderState};
use florence2_wasm::model::generate::{self, GenerateOptions};

fn setup() -> (Decoder, CrossKv) {
    setup_on(&gpu())
}

fn setup_on(g: &std::sync::Arc<florence2_wasm::gpu::Device>) -> (Decoder, CrossKv) {
    setup_kv(g, DType::F32)
}

fn setup_kv(g: &std::sync::Arc<florence2_wasm::gpu::Device>, kv: DType) -> (Decoder, CrossKv) {
    // Any encoder output will do: 9 rows of deterministic values.
    common::fixtures::tiny2_decoder_kv(g, 9, |i| ((i * 37 % 101) as f32 / 50.0) - 1.0, kv)
}

/// Feed `steps` (one token per batch row per step) and return the last step's logits.
fn run(dec: &Decoder, state: &mut DecoderState, steps: &[Vec<u32>], start_pos: u32) -> Vec<f32> {
    let g = gpu();
    let mut last = Vec::new();
    for (i, toks) in steps.iter().enumerate() {
        state.write_tokens(toks).unwrap();
        let mut rec = Recorder::new(&g);
        let logits = dec
            .step_planned(&mut rec, start_pos + i as u32, state)
            .unwrap();
        rec.submit().unwrap();
        last = readback::to_f32_blocking(&g, &logits).unwrap();
    }
    last
}

#[test]
fn batch_rows_decode_independently_with_shared_cross_kv() {
    let g = gpu();
    let (dec, cross) = setup();
    let v = dec.vocab_size();
    let mut both = dec.new_state(&g, &cross, 2, 8).unwrap();
    let got = run(&dec, &mut both, &[vec![2, 2], vec![0, 7], vec![5, 9]], 0);
    for (row, seq) in [(0usize, [2u32, 0, 5]), (1, [2, 7, 9])] {
        let mut one = dec.new_state(&g, &cross, 1, 8).unwrap();
        let want = run(
            &dec,
            &mut one,
            &seq.iter().map(|&t| vec![t]).collect::<Vec<_>>(),
            0,
        );
        assert_bits(
            &format!("batch row {row}"),
            &got[row * v..(row + 1) * v],
            &want,
        );
    }
    // The two rows really differ (the test would be vacuous otherwise).
    assert_ne!(&got[..v], &got[v..]);
}

fn assert_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!("{what}: element {i}: {} vs {}", got[i], want[i]);
    }
}

/// `step_batch` over three requests (1, 3 and 2 rows; different images, prompt lengths and positions;
/// one joins late and one leaves early, as in continuous batching) gives each request's logits bit for
/// bit as its own `step_planned` does, on lavapipe and on the CPU backend, with f32 and f16 caches.
#[test]
fn batched_step_equals_each_request_alone() {
    for g in [gpu(), florence2_wasm::pipeline::cpu_device()] {
        for kv in [DType::F32, DType::F16] {
            batched_step_equals_alone(&g, kv);
        }
    }
}

fn batched_step_equals_alone(g: &std::sync::Arc<florence2_wasm::gpu::Device>, kv: DType) {
    let what = format!("{} {kv:?}", g.describe());
    let (dec, c0) = common::fixtures::tiny2_decoder_kv(g, 9, |i| (i as f32 * 0.37).sin(), kv);
    let c1 = common::fixtures::tiny2_decoder_kv(g, 5, |i| (i as f32 * 0.11).cos(), kv).1;
    let c2 = common::fixtures::tiny2_decoder_kv(g, 12, |i| ((i * 7 % 13) as f32) / 6.0 - 1.0, kv).1;
    let v = dec.vocab_size();
    // (cross K/V, rows, first step it runs, steps it runs)
    let plan = [
        (&c0, 1usize, 0usize, 6usize),
        (&c1, 3, 0, 3),
        (&c2, 2, 2, 4),
    ];
    let tok = |req: usize, row: usize, pos: usize| ((req * 11 + row * 5 + pos * 3) % v) as u32;
    let scratch = dec.batch_scratch(g, 6).unwrap();
    let batched: Vec<DecoderState> = plan
        .iter()
        .map(|&(c, rows, _, n)| dec.new_state(g, c, rows, n).unwrap())
        .collect();
    let mut alone: Vec<DecoderState> = plan
        .iter()
        .map(|&(c, rows, _, n)| dec.new_state(g, c, rows, n).unwrap())
        .collect();
    let mut compared = 0;
    for step in 0..6 {
        let live: Vec<usize> = (0..plan.len())
            .filter(|&r| (plan[r].2..plan[r].2 + plan[r].3).contains(&step))
            .collect();
        for &r in &live {
            let pos = step - plan[r].2;
            let toks: Vec<u32> = (0..plan[r].1).map(|row| tok(r, row, pos)).collect();
            for s in [&batched[r], &alone[r]] {
                s.write_tokens(&toks).unwrap();
                s.write_step(pos as u32).unwrap();
            }
        }
        let mut rec = Recorder::new(g);
        let states: Vec<&DecoderState> = live.iter().map(|&r| &batched[r]).collect();
        dec.step_batch(&mut rec, &states, &scratch).unwrap();
        rec.submit().unwrap();
        for &r in &live {
            let pos = (step - plan[r].2) as u32;
            let mut rec = Recorder::new(g);
            let want = dec.step_planned(&mut rec, pos, &mut alone[r]).unwrap();
            rec.submit().unwrap();
            let want = readback::to_f32_blocking(g, &want).unwrap();
            let got = readback::to_f32_blocking(g, batched[r].logits()).unwrap();
            assert_bits(&format!("{what}: request {r} at step {step}"), &got, &want);
            compared += 1;
        }
    }
    assert_eq!(compared, 13);
    // Too many rows for the scratch: a named shape error.
    let all: Vec<&DecoderState> = batched.iter().collect();
    let small = dec.batch_scratch(g, 5).unwrap();
    let err = dec
        .step_batch(&mut Recorder::new(g), &all, &small)
        .unwrap_err();
    assert!(matches!(err, florence2_wasm::Error::Shape { .. }), "{err}");
}

#[test]
fn cache_reorder_equals_decoding_the_reordered_histories() {
    let g = gpu();
    for kv in [DType::F32, DType::F16] {
        let (dec, cross) = setup_kv(&g, kv);
        reorder_is_exact(&g, &dec, &cross, kv);
    }
}

fn reorder_is_exact(
    g: &std::sync::Arc<florence2_wasm::gpu::Device>,
    dec: &Decoder,
    cross: &CrossKv,
    kv: DType,
) {
    let g = g.clone();
    let hist = [vec![2u32, 2, 2], vec![0, 7, 11], vec![5, 9, 13]];
    // Beams after reorder: new 0 = old 2, new 1 = old 0, new 2 = old 0.
    let src = [2usize, 0, 0];
    let next = vec![4u32, 6, 8];
    let reordered: Vec<Vec<u32>> = hist
        .iter()
        .map(|step| src.iter().map(|&s| step[s]).collect())
        .collect();
    let mut b = dec.new_state(&g, cross, 3, 6).unwrap();
    assert_eq!(b.kv_dtype(), kv);
    run(dec, &mut b, &reordered, 0);
    let want = run(dec, &mut b, std::slice::from_ref(&next), 3);
    // The default chunk (all 3 filled positions in one) and chunks of 1 and 2 positions (3 and 2
    // chunks, the last one short): the same caches.
    let mut states = Vec::new();
    for chunk in [None, Some(1), Some(2)] {
        let mut a = dec.new_state(&g, cross, 3, 6).unwrap();
        if let Some(c) = chunk {
            a.set_reorder_chunk_rows(c);
        }
        run(dec, &mut a, &hist, 0);
        let mut rec = Recorder::new(&g);
        a.reorder(&mut rec, &src, 3).unwrap();
        rec.submit().unwrap();
        let got = run(dec, &mut a, std::slice::from_ref(&next), 3);
        assert_close(
            &format!("{kv:?} reordered caches, chunk {chunk:?}"),
            &got,
            &want,
            0.0,
        );
        states.push(a);
    }
    let mut a = states.remove(0);

    // Identity and out-of-range indices.
    let mut rec = Recorder::new(&g);
    a.reorder(&mut rec, &[0, 1, 2], 4).unwrap();
    assert!(a.reorder(&mut rec, &[0, 1, 3], 4).is_err());
    assert!(a.reorder(&mut rec, &[0, 1], 4).is_err());
    assert!(a.reorder(&mut rec, &[0, 1, 2], 7).is_err());
}

#[test]
fn step_rejects_positions_past_the_cache() {
    let g = gpu();
    let (dec, cross) = setup();
    let mut s = dec.new_state(&g, &cross, 1, 2).unwrap();
    let mut rec = Recorder::new(&g);
    assert!(dec.step_planned(&mut rec, 2, &mut s).is_err());
    assert!(dec
        .new_state(&g, &cross, 1, dec.max_positions() + 1)
        .is_err());
    assert!(dec.new_state(&g, &cross, 0, 4).is_err());
}

/// no_repeat_ngram_size = 1 bans every token already in the sequence: after 15 distinct tokens the ban
/// list outgrows the GPU top-16 and the step reads its whole logits row instead. Every generated token
/// must still be new (this random model otherwise repeats tokens constantly).
#[test]
fn unigram_bans_beyond_top_k_are_enforced() {
    let g = gpu();
    let (dec, cross) = setup();
    let opts = GenerateOptions {
        max_new_tokens: 30,
        no_repeat_ngram_size: 1,
        forced_bos_token_id: None,
        forced_eos_token_id: None,
        eos_token_ids: vec![u32::MAX],
        decoder_start_token_id: 2,
        num_beams: 1,
        length_penalty: 1.0,
        early_stopping: Default::default(),
    };
    let got = pollster::block_on(generate::greedy(&dec, &g, &cross, &opts, &|| false)).unwrap();
    assert_eq!(got.len(), 31);
    let mut seen = std::collections::HashSet::new();
    for t in &got {
        assert!(seen.insert(*t), "token {t} repeated in {got:?}");
    }
    // Without the rule the same model repeats.
    let free = GenerateOptions {
        no_repeat_ngram_size: 0,
        ..opts
    };
    let got = pollster::block_on(generate::greedy(&dec, &g, &cross, &free, &|| false)).unwrap();
    let distinct: std::collections::HashSet<_> = got.iter().collect();
    assert!(distinct.len() < got.len(), "{got:?}");
}

#[test]
fn kv_caches_are_sized_to_the_request() {
    // The self-attention caches are allocated once per request for the positions it can use:
    // max_new_tokens, capped by the decoder's position table, not always the table's size. With greedy
    // decoding (one batch row) the request's peak activation bytes then differ between two values of
    // max_new_tokens by exactly the caches' rows: 2 (K, V) x layers x rows x d_model x 4 bytes; every
    // other buffer (step scratch, logits, top-k) is the same size. The search is cancelled after two
    // steps: every buffer is allocated before the first. A device of its own: memory counters are per
    // device, and other tests run in parallel.
    let g = std::sync::Arc::new(
        pollster::block_on(florence2_wasm::gpu::Device::new(Default::default())).unwrap(),
    );
    let mut rows = Vec::new();
    for kv in [DType::F32, DType::F16] {
        let (dec, cross) = setup_kv(&g, kv);
        rows.push(caches_sized_to_the_request(&g, &dec, &cross, kv));
    }
    // f16 cache rows are half the bytes of f32 ones (2 bytes per element, D even: no padding).
    assert_eq!(rows[1] * 2, rows[0]);
}

/// The checks of [`kv_caches_are_sized_to_the_request`] with caches of `kv`; returns the bytes of one
/// cache position (K and V of every layer).
fn caches_sized_to_the_request(
    g: &std::sync::Arc<florence2_wasm::gpu::Device>,
    dec: &Decoder,
    cross: &CrossKv,
    kv: DType,
) -> u64 {
    let d = 32; // tiny2 d_model
    let max_pos = dec.max_positions();
    let peak = |max_new_tokens: usize| -> u64 {
        let opts = GenerateOptions {
            max_new_tokens,
            no_repeat_ngram_size: 0,
            forced_bos_token_id: None,
            forced_eos_token_id: None,
            eos_token_ids: vec![],
            decoder_start_token_id: 2,
            num_beams: 1,
            length_penalty: 1.0,
            early_stopping: Default::default(),
        };
        let before = g.memory();
        g.reset_peak_memory();
        let polls = std::cell::Cell::new(0);
        let cancel = || {
            polls.set(polls.get() + 1);
            polls.get() > 2
        };
        let r = pollster::block_on(generate::generate(
            dec,
            g,
            cross,
            &opts,
            generate::Observer::cancel(&cancel),
        ));
        assert!(matches!(r, Err(florence2_wasm::Error::Cancelled)), "{r:?}");
        let m = g.memory();
        // Nothing outlives the request.
        assert_eq!(m.activations_bytes, before.activations_bytes);
        m.peak_activations_bytes - before.activations_bytes
    };
    // K and V of every layer at kv's element size: 4 bytes (f32) or 2 (f16).
    let elem = match kv {
        DType::F16 => 2,
        _ => 4,
    };
    let row = (2 * dec.layers() * d * elem) as u64;
    let (p3, p9) = (peak(3), peak(9));
    eprintln!(
        "{kv:?}: greedy request peak: {p3} B at max_new_tokens 3, {p9} B at 9; cache row {row} B"
    );
    assert_eq!(
        p9 - p3,
        6 * row,
        "the caches grow with max_new_tokens, nothing else does"
    );
    // Past the position table, the caches stop at its size.
    let (p_max, p_huge) = (peak(max_pos), peak(100 * max_pos));
    assert_eq!(p_huge, p_max, "capped by max_position_embeddings {max_pos}");
    // max_new_tokens >= max_pos: max_length = max_pos, so max_pos - 1 cache rows (3 at max_new_tokens 3).
    assert_eq!(p_max - p3, (max_pos - 4) as u64 * row);
    row
}

/// The KV caches and cross K/V follow the resident weight format: f32 for fp32 weights (the reference's
/// numerics), packed f16 for fp16, q8 and q4; only F32 and F16 can be chosen by hand.
#[test]
fn kv_dtype_follows_the_resident_weights() {
    use florence2_wasm::model::florence2::Florence2;
    use florence2_wasm::weights::{self, LoadOptions, WeightDType};
    let g = gpu();
    let dir = common::fixtures::fixtures().join("models/tiny2");
    for (resident, want) in [
        (WeightDType::Fp32, DType::F32),
        (WeightDType::Fp16, DType::F16),
        (WeightDType::Q8, DType::F16),
        (WeightDType::Q4, DType::F16),
    ] {
        let (cfg, w) = weights::load_dir_with(&g, &dir, LoadOptions::with_dtype(resident)).unwrap();
        let mut model = Florence2::new(&g, cfg, &w).unwrap();
        assert_eq!(model.decoder.kv_dtype(), want, "{resident}");
        for bad in [DType::Q8, DType::U32] {
            assert!(
                model.decoder.set_kv_dtype(bad).is_err(),
                "{resident} {bad:?}"
            );
        }
        assert_eq!(model.decoder.kv_dtype(), want);
        model.decoder.set_kv_dtype(DType::F32).unwrap();
        assert_eq!(model.decoder.kv_dtype(), DType::F32);
    }
}
