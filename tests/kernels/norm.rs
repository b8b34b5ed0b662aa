//! LayerNorm against an f64 CPU reference.
//!
//! Both kernel variants (workgroup tree reduction, row per invocation) are checked.
//!
//! Tolerance: 1e-5 absolute for outputs of size up to ~|gamma| * 4 + |beta| ~ 10. The kernels sum C
//! values in f32 (a tree reduction, or four interleaved partial sums with a mean-correction pass that
//! makes the mean's rounding error second order), so the variance carries a relative error of a few
//! times 1e-7 for C <= 1000, and each output rounds a few products; with outputs ~10 one f32 ulp is
//! ~1e-6, so 1e-5 leaves ~10 ulp, while a wrong variance (biased vs unbiased: a factor 768/767) or a
//! missing beta would be off by 1e-3 or more. Inputs carry a mean offset (3.0) larger than their spread,
//! which a naive one-pass E[x^2] - E[x]^2 would fail.
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use common::cpu::layer_norm_ref;
use common::{assert_close, assert_shape_err, gpu, run_f32, tf32, zf32, Rng};
use florence2_wasm::gpu::Recorder;
use florence2_wasm::ops;
use florence2_wasm::ops::norm::RowStrategy;

fn case(rows: usize, c: usize, seed: u64, in_place: bool) {
    for strategy in [
        RowStrategy::Workgroup,
        RowStrategy::Invocation,
        RowStrategy::Auto,
    ] {
        case_with(rows, c, seed, in_place, strategy);
    }
}

fn case_with(rows: usize, c: usize, seed: u64, in_place: bool, strategy: RowStrategy) {
    let g = gpu();
    let mut rng = Rng::new(seed);
    // Rows with a mean offset (3.0) larger than their spread, so one-pass variance would cancel.
    let x: Vec<f32> = rng.vec(rows * c, 1.0).iter().map(|v| v + 3.0).collect();
    let gamma: Vec<f32> = rng.vec(c, 1.0).iter().map(|v| 1.5 + v).collect();
    let beta = rng.vec(c, 2.0);
    let eps = 1e-5;
    let want = layer_norm_ref(&x, &gamma, &beta, eps, c);
    let tx = tf32(&g, &[rows, c], &x);
    let tg = tf32(&g, &[c], &gamma);
    let tb = tf32(&g, &[c], &beta);
    let name = format!("layer_norm ({rows}, {c}) in_place={in_place} {strategy:?}");
    let got = if in_place {
        run_f32(&g, &tx, |r| {
            ops::norm::layer_norm_with(r, &tx, (&tg, &tb), eps, &tx, strategy).unwrap()
        })
    } else {
        let to = zf32(&g, &[rows, c]);
        run_f32(&g, &to, |r| {
            ops::norm::layer_norm_with(r, &tx, (&tg, &tb), eps, &to, strategy).unwrap()
        })
    };
    assert_close(&name, &got, &want, 1e-5);
}

#[test]
fn layer_norm_c768_affine_matches_cpu() {
    case(3, 768, 21, false);
}

#[test]
fn layer_norm_odd_and_degenerate_shapes() {
    // C = 1 (output is beta), 1 row, C not a power of two or a multiple of the workgroup.
    case(1, 1, 22, false);
    case(5, 1, 23, false);
    case(1, 300, 24, false);
    case(7, 100, 25, false);
    case(2, 1000, 26, false);
    // More rows than one row-per-invocation workgroup (64), not a multiple of it.
    // (C % 4 == 0 runs the vec4 row-per-invocation entry, other C the scalar one.)
    case(130, 24, 29, false);
    case(70, 27, 30, false);
}

#[test]
fn layer_norm_in_place() {
    case(4, 768, 27, true);
    case(3, 37, 28, true);
}

#[test]
fn layer_norm_rejects_mismatched_shapes() {
    let g = gpu();
    let x = zf32(&g, &[2, 8]);
    let gamma = zf32(&g, &[7]);
    let beta = zf32(&g, &[8]);
    let out = zf32(&g, &[2, 8]);
    let mut rec = Recorder::new(&g);
    assert_shape_err(
        ops::norm::layer_norm(&mut rec, &x, &gamma, &beta, 1e-5, &out),
        "layer_norm",
    );
    let gamma = zf32(&g, &[8]);
    let out = zf32(&g, &[8, 2]);
    assert_shape_err(
        ops::norm::layer_norm(&mut rec, &x, &gamma, &beta, 1e-5, &out),
        "layer_norm",
    );
}
