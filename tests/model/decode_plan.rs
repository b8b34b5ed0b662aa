//! Decode steps recorded once per request (`Decoder::step_planned`, `gpu::Plan`) on the tiny2 fixture
//! weights, with 1 row (greedy) and 3 rows with beam reorders between steps, with f32 and with f16 KV
//! caches and cross K/V.
//!
//! The beam state's logits at every step must be bit-identical (tolerance 0) to a fresh state's that
//! decodes each row's history after the reorders, with no reorder: reorders are exact copies, the rows
//! are independent and both run the same kernels, so the caches hold the same bits. The plan must be
//! built once: bind groups created per step are counted on the device (its own device per test, so other
//! tests of this binary do not count). The position-reading attention (`DYN_LEN`) is checked against the
//! fixed-length one on every variant.
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use std::sync::Arc;

use common::Rng;
use florence2_wasm::gpu::{readback, DType, Device, DeviceOptions, Recorder, Tensor};
use florence2_wasm::model::bart::{CrossKv, Decoder};
use florence2_wasm::ops::attention::{self, AttnOpts, AttnVariant};

fn open() -> Arc<Device> {
    pollster::block_on(Device::new(DeviceOptions::default())).expect("a GPU adapter (lavapipe)")
}

fn setup(g: &Arc<Device>) -> (Decoder, CrossKv) {
    setup_kv(g, DType::F32)
}

fn setup_kv(g: &Arc<Device>, kv: DType) -> (Decoder, CrossKv) {
    common::fixtures::tiny2_decoder_kv(g, 11, |i| ((i * 29 % 97) as f32 / 48.0) - 1.0, kv)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn planned_steps_after_reorders_equal_the_reordered_histories_and_are_recorded_once() {
    let g = open();
    for kv in [DType::F32, DType::F16] {
        let (dec, cross) = setup_kv(&g, kv);
        assert!(cross.k.iter().chain(&cross.v).all(|t| t.dtype() == kv));
        reordered_equals_replayed(&g, &dec, &cross, kv);
    }
}

/// The logits (B, V) after decoding `hist` (one token per row per position) on a fresh state.
fn replay(
    g: &Arc<Device>,
    dec: &Decoder,
    cross: &CrossKv,
    hist: &[Vec<u32>],
    max_len: usize,
) -> Vec<f32> {
    let mut state = dec.new_state(g, cross, hist[0].len(), max_len).unwrap();
    let mut last = Vec::new();
    for (pos, toks) in hist.iter().enumerate() {
        state.write_tokens(toks).unwrap();
        let mut rec = Recorder::new(g);
        let logits = dec.step_planned(&mut rec, pos as u32, &mut state).unwrap();
        rec.submit().unwrap();
        last = readback::to_f32_blocking(g, &logits).unwrap();
    }
    last
}

fn reordered_equals_replayed(g: &Arc<Device>, dec: &Decoder, cross: &CrossKv, kv: DType) {
    let vocab = dec.vocab_size() as u32;
    let steps = 7u32;
    // Beam reorders applied before steps 1.. (3 rows): duplicates, swaps, identity.
    let perms: [[usize; 3]; 4] = [[0, 0, 1], [2, 1, 0], [0, 1, 2], [1, 1, 1]];
    for batch in [1usize, 3] {
        let mut state = dec.new_state(g, cross, batch, steps as usize).unwrap();
        assert_eq!(state.kv_dtype(), kv);
        // hist[pos][row]: the token each row's history holds at each position.
        let mut hist: Vec<Vec<u32>> = Vec::new();
        for pos in 0..steps {
            let toks: Vec<u32> = (0..batch as u32)
                .map(|r| (pos * 7 + r * 5 + 3) % vocab)
                .collect();
            let src: Vec<usize> = if batch == 3 && pos > 0 {
                perms[pos as usize % perms.len()].to_vec()
            } else {
                (0..batch).collect()
            };
            for h in &mut hist {
                *h = src.iter().map(|&s| h[s]).collect();
            }
            hist.push(toks.clone());

            let before = g.bind_groups_created();
            state.write_tokens(&toks).unwrap();
            let mut rec = Recorder::new(g);
            state.reorder(&mut rec, &src, pos as usize).unwrap();
            let logits = dec.step_planned(&mut rec, pos, &mut state).unwrap();
            let planned_dispatches = rec.dispatch_count();
            rec.submit().unwrap();
            let got = readback::to_f32_blocking(g, &logits).unwrap();
            let planned_bind_groups = g.bind_groups_created() - before;

            let want = replay(g, dec, cross, &hist, steps as usize);
            assert_eq!(want.len(), batch * vocab as usize);
            let diff = want
                .iter()
                .zip(&got)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            eprintln!(
                "kv {kv:?} batch {batch} pos {pos}: max |reordered - replayed| = {diff:e}; \
                 bind groups {planned_bind_groups}; dispatches {planned_dispatches}"
            );
            assert_eq!(bits(&want), bits(&got), "kv {kv:?} batch {batch} pos {pos}");
            // The plan's bind groups once, at its first step.
            let plan = state.plan().expect("the plan exists after a planned step");
            assert_eq!(planned_dispatches, plan.dispatch_count());
            if pos == 0 {
                assert_eq!(planned_bind_groups, plan.dispatch_count() as u64);
            } else {
                assert_eq!(planned_bind_groups, 0, "pos {pos}: the plan was rebuilt");
            }
        }
    }
}

/// One attention call on its own submit, read back.
fn run_attention(
    g: &Arc<Device>,
    [q, k, v]: [&Tensor; 3],
    opts: &AttnOpts,
    out: &Tensor,
) -> Vec<f32> {
    let mut rec = Recorder::new(g);
    attention::attention(&mut rec, q, k, v, opts, out).unwrap();
    rec.submit().unwrap();
    readback::to_f32_blocking(g, out).unwrap()
}

#[test]
fn dynamic_length_attention_equals_the_fixed_one_on_every_variant() {
    let g = open();
    let (b, tk, heads, d) = (2usize, 16usize, 2usize, 8usize);
    let hd = heads * d;
    let mut rng = Rng::new(11);
    let t = |shape: &[usize], rng: &mut Rng, name: &str| {
        let n: usize = shape.iter().product();
        let v = rng.vec(n, 1.0);
        Tensor::from_f32(&g, shape, &v, name).unwrap()
    };
    let q = t(&[b, 1, hd], &mut rng, "q");
    let k32 = t(&[b, tk, hd], &mut rng, "k");
    let v32 = t(&[b, tk, hd], &mut rng, "v");
    // The same K/V packed as f16 (the KV_F16 variants of every kernel, as the decoder's f16 caches).
    let f16_of = |x: &Tensor, label: &str| {
        let y = Tensor::zeros(&g, x.shape(), DType::F16, label).unwrap();
        let mut rec = Recorder::new(&g);
        florence2_wasm::ops::cast::f32_to_f16(&mut rec, x, &y).unwrap();
        rec.submit().unwrap();
        y
    };
    let (k16, v16) = (f16_of(&k32, "k16"), f16_of(&v32, "v16"));
    let out = Tensor::zeros(&g, &[b, 1, hd], DType::F32, "out").unwrap();
    let dyn_len = Tensor::zeros(&g, &[4], DType::U32, "dyn").unwrap();
    for (variant, (k, v)) in AttnVariant::ALL
        .into_iter()
        .flat_map(|var| [(var, (&k32, &v32)), (var, (&k16, &v16))])
    {
        for (kv_len, causal) in [(1u32, false), (5, false), (16, false), (9, true)] {
            let opts = AttnOpts {
                heads,
                scale: 0.35,
                causal,
                kv_len: Some(kv_len),
                q_offset: kv_len - 1,
                mask: None,
                ..Default::default()
            };
            let want = run_attention(
                &g,
                [&q, k, v],
                &AttnOpts {
                    variant: Some(variant),
                    ..opts
                },
                &out,
            );
            // Only the buffer says kv_len / q_offset: the options carry different values.
            let dyn_opts = AttnOpts {
                kv_len: Some(3),
                q_offset: 0,
                ..opts
            };
            dyn_len
                .write_bytes(&g, 0, bytemuck::cast_slice(&[kv_len, kv_len - 1, 0, 0]))
                .unwrap();
            let got = run_attention(
                &g,
                [&q, k, v],
                &AttnOpts {
                    dyn_len: Some(&dyn_len),
                    variant: Some(variant),
                    ..dyn_opts
                },
                &out,
            );
            let kvd = k.dtype();
            assert_eq!(
                bits(&want),
                bits(&got),
                "{variant:?} {kvd:?} kv_len {kv_len}"
            );
        }
        // A key count past Tk is clamped to Tk by the shader.
        let opts = AttnOpts {
            heads,
            scale: 0.35,
            ..Default::default()
        };
        let want = run_attention(
            &g,
            [&q, k, v],
            &AttnOpts {
                variant: Some(variant),
                ..opts
            },
            &out,
        );
        dyn_len
            .write_bytes(&g, 0, bytemuck::cast_slice(&[1000u32, 0, 0, 0]))
            .unwrap();
        let got = run_attention(
            &g,
            [&q, k, v],
            &AttnOpts {
                dyn_len: Some(&dyn_len),
                variant: Some(variant),
                ..opts
            },
            &out,
        );
        assert_eq!(bits(&want), bits(&got), "{variant:?} clamped");
    }
    // The step buffer must be U32 with [kv_len, q_offset].
    let bad = Tensor::zeros(&g, &[1], DType::U32, "bad").unwrap();
    let mut rec = Recorder::new(&g);
    let opts = AttnOpts {
        heads,
        ..Default::default()
    };
    let e = attention::attention(
        &mut rec,
        &q,
        &k32,
        &v32,
        &attention::AttnOpts {
            dyn_len: Some(&bad),
            ..opts
        },
        &out,
    )
    .unwrap_err();
    assert!(e.to_string().contains("dyn_len"), "{e}");
}

#[test]
fn planned_steps_are_profiled_per_dispatch() {
    use florence2_wasm::gpu::profile;
    let g = open();
    if !g.caps.timestamp_query {
        eprintln!(
            "no timestamp queries on {}: nothing to profile",
            g.describe()
        );
        return;
    }
    let (dec, cross) = setup(&g);
    let mut state = dec.new_state(&g, &cross, 1, 4).unwrap();
    g.profiler.enable(&g, true).unwrap();
    for pos in 0..2 {
        state.write_tokens(&[pos + 2]).unwrap();
        let mut rec = Recorder::new(&g);
        rec.set_phase("decode");
        dec.step_planned(&mut rec, pos, &mut state).unwrap();
        rec.submit().unwrap();
    }
    let entries = pollster::block_on(g.profiler.take(&g)).unwrap();
    g.profiler.enable(&g, false).unwrap();
    let n = state.plan().unwrap().dispatch_count();
    assert_eq!(entries.len(), 2 * n, "one entry per replayed dispatch");
    assert!(entries
        .iter()
        .all(|e| e.phase == "decode" && e.ms.is_finite() && e.ms >= 0.0));
    // Labels recorded with the plan: op, variant (defines) and the launchers' shape notes.
    assert!(entries.iter().any(|e| e.op == "decode_step:kv_write"));
    assert!(entries
        .iter()
        .any(|e| e.op.starts_with("attention") && e.variant.contains("DYN_LEN")));
    assert!(
        entries.iter().any(|e| e.shape.starts_with("M=1 ")),
        "{}",
        profile::table(&entries)
    );
}

#[test]
fn a_capture_refuses_what_a_plan_cannot_hold() {
    let g = open();
    let x = Tensor::zeros(&g, &[4], DType::F32, "x").unwrap();
    // A capturing recorder makes a plan; it is never submitted.
    assert!(Recorder::capture(&g).submit().is_err());
    // Readbacks are mapped per use: not part of a plan.
    let staging = florence2_wasm::gpu::staging_buffer(&g, 16);
    let mut cap = Recorder::capture(&g);
    assert!(cap.read_back_into(&x, &staging).is_err());
    let mut cap2 = Recorder::capture(&g);
    let _pending = cap2.read_back(&x);
    assert!(cap2.into_plan().is_err());
    // into_plan only from a capture.
    assert!(Recorder::new(&g).into_plan().is_err());
    // A plan replays on its own device only.
    let mut cap = Recorder::capture(&g);
    florence2_wasm::ops::elementwise::scale(&mut cap, &x, 2.0, &x).unwrap();
    let plan = cap.into_plan().unwrap();
    assert_eq!(plan.dispatch_count(), 1);
    let other = open();
    assert!(Recorder::new(&other).replay(&plan).is_err());
    // Replayed twice: x = 3 * 2 * 2.
    x.write_bytes(&g, 0, bytemuck::cast_slice(&[3f32; 4]))
        .unwrap();
    let mut rec = Recorder::new(&g);
    rec.replay(&plan).unwrap();
    rec.replay(&plan).unwrap();
    rec.submit().unwrap();
    assert_eq!(readback::to_f32_blocking(&g, &x).unwrap(), vec![12.0; 4]);
}
