//! Fused DaViT window attention against an f64 CPU transcription of the reference (per window and head:
//! softmax(q k^T * head_dim^-0.5) v, no mask).
//!
//! Tolerance, per test from the data: a score is a D-term dot product, so its f32 error is at most
//! delta = gamma_D * scale * max sum_e |q_e k_e| (plus one rounding for the pre-scaled q). Softmax weights
//! then move by a factor within e^(+-2 delta); the online softmax rescales the running sums once per key,
//! adding at most ~3 roundings per key to each weighted sum, and the final division one more; so
//! |out - ref| <= (e^(2 delta) - 1 + 3 (T + D + 2) u) max|v|.
#![cfg(not(target_arch = "wasm32"))]
mod common;

use common::{gpu, max_diff, Rng};
use florence2_wasm::gpu::{readback, DType, Recorder, Tensor};
use florence2_wasm::ops;

const U: f64 = f32::EPSILON as f64 / 2.0;

fn run(seed: u64, nw: usize, t: usize, c: usize, heads: usize) {
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
    let to = Tensor::zeros(&g, &[nw, t, c], DType::F32, "out").unwrap();
    let mut rec = Recorder::new(&g);
    ops::window_attn::window_attention(&mut rec, &tq, heads, scale as f32, &to).unwrap();
    rec.submit().unwrap();
    let got = readback::to_f32_blocking(&g, &to).unwrap();
    let (dm, peak) = max_diff(&got, &want);
    eprintln!(
        "window_attention nW{nw} T{t} C{c} heads{heads}: max |diff| = {dm:.3e} (peak {peak:.3e}, tol {tol:.2e})"
    );
    assert!(got.iter().all(|v| v.is_finite()));
    assert!((dm as f64) <= tol, "max |diff| {dm:e} > tol {tol:e}");
}

#[test]
fn window_attention_matches_cpu() {
    run(1, 3, 9, 16, 2); // 3x3 windows, head_dim 8
    run(2, 2, 144, 128, 4); // 12x12 windows, head_dim 32: the released models' shape, the largest supported
    run(3, 4, 5, 8, 2); // T not a multiple of the 4 query rows per invocation, head_dim 4
    run(5, 2, 1, 12, 3); // one token per window
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
}
