//! argmax_rows, topk_rows and mean_rows against CPU references.
//!
//! argmax/topk select existing values, so indices must match exactly and values bit-exactly,
//! including the tie rule (lower index first) and NaN ranking highest, as torch.argmax/topk.
//! mean_rows sums N values in order in f32: error <= N * eps * max|x| ~ 144 * 6e-8 = 9e-6 in the worst
//! case for |x| <= 1, ~sqrt(N) * eps typically; tolerance 1e-5 (1e-6 for N <= 7).
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use common::cpu::{argmax_ref, mean_rows_ref, topk_ref};
use common::{assert_close, assert_shape_err, gpu, run_f32, tf32, zf32, zu32, Rng};
use florence2_wasm::gpu::{readback, Recorder};
use florence2_wasm::ops;

fn argmax_case(x: &[f32], rows: usize, v: usize, name: &str) {
    let g = gpu();
    let tx = tf32(&g, &[rows, v], x);
    let to = zu32(&g, &[rows]);
    let mut rec = Recorder::new(&g);
    ops::reduce::argmax_rows(&mut rec, &tx, &to).unwrap();
    rec.submit().unwrap();
    let got = readback::to_u32_blocking(&g, &to).unwrap();
    let want = argmax_ref(x, v);
    eprintln!("argmax {name}: got {:?}", &got[..got.len().min(8)]);
    assert_eq!(got, want, "argmax {name}");
}

fn topk_case(x: &[f32], rows: usize, v: usize, k: usize, name: &str) {
    let g = gpu();
    let tx = tf32(&g, &[rows, v], x);
    let tv = zf32(&g, &[rows, k]);
    let ti = zu32(&g, &[rows, k]);
    let mut rec = Recorder::new(&g);
    ops::reduce::topk_rows(&mut rec, &tx, k, &tv, &ti).unwrap();
    rec.submit().unwrap();
    let got_v = readback::to_f32_blocking(&g, &tv).unwrap();
    let got_i = readback::to_u32_blocking(&g, &ti).unwrap();
    let (want_v, want_i) = topk_ref(x, v, k);
    eprintln!(
        "topk {name} k={k}: ids {:?} vals {:?}",
        &got_i[..k.min(8)],
        &got_v[..k.min(8)]
    );
    assert_eq!(got_i, want_i, "topk {name} k={k}: indices");
    let same = got_v
        .iter()
        .zip(&want_v)
        .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()));
    assert!(same, "topk {name} k={k}: values differ");
}

#[test]
fn argmax_matches_cpu() {
    let mut rng = Rng::new(61);
    argmax_case(&[0.5], 1, 1, "1x1");
    let x = rng.vec(5, 1.0);
    argmax_case(&x, 5, 1, "5x1");
    let x = rng.vec(3 * 1000, 1.0);
    argmax_case(&x, 3, 1000, "3x1000");
    let x = rng.vec(2 * 51328, 10.0);
    argmax_case(&x, 2, 51328, "2x51328");
}

#[test]
fn argmax_ties_nan_and_signed_zero() {
    let v = 1000;
    let mut rows = vec![0f32; 5 * v];
    // row 0: all equal -> 0
    // row 1: the max appears at 700, 5 and 999 -> 5 (first)
    rows[v + 700] = 3.0;
    rows[v + 5] = 3.0;
    rows[v + 999] = 3.0;
    // row 2: all negative with -0 at 400 and +0 at 300 -> 300 (equal, lower index)
    for i in 0..v {
        rows[2 * v + i] = -1.0 - i as f32;
    }
    rows[2 * v + 400] = -0.0;
    rows[2 * v + 300] = 0.0;
    // row 3: NaN at 600 and 800 outrank +inf at 10 -> 600
    rows[3 * v + 10] = f32::INFINITY;
    rows[3 * v + 600] = f32::NAN;
    rows[3 * v + 800] = f32::NAN;
    // row 4: -inf everywhere except f32::MIN at the end -> last
    for i in 0..v {
        rows[4 * v + i] = f32::NEG_INFINITY;
    }
    rows[4 * v + v - 1] = f32::MIN;
    argmax_case(&rows, 5, v, "ties/NaN/-0");
    assert_eq!(argmax_ref(&rows, v), vec![0, 5, 300, 600, v as u32 - 1]);
}

#[test]
fn topk_matches_cpu() {
    let mut rng = Rng::new(62);
    let x = rng.vec(2 * 51328, 10.0);
    for k in [1, 6, 16] {
        topk_case(&x, 2, 51328, k, "2x51328");
    }
    let x = rng.vec(3 * 100, 1.0);
    topk_case(&x, 3, 100, 3, "3x100");
    let x = rng.vec(5, 1.0);
    topk_case(&x, 1, 5, 5, "k = V = 5");
    topk_case(&[2.0], 1, 1, 1, "1x1");
}

#[test]
fn topk_ties_come_lowest_index_first() {
    // Values quantised to 5 levels: many exact ties, spread over every invocation's slice.
    let mut rng = Rng::new(63);
    let v = 3000;
    let x: Vec<f32> = rng
        .vec(2 * v, 1.0)
        .iter()
        .map(|a| (a * 2.0).round() * 0.5)
        .collect();
    topk_case(&x, 2, v, 16, "quantised");
    // A NaN and +-0 ties.
    let mut y = vec![-1.0f32; 300];
    y[299] = f32::NAN;
    y[7] = 0.0;
    y[3] = -0.0;
    y[250] = 0.0;
    topk_case(&y, 1, 300, 5, "NaN/-0");
}

#[test]
fn mean_rows_matches_cpu() {
    let g = gpu();
    let mut rng = Rng::new(64);
    for (b, n, c, tol) in [
        (1usize, 1usize, 1usize, 0.0f32),
        (3, 1, 5, 0.0),
        (2, 7, 33, 1e-6),
        (1, 144, 1024, 1e-5),
    ] {
        let x = rng.vec(b * n * c, 1.0);
        let want = mean_rows_ref(&x, b, n, c);
        let tx = tf32(&g, &[b, n, c], &x);
        let to = zf32(&g, &[b, c]);
        let got = run_f32(&g, &to, |r| ops::reduce::mean_rows(r, &tx, &to).unwrap());
        assert_close(&format!("mean_rows ({b}, {n}, {c})"), &got, &want, tol);
    }
}

#[test]
fn reduce_ops_reject_mismatched_shapes() {
    let g = gpu();
    let mut rec = Recorder::new(&g);
    let x = zf32(&g, &[3, 10]);
    assert_shape_err(
        ops::reduce::argmax_rows(&mut rec, &x, &zu32(&g, &[4])),
        "argmax_rows",
    );
    assert_shape_err(
        ops::reduce::argmax_rows(&mut rec, &x, &zf32(&g, &[3])),
        "argmax_rows",
    );
    for k in [0, 11, 17] {
        let kk = k.max(1);
        assert_shape_err(
            ops::reduce::topk_rows(&mut rec, &x, k, &zf32(&g, &[3, kk]), &zu32(&g, &[3, kk])),
            "topk_rows",
        );
    }
    assert_shape_err(
        ops::reduce::topk_rows(&mut rec, &x, 2, &zf32(&g, &[3, 3]), &zu32(&g, &[3, 2])),
        "topk_rows",
    );
    assert_shape_err(
        ops::reduce::mean_rows(&mut rec, &zf32(&g, &[2, 3, 4]), &zf32(&g, &[2, 3])),
        "mean_rows",
    );
    assert_shape_err(
        ops::reduce::mean_rows(&mut rec, &zf32(&g, &[2, 0, 4]), &zf32(&g, &[2, 4])),
        "mean_rows",
    );
}
