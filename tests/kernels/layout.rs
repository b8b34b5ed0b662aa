//! permute and split_qkv against CPU index arithmetic. Pure data movement: bit-exact
//! (tolerance 0).
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use common::cpu::{permute_ref, split_qkv_ref};
use common::{assert_close, assert_shape_err, gpu, run_f32, tf32, tu32, zf32, zu32, Rng};
use florence2_wasm::gpu::{readback, Recorder};
use florence2_wasm::ops;

#[test]
fn split_qkv_matches_cpu() {
    let g = gpu();
    let mut rng = Rng::new(51);
    // C = 4 and 96 run the vec4 entry, 1 and 33 the scalar one.
    for (rows, c) in [(1usize, 1usize), (7, 33), (300, 96), (1, 4)] {
        let qkv = rng.vec(rows * 3 * c, 1.0);
        let (wq, wk, wv) = split_qkv_ref(&qkv, c);
        let tqkv = tf32(&g, &[rows, 3 * c], &qkv);
        let (q, k, v) = (
            zf32(&g, &[rows, c]),
            zf32(&g, &[rows, c]),
            zf32(&g, &[rows, c]),
        );
        let got_q = run_f32(&g, &q, |r| {
            ops::layout::split_qkv(r, &tqkv, &q, &k, &v).unwrap()
        });
        let got_k = readback::to_f32_blocking(&g, &k).unwrap();
        let got_v = readback::to_f32_blocking(&g, &v).unwrap();
        assert_close(&format!("split_qkv q ({rows}, {c})"), &got_q, &wq, 0.0);
        assert_close(&format!("split_qkv k ({rows}, {c})"), &got_k, &wk, 0.0);
        assert_close(&format!("split_qkv v ({rows}, {c})"), &got_v, &wv, 0.0);
    }
}

#[test]
fn permute_matches_cpu() {
    let g = gpu();
    let mut rng = Rng::new(52);
    let cases: &[(&[usize], &[usize])] = &[
        (&[5], &[0]),
        (&[3, 7], &[1, 0]),
        (&[1, 1], &[1, 0]),
        (&[2, 3, 5], &[2, 0, 1]),
        (&[2, 3, 5], &[0, 2, 1]),
        // mlx channels-last conv weight (O, kH, kW, I) -> (O, I, kH, kW)
        (&[8, 7, 7, 3], &[0, 3, 1, 2]),
        (&[4, 3, 3, 1], &[0, 3, 1, 2]),
        (&[2, 3, 4, 5], &[3, 2, 1, 0]),
        (&[2, 3, 4, 5], &[0, 1, 2, 3]),
    ];
    for (shape, dims) in cases {
        let n: usize = shape.iter().product();
        let x = rng.vec(n, 1.0);
        let want = permute_ref(&x, shape, dims);
        let out_shape: Vec<usize> = dims.iter().map(|&d| shape[d]).collect();
        let tx = tf32(&g, shape, &x);
        let to = zf32(&g, &out_shape);
        let got = run_f32(&g, &to, |r| {
            ops::layout::permute(r, &tx, dims, &to).unwrap()
        });
        assert_close(&format!("permute {shape:?} by {dims:?}"), &got, &want, 0.0);
    }
    // u32 data moves as raw bits too.
    let x: Vec<u32> = (0..60).map(|i| i * 7 + 1).collect();
    let want = permute_ref(&x, &[3, 4, 5], &[1, 2, 0]);
    let tx = tu32(&g, &[3, 4, 5], &x);
    let to = zu32(&g, &[4, 5, 3]);
    let mut rec = Recorder::new(&g);
    ops::layout::permute(&mut rec, &tx, &[1, 2, 0], &to).unwrap();
    rec.submit().unwrap();
    assert_eq!(readback::to_u32_blocking(&g, &to).unwrap(), want);
}

#[test]
fn layout_ops_reject_mismatched_shapes() {
    let g = gpu();
    let mut rec = Recorder::new(&g);
    let x = zf32(&g, &[2, 3, 4]);
    assert_shape_err(
        ops::layout::permute(&mut rec, &x, &[0, 2, 1], &zf32(&g, &[2, 3, 4])),
        "permute",
    );
    assert_shape_err(
        ops::layout::permute(&mut rec, &x, &[0, 1, 1], &zf32(&g, &[2, 3, 3])),
        "permute",
    );
    assert_shape_err(
        ops::layout::permute(&mut rec, &x, &[0, 1], &zf32(&g, &[2, 3])),
        "permute",
    );
    let qkv = zf32(&g, &[5, 12]);
    let (q, k) = (zf32(&g, &[5, 4]), zf32(&g, &[5, 4]));
    assert_shape_err(
        ops::layout::split_qkv(&mut rec, &qkv, &q, &k, &zf32(&g, &[5, 3])),
        "split_qkv",
    );
    assert_shape_err(
        ops::layout::split_qkv(&mut rec, &zf32(&g, &[5, 10]), &q, &k, &zf32(&g, &[5, 4])),
        "split_qkv",
    );
}
