//! `channel_attention` against an f64 CPU transcription of the reference's grouped channel attention
//! (qkv reshaped (B, N, 3, groups, d); logits = q^T k over the token axis * N^-0.5; softmax over the last
//! axis; out[n, g*d + i] = sum_j attn[i, j] v[n, j]).
//!
//! Tolerance, per test from the data: a logit is a sum of N products, so its f32 error is at most
//! delta = gamma_N * scale * max_ij sum_n |q_i k_j| (any summation order, including the split one). A softmax
//! whose inputs move by <= delta moves each weight by a factor within e^(+-2 delta), so an output
//! sum_j attn_j v_j moves by <= (e^(2 delta) - 1) max|v| plus its own d-term rounding gamma_d max|v|; the exp
//! itself adds a few ulps (counted as 8u). The check uses that bound.
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use common::cpu::channel_attn_ref;
use common::{gpu, max_diff, Rng};
use florence2_wasm::gpu::{readback, DType, Recorder, Tensor};
use florence2_wasm::ops;

fn run(seed: u64, b: usize, n: usize, c: usize, groups: usize) {
    let g = gpu();
    let mut rng = Rng::new(seed);
    let qkv = rng.vec(b * n * 3 * c, 1.0);
    let (want, tol) = channel_attn_ref(&qkv, b, n, c, groups);
    let tq = Tensor::from_f32(&g, &[b, n, 3 * c], &qkv, "qkv").unwrap();
    let to = Tensor::zeros(&g, &[b, n, c], DType::F32, "out").unwrap();
    let mut rec = Recorder::new(&g);
    ops::channel_attn::channel_attention(&mut rec, &tq, groups, &to).unwrap();
    rec.submit().unwrap();
    let got = readback::to_f32_blocking(&g, &to).unwrap();
    let (dmax, peak) = max_diff(&got, &want);
    eprintln!(
        "channel_attention B{b} N{n} C{c} groups{groups}: max |diff| = {dmax:.3e} (peak {peak:.3e}, tol {tol:.2e})"
    );
    assert!(got.iter().all(|v| v.is_finite()), "non-finite output");
    assert!((dmax as f64) <= tol, "max |diff| {dmax:e} > tol {tol:e}");
    // With the Gram partials in a caller's scratch buffer (big enough, holding stale values, then too
    // small: a fresh buffer): the same bits.
    let stale: Vec<f32> = (0..b * n * 3 * c).map(|i| i as f32).collect();
    for len in [b * n * 3 * c, 1] {
        let scratch = Tensor::from_f32(&g, &[len], &stale[..len], "scratch").unwrap();
        let to2 = Tensor::zeros(&g, &[b, n, c], DType::F32, "out2").unwrap();
        let mut rec = Recorder::new(&g);
        ops::channel_attn::channel_attention_with_scratch(&mut rec, &tq, groups, &to2, &scratch)
            .unwrap();
        rec.submit().unwrap();
        let got2 = readback::to_f32_blocking(&g, &to2).unwrap();
        assert!(
            got2.iter()
                .zip(&got)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "scratch of {len} floats changes the output"
        );
    }
    // The partials in the output's own buffer (as DaViT's arena runs it: they are reduced before the
    // output is written): the same bits.
    let out3 = Tensor::from_f32(&g, &[b * n * c], &stale[..b * n * c], "out3").unwrap();
    let to3 = out3.reshape(&[b, n, c]).unwrap();
    let mut rec = Recorder::new(&g);
    ops::channel_attn::channel_attention_with_scratch(&mut rec, &tq, groups, &to3, &out3).unwrap();
    rec.submit().unwrap();
    let got3 = readback::to_f32_blocking(&g, &to3).unwrap();
    assert!(
        got3.iter()
            .zip(&got)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "partials in the output buffer change the output"
    );
    // q|k and v computed apart (`channel_attention_logits` on (B, N, 2C), then `apply` on (B, N, C),
    // as DaViT's arena runs it where the qkv weight splits): the same bits.
    let (qk, v): (Vec<f32>, Vec<f32>) = {
        let (mut qk, mut v) = (Vec::new(), Vec::new());
        for row in qkv.chunks(3 * c) {
            qk.extend_from_slice(&row[..2 * c]);
            v.extend_from_slice(&row[2 * c..]);
        }
        (qk, v)
    };
    let tqk = Tensor::from_f32(&g, &[b, n, 2 * c], &qk, "qk").unwrap();
    let tv = Tensor::from_f32(&g, &[b, n, c], &v, "v").unwrap();
    for partials in [None, Some(&out3)] {
        let to4 = Tensor::zeros(&g, &[b, n, c], DType::F32, "out4").unwrap();
        let mut rec = Recorder::new(&g);
        let logits =
            ops::channel_attn::channel_attention_logits(&mut rec, &tqk, groups, partials).unwrap();
        logits.apply(&mut rec, &tv, &to4).unwrap();
        rec.submit().unwrap();
        let got4 = readback::to_f32_blocking(&g, &to4).unwrap();
        assert!(
            got4.iter()
                .zip(&got)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "q|k and v apart change the output"
        );
    }
    // qkv and out must not share a buffer (the output would overwrite rows still to be read).
    let mut rec = Recorder::new(&g);
    assert!(ops::channel_attn::channel_attention_with_scratch(
        &mut rec,
        &tq,
        groups,
        &tq.view(&[b, n, c], DType::F32).unwrap(),
        &out3
    )
    .is_err());
}

// C and d multiples of 4 take the vec4 kernels (`gram_partial4`, `attn_apply4`), anything else the scalar
// ones; both paths are covered below.

#[test]
fn channel_attention_small_groups() {
    run(1, 1, 20, 12, 3); // d = 4 (vec4)
}

#[test]
fn channel_attention_vec4_long_n_two_tiles() {
    // vec4 path: N = 600 (3 splits, the last partial), d = 40 spans two 32-wide tiles (second one partial).
    run(5, 1, 600, 80, 2);
}

#[test]
fn channel_attention_long_n_splits_and_odd_group_width() {
    // Scalar path: N = 600 > 2 chunks of 256 with a partial third; d = 37 spans two 32-wide tiles, not a
    // multiple of 4.
    run(2, 1, 600, 74, 2);
}

#[test]
fn channel_attention_batched_and_single_token() {
    run(3, 2, 33, 16, 4); // vec4
    run(4, 1, 1, 8, 2); // one token: logits are a single product (vec4)
    run(6, 2, 7, 6, 3); // d = 2: scalar path, batched
}

#[test]
fn channel_attention_rejects_bad_shapes() {
    let g = gpu();
    let q = Tensor::zeros(&g, &[1, 4, 12], DType::F32, "qkv").unwrap();
    let o = Tensor::zeros(&g, &[1, 4, 4], DType::F32, "o").unwrap();
    let mut rec = Recorder::new(&g);
    let e = ops::channel_attn::channel_attention(&mut rec, &q, 3, &o).unwrap_err(); // 4 % 3 != 0
    assert!(
        matches!(
            e,
            florence2_wasm::Error::Shape {
                op: "channel_attention",
                ..
            }
        ),
        "{e}"
    );
    let o_bad = Tensor::zeros(&g, &[1, 5, 4], DType::F32, "o").unwrap();
    let e = ops::channel_attn::channel_attention(&mut rec, &q, 2, &o_bad).unwrap_err();
    assert!(
        matches!(
            e,
            florence2_wasm::Error::Shape {
                op: "channel_attention",
                ..
            }
        ),
        "{e}"
    );
}
