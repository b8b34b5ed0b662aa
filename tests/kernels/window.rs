//! Window partition / reverse against a plain Rust gather. Both are pure copies (or zero fills), so the
//! GPU must match exactly: tolerance 0.
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use common::{assert_close, gpu, Rng};
use florence2_wasm::gpu::{readback, DType, Recorder, Tensor};
use florence2_wasm::ops;

/// CPU window partition with zero padding: (B, H, W, C) -> (B*nWh*nWw, ws*ws, C).
fn partition_ref(x: &[f32], b: usize, h: usize, w: usize, c: usize, ws: usize) -> Vec<f32> {
    let (nwh, nww) = (h.div_ceil(ws), w.div_ceil(ws));
    let mut out = vec![0f32; b * nwh * nww * ws * ws * c];
    for bi in 0..b {
        for wy in 0..nwh {
            for wx in 0..nww {
                for ty in 0..ws {
                    for tx in 0..ws {
                        let (y, xx) = (wy * ws + ty, wx * ws + tx);
                        if y >= h || xx >= w {
                            continue;
                        }
                        let win = (bi * nwh + wy) * nww + wx;
                        for ch in 0..c {
                            out[((win * ws * ws) + ty * ws + tx) * c + ch] =
                                x[((bi * h + y) * w + xx) * c + ch];
                        }
                    }
                }
            }
        }
    }
    out
}

fn run(seed: u64, b: usize, h: usize, w: usize, c: usize, ws: usize) {
    let g = gpu();
    let mut rng = Rng::new(seed);
    let x = rng.vec(b * h * w * c, 1.0);
    let (nwh, nww) = ops::window::window_grid(h, w, ws);
    let nw = b * nwh * nww;
    let want = partition_ref(&x, b, h, w, c, ws);
    let tx = Tensor::from_f32(&g, &[b, h, w, c], &x, "x").unwrap();
    let tp = Tensor::zeros(&g, &[nw, ws * ws, c], DType::F32, "win").unwrap();
    let tr = Tensor::zeros(&g, &[b, h, w, c], DType::F32, "back").unwrap();
    // Reverse of an independent windowed tensor too (not just the round trip), so a kernel that
    // ignored its input layout could not pass by symmetry.
    let y = rng.vec(nw * ws * ws * c, 1.0);
    let ty = Tensor::from_f32(&g, &[nw, ws * ws, c], &y, "y").unwrap();
    let tyr = Tensor::zeros(&g, &[b, h, w, c], DType::F32, "y_back").unwrap();
    let mut rec = Recorder::new(&g);
    ops::window::window_partition(&mut rec, &tx, ws, &tp).unwrap();
    ops::window::window_reverse(&mut rec, &tp, ws, h, w, &tr).unwrap();
    ops::window::window_reverse(&mut rec, &ty, ws, h, w, &tyr).unwrap();
    rec.submit().unwrap();
    let name = format!("B{b} {h}x{w}x{c} ws{ws}");
    let got = readback::to_f32_blocking(&g, &tp).unwrap();
    assert_close(&format!("window_partition {name}"), &got, &want, 0.0);
    let back = readback::to_f32_blocking(&g, &tr).unwrap();
    assert_close(&format!("window round trip {name}"), &back, &x, 0.0);
    let got_y = readback::to_f32_blocking(&g, &tyr).unwrap();
    let mut want_y = vec![0f32; x.len()];
    for bi in 0..b {
        for yy in 0..h {
            for xx in 0..w {
                let win = (bi * nwh + yy / ws) * nww + xx / ws;
                let t = (yy % ws) * ws + xx % ws;
                for ch in 0..c {
                    want_y[((bi * h + yy) * w + xx) * c + ch] = y[(win * ws * ws + t) * c + ch];
                }
            }
        }
    }
    assert_close(&format!("window_reverse {name}"), &got_y, &want_y, 0.0);
}

// C % 4 == 0 takes the vec4 kernels, other widths the scalar ones: both are covered.

#[test]
fn window_padding_both_axes_batched() {
    run(1, 2, 5, 7, 3, 3); // scalar
    run(5, 2, 5, 7, 8, 3); // vec4
}

#[test]
fn window_exact_multiple() {
    run(2, 1, 6, 9, 4, 3); // vec4
}

#[test]
fn window_larger_than_image_and_single_pixel() {
    run(3, 1, 2, 3, 5, 4);
    run(4, 1, 1, 1, 1, 12);
}

#[test]
fn window_rejects_bad_shapes() {
    let g = gpu();
    let x = Tensor::zeros(&g, &[1, 5, 5, 2], DType::F32, "x").unwrap();
    let bad = Tensor::zeros(&g, &[3, 9, 2], DType::F32, "w").unwrap(); // needs 4 windows of 9
    let mut rec = Recorder::new(&g);
    let e = ops::window::window_partition(&mut rec, &x, 3, &bad).unwrap_err();
    assert!(
        matches!(
            e,
            florence2_wasm::Error::Shape {
                op: "window_partition",
                ..
            }
        ),
        "{e}"
    );
    let e = ops::window::window_reverse(&mut rec, &bad, 3, 5, 5, &x).unwrap_err();
    assert!(
        matches!(
            e,
            florence2_wasm::Error::Shape {
                op: "window_reverse",
                ..
            }
        ),
        "{e}"
    );
}
