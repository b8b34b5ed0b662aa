//! Fused DaViT window attention against an f64 CPU transcription of the reference (per window and head:
//! softmax(q k^T * head_dim^-0.5) v, no mask). Every case runs every variant that supports it, forced
//! (`WindowAttnVariant::ALL`: the register kernel and the flash kernel over the fused qkv), and the
//! automatic choice.
//!
//! Tolerance, per test from the data: a score is a D-term dot product, so its f32 error is at most
//! delta = gamma_D * scale * max sum_e |q_e k_e| (plus one rounding for the pre-scaled q). Softmax weights
//! then move by a factor within e^(+-2 delta); the online softmax rescales the running sums at most once
//! per key (the register kernel per key, the flash kernel per key tile), adding at most ~3 roundings per
//! key to each weighted sum, and the final division one more; so
//! |out - ref| <= (e^(2 delta) - 1 + 3 (T + D + 2) u) max|v|.
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use common::{gpu, max_diff, Rng};
use florence2_wasm::gpu::registry::ShapeClass;
use florence2_wasm::gpu::{readback, DType, Device, DeviceOptions, Recorder, Tensor};
use florence2_wasm::ops;
use florence2_wasm::ops::window_attn::{window_attention_variant, WindowAttnVariant};

const U: f64 = f32::EPSILON as f64 / 2.0;

/// Runs the case on every variant that supports it; returns how many runs there were.
fn run(seed: u64, nw: usize, t: usize, c: usize, heads: usize) -> usize {
    let g = gpu();
    let mut rng = Rng::new(seed);
    let qkv = rng.vec(nw * t * 3 * c, 1.0);
    let d = c / heads;
    let scale = (d as f64).powf(-0.5);
    let mut want = vec![0f32; nw * t * c];
    let (mut delta, mut vmax): (f64, f64) = (0.0, 0.0);
    let at = |w: usize, tok: usize, col: usize| qkv[(w * t + tok) * 3 * c + col] as f64;
    for w in 0..nw {
        for h in 0..heads {
            for i in 0..t {
                let mut s = vec![0f64; t];
                for (j, sj) in s.iter_mut().enumerate() {
                    let (mut acc, mut abs) = (0f64, 0f64);
                    for e in 0..d {
                        let pr = at(w, i, h * d + e) * at(w, j, c + h * d + e);
                        acc += pr;
                        abs += pr.abs();
                    }
                    *sj = acc * scale;
                    delta = delta.max((d + 1) as f64 * U * abs * scale);
                }
                let mx = s.iter().cloned().fold(f64::MIN, f64::max);
                let ex: Vec<f64> = s.iter().map(|v| (v - mx).exp()).collect();
                let sum: f64 = ex.iter().sum();
                for e in 0..d {
                    let mut o = 0f64;
                    for (j, ej) in ex.iter().enumerate() {
                        let v = at(w, j, 2 * c + h * d + e);
                        vmax = vmax.max(v.abs());
                        o += ej / sum * v;
                    }
                    want[(w * t + i) * c + h * d + e] = o as f32;
                }
            }
        }
    }
    let tol = ((2.0 * delta).exp_m1() + 3.0 * (t + d + 2) as f64 * U) * vmax + U;
    let tq = Tensor::from_f32(&g, &[nw, t, 3 * c], &qkv, "qkv").unwrap();
    let mut ran = 0;
    let forced = WindowAttnVariant::ALL
        .into_iter()
        .filter(|v| v.supports(&g.caps, c, heads))
        .map(Some);
    let auto = ops::window_attn::supported(c, heads).then_some(None);
    for variant in forced.chain(auto) {
        // NaN-filled so that an output the kernel never writes fails.
        let to = Tensor::from_f32(&g, &[nw, t, c], &vec![f32::NAN; nw * t * c], "out").unwrap();
        let mut rec = Recorder::new(&g);
        match variant {
            Some(v) => window_attention_variant(&mut rec, v, &tq, heads, scale as f32, &to),
            None => ops::window_attn::window_attention(&mut rec, &tq, heads, scale as f32, &to),
        }
        .unwrap();
        rec.submit().unwrap();
        let got = readback::to_f32_blocking(&g, &to).unwrap();
        let (dm, peak) = max_diff(&got, &want);
        eprintln!(
            "window_attention [{variant:?}] nW{nw} T{t} C{c} heads{heads}: max |diff| = {dm:.3e} (peak {peak:.3e}, tol {tol:.2e})"
        );
        assert!(got.iter().all(|v| v.is_finite()), "{variant:?}");
        assert!(
            (dm as f64) <= tol,
            "{variant:?}: max |diff| {dm:e} > tol {tol:e}"
        );
        ran += 1;
    }
    assert!(ran >= 1);
    ran
}

#[test]
fn window_attention_matches_cpu() {
    // Both forced variants and the automatic choice on every case the register kernel supports.
    assert_eq!(run(1, 3, 9, 16, 2), 3); // 3x3 windows, head_dim 8
                                        // 12x12 windows, head_dim 32: the released models' shape (flash: 3 row blocks, 3 key tiles).
    assert_eq!(run(2, 2, 144, 128, 4), 3);
    assert_eq!(run(3, 4, 5, 8, 2), 3); // T not a multiple of the 4 query rows per invocation, head_dim 4
    assert_eq!(run(5, 2, 1, 12, 3), 3); // one token per window
                                        // 7x7 windows, head_dim 32: the whole window's K/V in one flash tile.
    assert_eq!(run(6, 5, 49, 96, 3), 3);
    // head_dim 64: the flash kernel only (the model routes it through the generic attention statically).
    assert_eq!(run(7, 3, 49, 128, 2), 1);
}

#[test]
fn window_attention_follows_the_registry() {
    let g = pollster::block_on(Device::new(DeviceOptions::default()))
        .expect("a GPU adapter (lavapipe)");
    let (nw, t, c, heads) = (2, 9, 16, 2);
    let qkv = Rng::new(8).vec(nw * t * 3 * c, 1.0);
    let tq = Tensor::from_f32(&g, &[nw, t, 3 * c], &qkv, "qkv").unwrap();
    let class = ShapeClass::window_attention(nw, t, c / heads, heads);
    assert_eq!(class.describe(), "window_attention nW=2 T=9 D=8 H=2");
    let mut outs = Vec::new();
    for choice in ["flash", "rows"] {
        g.choices
            .set(class, WindowAttnVariant::from_name(choice).unwrap().name());
        let before = g.kernels.len();
        let to = Tensor::zeros(&g, &[nw, t, c], DType::F32, "out").unwrap();
        let mut rec = Recorder::new(&g);
        ops::window_attn::window_attention(&mut rec, &tq, heads, 0.3, &to).unwrap();
        rec.submit().unwrap();
        assert_eq!(g.kernels.len(), before + 1, "{choice} kernel built");
        outs.push(readback::to_f32_blocking(&g, &to).unwrap());
    }
    // Same attention in two summation orders: equal within a few f32 roundings of outputs <= 1.
    let (d, _) = max_diff(&outs[0], &outs[1]);
    assert!(d < 1e-5, "flash vs rows: {d}");
}

#[test]
fn window_attention_rejects_unsupported_heads() {
    let g = gpu();
    let q = Tensor::zeros(&g, &[1, 4, 18], DType::F32, "qkv").unwrap(); // C = 6
    let o = Tensor::zeros(&g, &[1, 4, 6], DType::F32, "o").unwrap();
    let mut rec = Recorder::new(&g);
    let e = ops::window_attn::window_attention(&mut rec, &q, 2, 1.0, &o).unwrap_err(); // head_dim 3
    assert!(
        matches!(
            e,
            florence2_wasm::Error::Shape {
                op: "window_attention",
                ..
            }
        ),
        "{e}"
    );
    assert!(!ops::window_attn::supported(6, 2));
    assert!(ops::window_attn::supported(128, 4));
    assert!(!ops::window_attn::supported(128, 2)); // head_dim 64 > 32
                                                   // The flash variant takes head_dim 64 but not 3 or 68.
    let mut rec = Recorder::new(&g);
    let e = window_attention_variant(&mut rec, WindowAttnVariant::Flash, &q, 2, 1.0, &o);
    assert!(matches!(e, Err(florence2_wasm::Error::Shape { .. })));
    assert!(WindowAttnVariant::Flash.supports(&g.caps, 128, 2));
    assert!(!WindowAttnVariant::Flash.supports(&g.caps, 136, 2));
}
