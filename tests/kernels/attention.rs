//! `ops::attention::attention` against a plain f64 CPU reference (two-pass softmax). Every case runs
//! every kernel variant that supports its head dim (`attention_variant` over `AttnVariant::ALL`: tiled,
//! rows, flash, flash_split) and the automatic choice; the registry and tuner tests at the end check that a tuned
//! choice is what runs.
//!
//! Tolerance: 2e-6 absolute on outputs of magnitude <= 1 (convex combinations of v in [-1, 1]). The GPU
//! works in f32 in another order (online softmax: the rows kernel rescales per key, the tiled and flash
//! kernels per key tile, flash also merges S partial states per row): a score of magnitude <= ~4 summed
//! over D <= 64 terms carries random-signed rounding of ~sqrt(D) * 2^-24 * 4 ~ 2e-6, which moves each
//! softmax weight by about that relative amount; each rescale or merge multiplies the running sums by one
//! rounded exp (2^-24 relative each), and the weighted sums add ~sqrt(Tk) * 2^-24. Measured: <= 4.5e-7 on
//! every case and variant. A wrong mask, offset, tile edge or broadcast changes outputs by O(0.1).
//!
//! Every case also runs with K and V stored as packed f16 (the kernels' `KV_F16` variant, used for the
//! decoder's caches and cross K/V when the weights are not fp32), against the same f64 reference computed
//! on the f16-rounded K and V. Widening f16 to f32 is exact, so the kernel then does the f32 case's
//! arithmetic on exactly the reference's inputs: same tolerance. A kernel that read the packed words as
//! f32, or took the wrong half of a word, would be off by O(1).
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use common::{assert_close, gpu, Rng};
use florence2_wasm::gpu::registry::ShapeClass;
use florence2_wasm::gpu::tune::{self, CacheLocation, TuneCase, Tuning};
use florence2_wasm::gpu::{readback, DType, Device, DeviceOptions, Recorder, Tensor};
use florence2_wasm::model::workloads;
use florence2_wasm::ops::attention::{
    attention, choose_attention_variant, variant_supports, AttnOpts, AttnShape, AttnVariant,
};

const VARIANTS: [AttnVariant; 4] = AttnVariant::ALL;

const TOL: f32 = 2e-6;

struct Case {
    b: usize,
    bk: usize,
    tq: usize,
    tk: usize,
    heads: usize,
    d: usize,
    causal: bool,
    kv_len: Option<usize>,
    q_offset: usize,
    mask: bool,
    scale: f32,
}

impl Case {
    fn new(b: usize, tq: usize, tk: usize, heads: usize, d: usize) -> Self {
        Case {
            b,
            bk: b,
            tq,
            tk,
            heads,
            d,
            causal: false,
            kv_len: None,
            q_offset: 0,
            mask: false,
            scale: (d as f32).powf(-0.5),
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn cpu_attention(c: &Case, q: &[f32], k: &[f32], v: &[f32], mask: Option<&[f32]>) -> Vec<f32> {
    let hd = c.heads * c.d;
    let kv_len = c.kv_len.unwrap_or(c.tk);
    let mut out = vec![0f32; c.b * c.tq * hd];
    for b in 0..c.b {
        let kb = if c.bk == 1 { 0 } else { b };
        for h in 0..c.heads {
            for i in 0..c.tq {
                let qrow = &q[(b * c.tq + i) * hd + h * c.d..][..c.d];
                let mut scores: Vec<Option<f64>> = Vec::with_capacity(c.tk);
                for j in 0..c.tk {
                    let visible = j < kv_len && (!c.causal || j <= c.q_offset + i);
                    if !visible {
                        scores.push(None);
                        continue;
                    }
                    let krow = &k[(kb * c.tk + j) * hd + h * c.d..][..c.d];
                    let mut s: f64 = qrow
                        .iter()
                        .zip(krow)
                        .map(|(&a, &b)| (a * c.scale) as f64 * b as f64)
                        .sum();
                    if let Some(m) = mask {
                        s += m[i * c.tk + j] as f64;
                    }
                    scores.push(if s.is_finite() { Some(s) } else { None });
                }
                let mx = scores.iter().flatten().cloned().fold(f64::MIN, f64::max);
                let w: Vec<f64> = scores
                    .iter()
                    .map(|s| s.map(|s| (s - mx).exp()).unwrap_or(0.0))
                    .collect();
                let sum: f64 = w.iter().sum();
                for dd in 0..c.d {
                    let mut o = 0f64;
                    for (j, wj) in w.iter().enumerate() {
                        if *wj != 0.0 {
                            o += wj * v[(kb * c.tk + j) * hd + h * c.d + dd] as f64;
                        }
                    }
                    out[(b * c.tq + i) * hd + h * c.d + dd] =
                        if sum > 0.0 { (o / sum) as f32 } else { 0.0 };
                }
            }
        }
    }
    out
}

fn run(name: &str, c: &Case, seed: u64) {
    let g = gpu();
    let mut rng = Rng::new(seed);
    let hd = c.heads * c.d;
    // Scores of a few units: q, k in [-2, 2) gives |q.k| * scale up to ~4 for D = 16, so the softmax is
    // neither flat nor one-hot.
    let q = rng.vec(c.b * c.tq * hd, 2.0);
    let k = rng.vec(c.bk * c.tk * hd, 2.0);
    let v = rng.vec(c.bk * c.tk * hd, 1.0);
    let mask: Option<Vec<f32>> = c.mask.then(|| {
        (0..c.tq * c.tk)
            .map(|i| {
                // Mix of finite biases and hard -inf / finfo.min bans (never a whole row).
                match i % 7 {
                    3 if i % c.tk != 0 => f32::NEG_INFINITY,
                    5 if i % c.tk != 0 => f32::MIN,
                    _ => rng.uniform() * 3.0,
                }
            })
            .collect()
    });
    let tq_ = Tensor::from_f32(&g, &[c.b, c.tq, hd], &q, "q").unwrap();
    let tm = mask
        .as_ref()
        .map(|m| Tensor::from_f32(&g, &[c.tq, c.tk], m, "mask").unwrap());
    let opts = AttnOpts {
        heads: c.heads,
        scale: c.scale,
        causal: c.causal,
        kv_len: c.kv_len.map(|l| l as u32),
        q_offset: c.q_offset as u32,
        mask: tm.as_ref(),
        ..Default::default()
    };
    let mut ran = 0;
    for kv in [DType::F32, DType::F16] {
        // f16: the reference sees the rounded values the kernel reads.
        let round = |x: &[f32]| -> Vec<f32> {
            match kv {
                DType::F16 => x.iter().map(|&a| half::f16::from_f32(a).to_f32()).collect(),
                _ => x.to_vec(),
            }
        };
        let (k, v) = (round(&k), round(&v));
        let upload = |x: &[f32], label: &str| match kv {
            DType::F16 => Tensor::from_f32_as_f16(&g, &[c.bk, c.tk, hd], x, label).unwrap(),
            _ => Tensor::from_f32(&g, &[c.bk, c.tk, hd], x, label).unwrap(),
        };
        let (tk_, tv_) = (upload(&k, "k"), upload(&v, "v"));
        let want = cpu_attention(c, &q, &k, &v, mask.as_deref());
        ran += run_variants(
            &format!("{name} kv {kv:?}"),
            c,
            &g,
            (&tq_, &tk_, &tv_),
            &opts,
            &want,
        );
    }
    assert!(ran >= 4);
}

/// Every variant supporting the case's head dim and the automatic choice; returns how many ran.
fn run_variants(
    name: &str,
    c: &Case,
    g: &std::sync::Arc<Device>,
    (tq_, tk_, tv_): (&Tensor, &Tensor, &Tensor),
    opts: &AttnOpts,
    want: &[f32],
) -> usize {
    let hd = c.heads * c.d;
    let mut ran = 0;
    for variant in VARIANTS.iter().map(|&v| Some(v)).chain([None]) {
        if variant.is_some_and(|v| !variant_supports(v, c.d)) {
            continue;
        }
        // NaN-filled so that an output the kernel never writes fails.
        let to =
            Tensor::from_f32(g, &[c.b, c.tq, hd], &vec![f32::NAN; c.b * c.tq * hd], "out").unwrap();
        let mut rec = Recorder::new(g);
        match variant {
            Some(var) => attention(
                &mut rec,
                tq_,
                tk_,
                tv_,
                &AttnOpts {
                    variant: Some(var),
                    ..*opts
                },
                &to,
            )
            .unwrap(),
            None => attention(&mut rec, tq_, tk_, tv_, opts, &to).unwrap(),
        }
        rec.submit().unwrap();
        let got = readback::to_f32_blocking(g, &to).unwrap();
        assert_close(&format!("{name} [{variant:?}]"), &got, want, TOL);
        ran += 1;
    }
    assert!(ran >= 2);
    ran
}

#[test]
fn plain_odd_sizes_several_tiles() {
    // Tq not a multiple of the q block, Tk not a multiple of the key tile, odd head dim.
    run("plain b2 h3 d20 tq19 tk37", &Case::new(2, 19, 37, 3, 20), 1);
    run("plain b1 h2 d64 tq33 tk70", &Case::new(1, 33, 70, 2, 64), 2);
}

#[test]
fn window_shape_many_batches() {
    // DaViT window attention: Tq = Tk = 144 (12x12 window), head dim 32, many windows.
    run("window b9 h2 d32 t144", &Case::new(9, 144, 144, 2, 32), 3);
}

#[test]
fn causal_self_attention_prefill_and_offset() {
    let mut c = Case::new(2, 13, 13, 2, 16);
    c.causal = true;
    run("causal prefill", &c, 4);
    // Queries at absolute positions 5.. over a cache of 20 rows holding 5 + 7 valid rows.
    let mut c = Case::new(2, 7, 20, 2, 16);
    c.causal = true;
    c.q_offset = 5;
    c.kv_len = Some(12);
    run("causal q_offset 5 kv_len 12", &c, 5);
}

#[test]
fn decode_step_kv_len_and_shared_kv() {
    // Decoder self-attention step: Tq = 1, cache of 40 rows filled to 23, per-beam caches.
    let mut c = Case::new(3, 1, 40, 4, 16);
    c.kv_len = Some(23);
    c.causal = true;
    c.q_offset = 22;
    run("decode self kv_len 23", &c, 6);
    // Cross-attention: Tq = 1, K/V of one image shared by 3 beams (Bk = 1).
    let mut c = Case::new(3, 1, 61, 4, 64);
    c.bk = 1;
    run("decode cross bk=1", &c, 7);
    // Bk = 1 with several query rows.
    let mut c = Case::new(2, 5, 17, 2, 8);
    c.bk = 1;
    run("bk=1 tq5", &c, 8);
}

#[test]
fn additive_mask_with_hard_bans() {
    let mut c = Case::new(2, 9, 29, 2, 16);
    c.mask = true;
    run("mask", &c, 9);
    let mut c = Case::new(1, 6, 11, 1, 8);
    c.mask = true;
    c.causal = true;
    run("mask + causal", &c, 10);
}

#[test]
fn empty_cache_gives_zeros_and_long_keys_work() {
    let mut c = Case::new(1, 2, 8, 1, 8);
    c.kv_len = Some(0);
    run("kv_len 0", &c, 11);
    // Long key range (encoder-sized), one query row per block boundary.
    run("long tk 600", &Case::new(1, 3, 600, 2, 64), 12);
}

#[test]
fn rejects_bad_shapes() {
    let g = gpu();
    let z = |s: &[usize]| Tensor::zeros(&g, s, DType::F32, "t").unwrap();
    let (q, k, out) = (z(&[2, 3, 8]), z(&[2, 5, 8]), z(&[2, 3, 8]));
    let opts = AttnOpts {
        heads: 2,
        scale: 1.0,
        ..Default::default()
    };
    let mut rec = Recorder::new(&g);
    // k/v batch 3 is neither 1 nor 2.
    let bad_k = z(&[3, 5, 8]);
    assert!(attention(&mut rec, &q, &bad_k, &bad_k, &opts, &out).is_err());
    // heads do not divide the width.
    let o3 = AttnOpts { heads: 3, ..opts };
    assert!(attention(&mut rec, &q, &k, &k, &o3, &out).is_err());
    // kv_len beyond Tk.
    let o = AttnOpts {
        kv_len: Some(6),
        ..opts
    };
    assert!(attention(&mut rec, &q, &k, &k, &o, &out).is_err());
    // mask of the wrong shape.
    let m = z(&[3, 4]);
    let o = AttnOpts {
        mask: Some(&m),
        ..opts
    };
    assert!(attention(&mut rec, &q, &k, &k, &o, &out).is_err());
    // out shape mismatch.
    assert!(attention(&mut rec, &q, &k, &k, &opts, &z(&[2, 3, 4])).is_err());
    // K and V of different dtypes; an f16 query or output; q8 K/V.
    let k16 = Tensor::zeros(&g, &[2, 5, 8], DType::F16, "k16").unwrap();
    assert!(attention(&mut rec, &q, &k16, &k, &opts, &out).is_err());
    assert!(attention(&mut rec, &q, &k, &k16, &opts, &out).is_err());
    let q16 = Tensor::zeros(&g, &[2, 3, 8], DType::F16, "q16").unwrap();
    assert!(attention(&mut rec, &q16, &k16, &k16, &opts, &out).is_err());
    assert!(attention(&mut rec, &q, &k16, &k16, &opts, &q16).is_err());
    attention(&mut rec, &q, &k16, &k16, &opts, &out).unwrap();
    // Good call still records.
    attention(&mut rec, &q, &k, &k, &opts, &out).unwrap();
}

#[test]
fn decode_kernel_paths() {
    // Tq = 1 takes the decode kernel: with a mask + causal, with a head dim above its 64 invocations
    // (each invocation owns whole output columns), and with several groups of keys per column (D = 8).
    let mut c = Case::new(2, 1, 30, 2, 16);
    c.mask = true;
    c.causal = true;
    c.q_offset = 20;
    run("decode mask + causal", &c, 13);
    run("decode d80", &Case::new(2, 1, 33, 2, 80), 14);
    let mut c = Case::new(3, 1, 50, 3, 8);
    c.bk = 1;
    run("decode d8 bk=1", &c, 15);
    // A key range beyond the decode kernel's 2048-score buffer falls back to the tiled kernel.
    run("decode tk 2100 (tiled)", &Case::new(1, 1, 2100, 1, 8), 16);
}

#[test]
fn variant_choice_and_refusals() {
    let g = gpu();
    let mut caps = g.caps.clone();
    caps.is_cpu = true;
    assert_eq!(choose_attention_variant(&caps, 64), AttnVariant::Rows);
    assert_eq!(choose_attention_variant(&caps, 80), AttnVariant::Rows);
    // Head dims the register kernel cannot hold fall back to the tiled kernel.
    assert_eq!(choose_attention_variant(&caps, 18), AttnVariant::Tiled);
    assert_eq!(choose_attention_variant(&caps, 96), AttnVariant::Tiled);
    caps.is_cpu = false;
    assert_eq!(choose_attention_variant(&caps, 64), AttnVariant::Tiled);
    // A forced variant refuses a head dim it does not support; the automatic choice still runs it.
    let mut c = Case::new(1, 5, 9, 2, 6);
    c.causal = true;
    run("d6 (tiled only)", &c, 17);
    let z = |s: &[usize]| Tensor::zeros(&g, s, DType::F32, "t").unwrap();
    let (q, out) = (z(&[1, 5, 12]), z(&[1, 5, 12]));
    let opts = AttnOpts {
        heads: 2,
        ..Default::default()
    };
    let mut rec = Recorder::new(&g);
    assert!(attention(
        &mut rec,
        &q,
        &q,
        &q,
        &AttnOpts {
            variant: Some(AttnVariant::Rows),
            ..opts
        },
        &out
    )
    .is_err());
    attention(
        &mut rec,
        &q,
        &q,
        &q,
        &AttnOpts {
            variant: Some(AttnVariant::Tiled),
            ..opts
        },
        &out,
    )
    .unwrap();
}

#[test]
fn flash_tiles_row_blocks_and_key_splits() {
    // Row blocks of 64 with a ragged last block (65 rows), keys over several tiles and not a multiple of
    // the tile (KT = 28 at D = 64, 56 at D = 32), several heads, causal prefill with an offset.
    run("flash tq65 tk61 d64 h3", &Case::new(1, 65, 61, 3, 64), 20);
    let mut c = Case::new(2, 70, 130, 2, 32);
    c.causal = true;
    c.q_offset = 60;
    run("flash causal tq70 tk130 d32 off60", &c, 21);
    // Few rows: each row split over S invocations (S = 16 at D = 64 with 1-2 rows, 64 at D = 4) whose
    // partial softmax states are merged; keys ragged against KT, a mask with hard bans, a cache fill.
    let mut c = Case::new(3, 2, 45, 2, 64);
    c.mask = true;
    run("flash split tq2 tk45 d64 mask", &c, 22);
    let mut c = Case::new(2, 1, 300, 2, 4);
    c.kv_len = Some(211);
    run("flash split tq1 d4 kv_len 211", &c, 23);
    let mut c = Case::new(4, 1, 77, 3, 32);
    c.bk = 1;
    run("flash cross tq1 bk1 d32", &c, 24);
    // A causal row block whose last visible key falls inside a tile: rows of one block see different
    // numbers of keys.
    let mut c = Case::new(1, 9, 40, 1, 16);
    c.causal = true;
    c.q_offset = 25;
    c.kv_len = Some(34);
    run("flash causal inside a tile", &c, 25);
}

/// A fresh device, so the choices set here cannot reach the other tests' automatic runs.
fn fresh_gpu() -> std::sync::Arc<Device> {
    pollster::block_on(Device::new(DeviceOptions::default())).expect("a GPU adapter (lavapipe)")
}

#[test]
fn attention_follows_the_registry() {
    let g = fresh_gpu();
    // 20 rows: flash runs one block of 20 rows x 2 invocations, flash_split 16 x 4 (another kernel).
    let c = Case::new(2, 20, 30, 2, 16);
    let hd = c.heads * c.d;
    let mut rng = Rng::new(30);
    let (q, k, v) = (
        rng.vec(c.b * c.tq * hd, 2.0),
        rng.vec(c.b * c.tk * hd, 2.0),
        rng.vec(c.b * c.tk * hd, 1.0),
    );
    let want = cpu_attention(&c, &q, &k, &v, None);
    let t = |s: &[usize], x: &[f32]| Tensor::from_f32(&g, s, x, "t").unwrap();
    let (tq_, tk_, tv_) = (
        t(&[c.b, c.tq, hd], &q),
        t(&[c.b, c.tk, hd], &k),
        t(&[c.b, c.tk, hd], &v),
    );
    let out = Tensor::zeros(&g, &[c.b, c.tq, hd], DType::F32, "out").unwrap();
    let opts = AttnOpts {
        heads: c.heads,
        scale: c.scale,
        ..Default::default()
    };
    let class = ShapeClass::attention(c.b * c.tq, c.tk, c.d, c.heads, false, false);
    assert_eq!(class.describe(), "attention M<=64 Tk<=32 D=16 H=2");
    // Each choice builds its own kernel the first time it is chosen, and gives the reference result.
    for choice in ["flash", "tiled", "rows", "flash_split"] {
        g.choices
            .set(class, AttnVariant::from_name(choice).unwrap().name());
        let before = g.kernels.len();
        let mut rec = Recorder::new(&g);
        attention(&mut rec, &tq_, &tk_, &tv_, &opts, &out).unwrap();
        rec.submit().unwrap();
        assert_eq!(g.kernels.len(), before + 1, "{choice} kernel built");
        let got = readback::to_f32_blocking(&g, &out).unwrap();
        assert_close(&format!("registry {choice}"), &got, &want, TOL);
    }
    // A choice that cannot run the call (rows at head dim 20, flash at 72) falls back to the static one.
    let cases = [(20usize, "rows"), (72, "flash")];
    for (d, choice) in cases {
        let c = Case::new(1, 3, 9, 1, d);
        let q = rng.vec(c.tq * d, 2.0);
        let kv = rng.vec(c.tk * d, 1.0);
        let want = cpu_attention(&c, &q, &kv, &kv, None);
        let tq_ = t(&[1, c.tq, d], &q);
        let tkv = t(&[1, c.tk, d], &kv);
        let out = Tensor::zeros(&g, &[1, c.tq, d], DType::F32, "out").unwrap();
        g.choices.set(
            ShapeClass::attention(c.tq, c.tk, d, 1, false, false),
            choice,
        );
        let opts = AttnOpts {
            heads: 1,
            scale: c.scale,
            ..Default::default()
        };
        let mut rec = Recorder::new(&g);
        attention(&mut rec, &tq_, &tkv, &tkv, &opts, &out).unwrap();
        rec.submit().unwrap();
        let got = readback::to_f32_blocking(&g, &out).unwrap();
        assert_close(
            &format!("unsupported choice {choice} d{d}"),
            &got,
            &want,
            TOL,
        );
    }
    // The forced flash variant refuses head dims it cannot hold.
    let z = Tensor::zeros(&g, &[1, 2, 72], DType::F32, "z").unwrap();
    let o = AttnOpts {
        heads: 1,
        ..Default::default()
    };
    let mut rec = Recorder::new(&g);
    assert!(attention(
        &mut rec,
        &z,
        &z,
        &z,
        &AttnOpts {
            variant: Some(AttnVariant::Flash),
            ..o
        },
        &z
    )
    .is_err());
}

#[test]
fn tuner_times_attention_and_reuses_its_cache() {
    let g = fresh_gpu();
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("tuning-attention");
    let _ = std::fs::remove_dir_all(&dir);
    let cache = CacheLocation::Dir(dir);
    let shapes = [
        AttnShape {
            b: 1,
            tq: 40,
            bk: 1,
            tk: 40,
            heads: 2,
            d: 32,
            causal: false,
            masked: false,
        },
        AttnShape {
            b: 3,
            tq: 1,
            bk: 1,
            tk: 40,
            heads: 2,
            d: 32,
            causal: false,
            masked: true,
        },
    ];
    let cases: Vec<&dyn TuneCase> = shapes.iter().map(|s| s as &dyn TuneCase).collect();
    let first = pollster::block_on(tune::tune_with(&g, &[], &cases, Tuning::Auto, &cache)).unwrap();
    assert_eq!(first.rows.len(), 2);
    assert_eq!(first.timings, 8, "4 candidates per shape timed");
    for (r, s) in first.rows.iter().zip(&shapes) {
        assert_eq!(r.class, s.class());
        assert_eq!(r.times_ms.len(), 4);
        assert!(r.times_ms.iter().all(|(_, t)| t.is_some_and(|t| t > 0.0)));
        assert_eq!(g.choices.get(&r.class), Some(r.chosen));
    }
    g.choices.clear();
    let second =
        pollster::block_on(tune::tune_with(&g, &[], &cases, Tuning::Auto, &cache)).unwrap();
    assert_eq!(second.timings, 0, "the cache answered");
    assert!(second.rows.iter().all(|r| r.cached));
    for (a, b) in first.rows.iter().zip(&second.rows) {
        assert_eq!(a.chosen, b.chosen);
        assert_eq!(g.choices.get(&b.class), Some(b.chosen));
    }
}

#[test]
fn model_attention_cases_cover_every_attention_kind() {
    use florence2_wasm::config::Florence2Config;
    use florence2_wasm::gpu::registry::{unpack_heads, OpKind};
    let cfg: Florence2Config =
        Florence2Config::from_json_str(include_str!("../fixtures/models/tiny4/config.json"))
            .unwrap();
    let cases = workloads::model_attention_cases(&cfg, 64, 64, 3);
    let classes: Vec<_> = cases.iter().map(|c| c.class()).collect();
    let windows: Vec<_> = classes
        .iter()
        .filter(|c| c.op == OpKind::WindowAttention)
        .collect();
    // One window class per DaViT stage here (the stages differ in width), T = ws * ws tokens.
    assert_eq!(windows.len(), cfg.vision.embed_dim.len());
    let ws = cfg.vision.window_size;
    assert!(windows.iter().all(|c| c.dims[1] == ws * ws));
    let heads = |c: &&florence2_wasm::gpu::registry::ShapeClass| unpack_heads(c.dims[2]);
    assert_eq!(heads(&windows[0]).0, 16 / 2);
    let attn: Vec<_> = classes
        .iter()
        .filter(|c| c.op == OpKind::Attention)
        .collect();
    let t = &cfg.text;
    let d = t.d_model / t.decoder_attention_heads;
    // Encoder self-attention (many rows), then per decode width (1 and 3 rows) self-attention over the
    // position table's cache and cross-attention over the encoder sequence.
    assert_eq!(attn.len(), 5, "{attn:?}");
    assert!(attn[0].dims[0] > 4 && attn[0].dims[0] == attn[0].dims[1]);
    for rows in [1, 3] {
        let mine: Vec<_> = attn.iter().filter(|c| c.dims[0] == rows).collect();
        assert_eq!(mine.len(), 2, "rows {rows}");
        assert!(mine.iter().any(|c| c.dims[1] == t.max_position_embeddings));
        assert!(mine.iter().all(|c| heads(c).0 == d));
    }
    // Every case has at least one candidate on this adapter, and its description names the op.
    let g = gpu();
    for c in &cases {
        assert!(!c.candidates(&g.caps).is_empty());
        assert!(c.class().describe().starts_with(c.class().op.name()));
    }
}
