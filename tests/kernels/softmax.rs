//! Softmax and log-softmax against f64 CPU references.
//!
//! Tolerances: softmax outputs are in [0, 1]; each is exp (a few ulp) times 1/sum where the f32 sum of
//! up to 51328 terms has relative error ~ (C / 256 + log2 256) * eps ~ 2.5e-5 in the worst case but is
//! ~1e-6 in practice for random terms, so 1e-6 absolute (2e-6 for C = 51328, whose outputs are tiny
//! anyway). log-softmax outputs are x - (max + log sum) with |value| up to ~30 here: one ulp of 30 is
//! 2e-6 and log(sum) carries the sum's relative error as an absolute one, so 1e-5.
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use common::cpu::{log_softmax_ref, softmax_ref};
use common::{assert_close, assert_shape_err, gpu, run_f32, tf32, zf32, Rng};
use florence2_wasm::gpu::Recorder;
use florence2_wasm::ops;

fn case(rows: usize, c: usize, scale: f32, seed: u64, in_place: bool) {
    let g = gpu();
    let mut rng = Rng::new(seed);
    let x = rng.vec(rows * c, scale);
    let tol_sm = if c > 10_000 { 2e-6 } else { 1e-6 };
    for log in [false, true] {
        let want = if log {
            log_softmax_ref(&x, c)
        } else {
            softmax_ref(&x, c)
        };
        let tx = tf32(&g, &[rows, c], &x);
        let to = if in_place {
            tx.clone()
        } else {
            zf32(&g, &[rows, c])
        };
        let got = run_f32(&g, &to, |r| {
            if log {
                ops::softmax::log_softmax_rows(r, &tx, &to).unwrap()
            } else {
                ops::softmax::softmax_rows(r, &tx, &to).unwrap()
            }
        });
        let name = format!(
            "{} ({rows}, {c}) scale {scale} in_place={in_place}",
            if log { "log_softmax" } else { "softmax" }
        );
        assert_close(&name, &got, &want, if log { 1e-5 } else { tol_sm });
        if !log {
            for (r, row) in got.chunks(c).enumerate() {
                let s: f64 = row.iter().map(|&v| v as f64).sum();
                assert!((s - 1.0).abs() < 1e-4, "{name}: row {r} sums to {s}");
            }
        }
    }
}

#[test]
fn softmax_matches_cpu() {
    case(5, 300, 4.0, 31, false);
    case(3, 77, 10.0, 32, false);
}

#[test]
fn softmax_degenerate_shapes() {
    case(1, 1, 1.0, 33, false); // a single element: softmax 1, log_softmax 0
    case(9, 1, 1.0, 34, false);
    case(1, 2, 30.0, 35, false);
}

#[test]
fn softmax_vocab_rows() {
    // Rows of the vocabulary size (51328), logits spread like a real LM head's.
    case(2, 51328, 12.0, 36, false);
}

#[test]
fn softmax_large_offsets_are_stable() {
    // exp(1000) overflows f32: only a max-subtracted kernel stays finite.
    let g = gpu();
    let x: Vec<f32> = vec![1000.0, 999.0, 998.0, -1000.0, 5.0, 1e30, -3.0e38, 0.0];
    let c = 4;
    let tx = tf32(&g, &[2, c], &x);
    let to = zf32(&g, &[2, c]);
    let got = run_f32(&g, &to, |r| {
        ops::softmax::softmax_rows(r, &tx, &to).unwrap()
    });
    assert_close("softmax large offsets", &got, &softmax_ref(&x, c), 1e-6);
    let got = run_f32(&g, &to, |r| {
        ops::softmax::log_softmax_rows(r, &tx, &to).unwrap()
    });
    // Entries ~1e30 below the max: compare relative to their size (2 ulp).
    let want = log_softmax_ref(&x, c);
    for (a, b) in got.iter().zip(&want) {
        assert!(
            (a - b).abs() <= 1e-5_f32.max(b.abs() * 2.5e-7),
            "log_softmax large offsets: {a} vs {b}"
        );
    }
}

#[test]
fn softmax_in_place() {
    case(4, 513, 5.0, 37, true);
}

#[test]
fn softmax_rejects_mismatched_shapes() {
    let g = gpu();
    let x = zf32(&g, &[2, 8]);
    let out = zf32(&g, &[2, 7]);
    let mut rec = Recorder::new(&g);
    assert_shape_err(
        ops::softmax::softmax_rows(&mut rec, &x, &out),
        "softmax_rows",
    );
    assert_shape_err(
        ops::softmax::log_softmax_rows(&mut rec, &x, &out),
        "log_softmax_rows",
    );
}
