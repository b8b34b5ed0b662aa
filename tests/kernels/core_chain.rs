//! Several core kernels recorded back to back into ONE recorder and submitted once, as the model does:
//! checks that each dispatch sees the previous one's writes (and in-place steps), against the same chain
//! of CPU references. Tolerance 1e-5: the chain is embedding + positions (exact), LayerNorm (~1e-6, see
//! norm.rs), GELU as a linear epilogue with an identity weight (the product is exactly the input;
//! ~1e-6 for |x| <= 8, see activation.rs), scale and bias (exact for their inputs), and a
//! log-softmax over 64 columns (~1e-6 for values ~10).
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use common::cpu::{
    add_row_ref, add_rows_at_ref, embedding_ref, gelu_ref, layer_norm_ref, log_softmax_ref,
};
use common::{assert_close, gpu, run_f32, tf32, tu32, zf32, Rng};
use florence2_wasm::ops;

#[test]
fn embedding_positions_norm_gelu_scale_bias_log_softmax_in_one_submit() {
    let g = gpu();
    let mut rng = Rng::new(71);
    let (v, p, c, t, start) = (40usize, 16usize, 64usize, 5usize, 3u32);
    let table = rng.vec(v * c, 1.0);
    let pos = rng.vec(p * c, 1.0);
    let gamma: Vec<f32> = rng.vec(c, 0.5).iter().map(|x| x + 1.0).collect();
    let beta = rng.vec(c, 0.5);
    let bias = rng.vec(c, 1.0);
    let ids: Vec<u32> = vec![3, 39, 0, 17, 3];

    // CPU chain
    let e = embedding_ref(&ids, &table, c);
    let e = add_rows_at_ref(&e, &pos, start as usize, c);
    let n = layer_norm_ref(&e, &gamma, &beta, 1e-5, c);
    let h = gelu_ref(&n);
    let s: Vec<f32> = h.iter().map(|x| x * 3.0).collect();
    let b = add_row_ref(&s, &bias);
    let want = log_softmax_ref(&b, c);

    // GPU chain, one submit, in place where the model would be.
    let (tt, tp) = (tf32(&g, &[v, c], &table), tf32(&g, &[p, c], &pos));
    let (tg, tb, tbias) = (
        tf32(&g, &[c], &gamma),
        tf32(&g, &[c], &beta),
        tf32(&g, &[c], &bias),
    );
    let eye: Vec<f32> = (0..c * c)
        .map(|i| if i / c == i % c { 1.0 } else { 0.0 })
        .collect();
    let teye = tf32(&g, &[c, c], &eye);
    let tids = tu32(&g, &[t], &ids);
    let x = zf32(&g, &[t, c]);
    let y = zf32(&g, &[t, c]);
    let got = run_f32(&g, &y, |r| {
        ops::embedding::embedding(r, &tids, &tt, &x).unwrap();
        ops::elementwise::add_rows_at(r, &x, &tp, start, &x).unwrap();
        ops::norm::layer_norm(r, &x, &tg, &tb, 1e-5, &y).unwrap();
        ops::matmul::linear(
            r,
            &y,
            &teye,
            ops::matmul::LinearArgs::default().act(ops::matmul::Act::Gelu),
            &x,
        )
        .unwrap();
        ops::elementwise::scale(r, &x, 3.0, &x).unwrap();
        ops::elementwise::add_row(r, &x, &tbias, &x).unwrap();
        ops::softmax::log_softmax_rows(r, &x, &y).unwrap();
    });
    assert_close("core chain (one submit)", &got, &want, 1e-5);
}
