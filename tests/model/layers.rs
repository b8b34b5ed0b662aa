//! The layer family (`model::layers`): loading reads the PyTorch keys under the layer's prefix and checks
//! shapes (naming the full key), and `forward` is the op it wraps. Tolerances: LayerNorm 1e-5 (as in
//! kernels_core_chain.rs for rows of 16); Linear 1e-5 (K = 8 products of values in [-1, 1] summed in f32
//! against an f64 sum: a few ulp of values below 8); embedding rows are copies (exact).
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use common::cpu::{embedding_ref, layer_norm_ref};
use common::{assert_close, gpu, run_f32, tf32, tu32, zf32, Rng};
use florence2_wasm::model::layers::{Conv2d, Embedding, LayerNorm, Linear, LN_EPS};
use florence2_wasm::ops::matmul::Act;
use florence2_wasm::weights::Weights;
use florence2_wasm::Error;

#[test]
fn linear_and_layer_norm_load_their_keys_and_run_their_op() {
    let g = gpu();
    let mut rng = Rng::new(5);
    let (rows, k, n) = (3usize, 8usize, 16usize);
    let (w, b, x) = (rng.vec(n * k, 1.0), rng.vec(n, 1.0), rng.vec(rows * k, 1.0));
    let (gam, bet) = (rng.vec(n, 1.0), rng.vec(n, 1.0));
    let mut ws = Weights::new();
    ws.insert("m.fc.weight", tf32(&g, &[n, k], &w));
    ws.insert("m.fc.bias", tf32(&g, &[n], &b));
    ws.insert("m.ln.weight", tf32(&g, &[n], &gam));
    ws.insert("m.ln.bias", tf32(&g, &[n], &bet));
    let v = ws.pp("m");
    let fc = Linear::new(&v.pp("fc"), k, n, true).unwrap();
    assert_eq!((fc.in_features(), fc.out_features()), (k, n));
    let ln = LayerNorm::new(&v.pp("ln"), n).unwrap();
    assert_eq!(ln.eps, LN_EPS);

    let tx = tf32(&g, &[rows, k], &x);
    let h = zf32(&g, &[rows, n]);
    let out = zf32(&g, &[rows, n]);
    let got = run_f32(&g, &out, |r| {
        fc.forward(r, &tx, Act::None, &h).unwrap();
        ln.forward(r, &h, &out).unwrap();
    });
    let lin: Vec<f32> = (0..rows * n)
        .map(|i| {
            let (r, j) = (i / n, i % n);
            let s: f64 = (0..k)
                .map(|e| x[r * k + e] as f64 * w[j * k + e] as f64)
                .sum();
            (s + b[j] as f64) as f32
        })
        .collect();
    let want = layer_norm_ref(&lin, &gam, &bet, LN_EPS, n);
    assert_close("LayerNorm(Linear(x))", &got, &want, 1e-5);
}

#[test]
fn shapes_are_checked_at_load_with_the_full_key() {
    let g = gpu();
    let mut ws = Weights::new();
    ws.insert("fc.weight", zf32(&g, &[4, 8]));
    ws.insert("fc.bias", zf32(&g, &[5]));
    ws.insert("conv.weight", zf32(&g, &[6, 1, 3, 3]));
    ws.insert("conv.bias", zf32(&g, &[6]));
    // (in, out) swapped: the weight is (out, in) = (4, 8).
    match Linear::new(&ws.pp("fc"), 4, 8, false) {
        Err(Error::TensorShape { name, expected, .. }) => {
            assert_eq!((name.as_str(), expected), ("fc.weight", vec![8, 4]))
        }
        other => panic!("expected TensorShape, got {other:?}"),
    }
    match Linear::new(&ws.pp("fc"), 8, 4, true) {
        Err(Error::TensorShape { name, .. }) => assert_eq!(name, "fc.bias"),
        other => panic!("expected TensorShape, got {other:?}"),
    }
    assert!(Linear::new(&ws.pp("fc"), 8, 4, false).is_ok());
    match LayerNorm::new(&ws.pp("ln"), 4) {
        Err(Error::MissingTensor { name }) => assert_eq!(name, "ln.weight"),
        other => panic!("expected MissingTensor, got {other:?}"),
    }
    assert!(matches!(
        Conv2d::new(&ws.pp("conv"), 6, 6, 3, 1, 1),
        Err(Error::TensorShape { .. })
    ));
    assert!(matches!(
        Embedding::from_tensor("table", zf32(&g, &[3, 4]), 4, 3),
        Err(Error::TensorShape { .. })
    ));
}

#[test]
fn conv_forms_are_refused_by_the_wrong_forward() {
    let g = gpu();
    let mut ws = Weights::new();
    ws.insert("dw.weight", zf32(&g, &[4, 1, 3, 3]));
    ws.insert("dw.bias", zf32(&g, &[4]));
    ws.insert("dense.weight", zf32(&g, &[4, 4, 3, 3]));
    ws.insert("dense.bias", zf32(&g, &[4]));
    let dw = Conv2d::depthwise(&ws.pp("dw"), 4, 3, 1, 1).unwrap();
    let dense = Conv2d::new(&ws.pp("dense"), 4, 4, 3, 1, 1).unwrap();
    let x = zf32(&g, &[1, 5, 5, 4]);
    let out = zf32(&g, &[1, 5, 5, 4]);
    let mut rec = florence2_wasm::gpu::Recorder::new(&g);
    assert!(matches!(
        dw.forward(&mut rec, &x, &out),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        dense.forward_residual(&mut rec, &x, &out),
        Err(Error::Shape { .. })
    ));
    assert!(dw.forward_residual(&mut rec, &x, &out).is_ok());
    assert!(dense.forward(&mut rec, &x, &out).is_ok());
}

#[test]
fn embedding_gathers_rows_and_adds_positions() {
    let g = gpu();
    let mut rng = Rng::new(9);
    let (v, c) = (10usize, 4usize);
    let table = rng.vec(v * c, 1.0);
    let mut ws = Weights::new();
    ws.insert("embed_tokens.weight", tf32(&g, &[v, c], &table));
    let e = Embedding::new(&ws.pp("embed_tokens"), v, c).unwrap();
    assert_eq!(e.num_embeddings(), v);
    let ids = [7u32, 0, 9];
    let tids = tu32(&g, &[3], &ids);
    let out = zf32(&g, &[3, c]);
    let got = run_f32(&g, &out, |r| {
        e.forward(r, &tids, &out).unwrap();
        e.add_rows(r, &out, 2, &out).unwrap();
    });
    let mut want = embedding_ref(&ids, &table, c);
    for (i, w) in want.iter_mut().enumerate() {
        *w += table[2 * c + i];
    }
    assert_close("embedding + rows 2..5", &got, &want, 0.0);
}
