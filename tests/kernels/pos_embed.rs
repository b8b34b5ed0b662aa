//! `pos2d_temporal_add` against plain Rust. Two f32 additions per element done in the same order on
//! both sides ((x + pos) + t), so the GPU must match exactly: tolerance 0.
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use common::{assert_close, gpu, Rng};
use florence2_wasm::gpu::{readback, DType, Recorder, Tensor};
use florence2_wasm::ops;

fn run(seed: u64, b: usize, h: usize, w: usize, c: usize, p: usize) {
    let g = gpu();
    let mut rng = Rng::new(seed);
    let ccol = c - c / 2;
    let x = rng.vec(b * h * w * c, 1.0);
    let col = rng.vec(p * ccol, 1.0);
    let row = rng.vec(p * (c / 2), 1.0);
    let temporal = rng.vec(3 * c, 1.0);
    let mut want = vec![0f32; x.len()];
    for bi in 0..b {
        for y in 0..h {
            for xx in 0..w {
                for ch in 0..c {
                    let i = ((bi * h + y) * w + xx) * c + ch;
                    // Column half first, then the row half.
                    let pos = if ch < ccol {
                        col[xx * ccol + ch]
                    } else {
                        row[y * (c / 2) + ch - ccol]
                    };
                    want[i] = (x[i] + pos) + temporal[ch];
                }
            }
        }
    }
    let tx = Tensor::from_f32(&g, &[b, h * w, c], &x, "x").unwrap();
    let tc = Tensor::from_f32(&g, &[p, ccol], &col, "col").unwrap();
    let tr = Tensor::from_f32(&g, &[p, c / 2], &row, "row").unwrap();
    let tt = Tensor::from_f32(&g, &[3, c], &temporal, "t").unwrap();
    let to = Tensor::zeros(&g, &[b, h * w, c], DType::F32, "out").unwrap();
    let mut rec = Recorder::new(&g);
    ops::pos_embed::pos2d_temporal_add(&mut rec, &tx, &tc, &tr, &tt, (h, w), &to).unwrap();
    rec.submit().unwrap();
    let got = readback::to_f32_blocking(&g, &to).unwrap();
    assert_close(
        &format!("pos2d_temporal_add B{b} {h}x{w}x{c} P{p}"),
        &got,
        &want,
        0.0,
    );
}

#[test]
fn pos2d_temporal_add_matches_cpu() {
    run(1, 1, 3, 2, 8, 4); // non-square grid
    run(2, 2, 5, 7, 6, 7); // batch 2, grid == table size along w
    run(3, 1, 1, 1, 2, 1); // one token
}

#[test]
fn pos2d_temporal_add_rejects_grid_beyond_tables() {
    let g = gpu();
    let x = Tensor::zeros(&g, &[1, 6, 4], DType::F32, "x").unwrap();
    let col = Tensor::zeros(&g, &[2, 2], DType::F32, "col").unwrap();
    let row = Tensor::zeros(&g, &[2, 2], DType::F32, "row").unwrap();
    let t = Tensor::zeros(&g, &[1, 4], DType::F32, "t").unwrap();
    let o = Tensor::zeros(&g, &[1, 6, 4], DType::F32, "o").unwrap();
    let mut rec = Recorder::new(&g);
    // 3 rows > 2 table rows.
    let e =
        ops::pos_embed::pos2d_temporal_add(&mut rec, &x, &col, &row, &t, (3, 2), &o).unwrap_err();
    assert!(
        matches!(
            e,
            florence2_wasm::Error::Shape {
                op: "pos2d_temporal_add",
                ..
            }
        ),
        "{e}"
    );
}
