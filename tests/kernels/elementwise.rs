//! Element-wise kernels against plain Rust. Exact in f32: one rounding per element on both sides.
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use common::{assert_close, gpu, Rng};
use florence2_wasm::gpu::{readback, Recorder, Tensor};
use florence2_wasm::ops;

#[test]
fn add_matches_cpu_including_odd_and_large_sizes() {
    let g = gpu();
    let mut rng = Rng::new(1);
    // 1 element, a non-multiple of the workgroup, and more than 65535 workgroups' worth (grid folding).
    for n in [1usize, 1000, 256 * 65536 + 3] {
        let a = rng.vec(n, 1.0);
        let b = rng.vec(n, 1.0);
        let ta = Tensor::from_f32(&g, &[n], &a, "a").unwrap();
        let tb = Tensor::from_f32(&g, &[n], &b, "b").unwrap();
        let to = Tensor::zeros(&g, &[n], florence2_wasm::gpu::DType::F32, "out").unwrap();
        let mut rec = Recorder::new(&g);
        ops::elementwise::add(&mut rec, &ta, &tb, &to).unwrap();
        rec.submit().unwrap();
        let got = readback::to_f32_blocking(&g, &to).unwrap();
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_close(&format!("add n={n}"), &got, &want, 0.0);
    }
}

#[test]
fn add_rejects_mismatched_shapes() {
    let g = gpu();
    let a = Tensor::zeros(&g, &[4], florence2_wasm::gpu::DType::F32, "a").unwrap();
    let b = Tensor::zeros(&g, &[5], florence2_wasm::gpu::DType::F32, "b").unwrap();
    let mut rec = Recorder::new(&g);
    let err = ops::elementwise::add(&mut rec, &a, &b, &a).unwrap_err();
    assert!(
        matches!(err, florence2_wasm::Error::Shape { op: "add", .. }),
        "{err}"
    );
}

// scale, add_row, add_rows_at: one f32 rounding per element on both sides, so results are bit-exact
// (tolerance 0). Sizes alternate between multiples of 4 (the vec4 entries) and not (scalar entries).

use common::cpu::{add_row_ref, add_rows_at_ref};
use common::{assert_shape_err, run_f32, tf32, zf32};

#[test]
fn add_in_place_variants() {
    for n in [777, 776] {
        add_in_place_case(n);
    }
}

fn add_in_place_case(n: usize) {
    let g = gpu();
    let mut rng = Rng::new(2);
    let a = rng.vec(n, 1.0);
    let b = rng.vec(n, 1.0);
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    // out == a
    let ta = tf32(&g, &[n], &a);
    let tb = tf32(&g, &[n], &b);
    let got = run_f32(&g, &ta, |r| {
        ops::elementwise::add(r, &ta, &tb, &ta).unwrap()
    });
    assert_close(&format!("add out==a n={n}"), &got, &want, 0.0);
    // out == b
    let ta = tf32(&g, &[n], &a);
    let got = run_f32(&g, &tb, |r| {
        ops::elementwise::add(r, &ta, &tb, &tb).unwrap()
    });
    assert_close(&format!("add out==b n={n}"), &got, &want, 0.0);
    // out == a == b
    let ta = tf32(&g, &[n], &a);
    let got = run_f32(&g, &ta, |r| {
        ops::elementwise::add(r, &ta, &ta, &ta).unwrap()
    });
    let want2: Vec<f32> = a.iter().map(|x| x + x).collect();
    assert_close(&format!("add out==a==b n={n}"), &got, &want2, 0.0);
}

#[test]
fn scale_matches_cpu() {
    let g = gpu();
    let mut rng = Rng::new(3);
    for n in [1usize, 1000, 65_537, 65_536] {
        let x = rng.vec(n, 3.0);
        let s = 0.125_f32 * 1.7;
        let want: Vec<f32> = x.iter().map(|v| v * s).collect();
        let tx = tf32(&g, &[n], &x);
        let to = zf32(&g, &[n]);
        let got = run_f32(&g, &to, |r| {
            ops::elementwise::scale(r, &tx, s, &to).unwrap()
        });
        assert_close(&format!("scale n={n}"), &got, &want, 0.0);
        let got = run_f32(&g, &tx, |r| {
            ops::elementwise::scale(r, &tx, s, &tx).unwrap()
        });
        assert_close(&format!("scale in place n={n}"), &got, &want, 0.0);
    }
}

#[test]
fn add_row_matches_cpu() {
    let g = gpu();
    let mut rng = Rng::new(4);
    for (rows, c) in [
        (1usize, 1usize),
        (1, 300),
        (7, 1),
        (13, 257),
        (5, 4),
        (9, 96),
    ] {
        let x = rng.vec(rows * c, 2.0);
        let row = rng.vec(c, 2.0);
        let want = add_row_ref(&x, &row);
        let tx = tf32(&g, &[rows, c], &x);
        let tr = tf32(&g, &[c], &row);
        let to = zf32(&g, &[rows, c]);
        let got = run_f32(&g, &to, |r| {
            ops::elementwise::add_row(r, &tx, &tr, &to).unwrap()
        });
        assert_close(&format!("add_row ({rows}, {c})"), &got, &want, 0.0);
        let got = run_f32(&g, &tx, |r| {
            ops::elementwise::add_row(r, &tx, &tr, &tx).unwrap()
        });
        assert_close(&format!("add_row in place ({rows}, {c})"), &got, &want, 0.0);
    }
}

#[test]
fn add_rows_at_matches_cpu() {
    let g = gpu();
    let mut rng = Rng::new(5);
    // (T, P, C, start): full table, offset start, one token at the last row (decode step); C = 32, 8
    // run the vec4 entries.
    for (t, p, c, start) in [
        (12usize, 12usize, 33usize, 0u32),
        (5, 12, 33, 4),
        (1, 9, 7, 8),
        (5, 12, 32, 4),
        (1, 9, 8, 8),
    ] {
        let x = rng.vec(t * c, 1.0);
        let table = rng.vec(p * c, 1.0);
        let want = add_rows_at_ref(&x, &table, start as usize, c);
        let tx = tf32(&g, &[t, c], &x);
        let tt = tf32(&g, &[p, c], &table);
        let to = zf32(&g, &[t, c]);
        let got = run_f32(&g, &to, |r| {
            ops::elementwise::add_rows_at(r, &tx, &tt, start, &to).unwrap()
        });
        let name = format!("add_rows_at T={t} P={p} C={c} start={start}");
        assert_close(&name, &got, &want, 0.0);
        let got = run_f32(&g, &tx, |r| {
            ops::elementwise::add_rows_at(r, &tx, &tt, start, &tx).unwrap()
        });
        assert_close(&format!("{name} in place"), &got, &want, 0.0);
    }
}

#[test]
fn scale_add_row_add_rows_at_reject_mismatched_shapes() {
    let g = gpu();
    let mut rec = Recorder::new(&g);
    let x = zf32(&g, &[3, 4]);
    assert_shape_err(
        ops::elementwise::scale(&mut rec, &x, 2.0, &zf32(&g, &[4, 3])),
        "scale",
    );
    assert_shape_err(
        ops::elementwise::add_row(&mut rec, &x, &zf32(&g, &[3]), &zf32(&g, &[3, 4])),
        "add_row",
    );
    let table = zf32(&g, &[5, 4]);
    // start + T = 3 + 3 > 5 rows
    assert_shape_err(
        ops::elementwise::add_rows_at(&mut rec, &x, &table, 3, &zf32(&g, &[3, 4])),
        "add_rows_at",
    );
    assert_shape_err(
        ops::elementwise::add_rows_at(&mut rec, &x, &zf32(&g, &[5, 3]), 0, &zf32(&g, &[3, 4])),
        "add_rows_at",
    );
}
