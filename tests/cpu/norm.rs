//! LayerNorm (`cpu::norm`) and row softmax / log-softmax (`cpu::softmax`) against f64 references.
//!
//! LayerNorm tolerance (as tests/kernels/norm.rs): 1e-5 absolute on outputs up to ~10. The kernel sums
//! in 8 interleaved f32 partials with the GPU row kernel's mean correction, so the variance's relative
//! error is a few 1e-7 for C <= 1024 and each output rounds a few products (~1e-6 per ulp at 10); a
//! biased/unbiased mix-up (768/767) or a missing beta is off by >= 1e-3. Inputs are offset by 3.0, more
//! than their spread, which a one-pass E[x^2] - E[x]^2 would fail.
//!
//! Softmax tolerances (as tests/kernels/softmax.rs): outputs in [0, 1], exp to a few ulp times 1/sum
//! with the f32 sum's relative error ~1e-6 for random terms: 1e-6 (2e-6 for C = 51328, whose outputs
//! are tiny anyway). log-softmax: values up to ~30 (one ulp 2e-6) and log(sum) carries the sum's
//! relative error as an absolute one: 1e-5.

use florence2_wasm::cpu::norm::{layer_norm, layer_norm_inplace};
use florence2_wasm::cpu::softmax::{log_softmax_rows, softmax_rows};

use crate::common::cpu::{layer_norm_ref, log_softmax_ref, softmax_ref};
use crate::common::{assert_close, Rng};

#[test]
fn layer_norm_matches_the_f64_reference() {
    for (rows, c, seed) in [
        (5, 768, 1),
        (3, 1024, 2),
        (7, 5, 3),
        (2, 1, 4),
        (33, 128, 5),
    ] {
        let mut rng = Rng::new(seed);
        let x: Vec<f32> = rng.vec(rows * c, 1.0).iter().map(|v| v + 3.0).collect();
        let g: Vec<f32> = rng.vec(c, 1.0).iter().map(|v| v + 1.5).collect();
        let b = rng.vec(c, 1.0);
        let want = layer_norm_ref(&x, &g, &b, 1e-5, c);
        let mut got = vec![0f32; x.len()];
        layer_norm(&x, &g, &b, 1e-5, &mut got).unwrap();
        assert_close(&format!("layer_norm ({rows}, {c})"), &got, &want, 1e-5);
        let mut inplace = x.clone();
        layer_norm_inplace(&mut inplace, &g, &b, 1e-5).unwrap();
        assert_eq!(inplace, got, "in place differs");
    }
    let mut out = [0f32; 6];
    assert!(layer_norm(&[0.0; 6], &[1.0; 4], &[0.0; 4], 1e-5, &mut out).is_err());
}

#[test]
fn softmax_and_log_softmax_match_the_f64_reference() {
    for (rows, c, scale, seed) in [
        (4, 577, 5.0, 1),
        (3, 51328, 10.0, 2),
        (2, 1, 1.0, 3),
        (9, 144, 30.0, 4),
    ] {
        let x = Rng::new(seed).vec(rows * c, scale);
        let mut sm = x.clone();
        softmax_rows(&mut sm, c).unwrap();
        let tol = if c > 10_000 { 2e-6 } else { 1e-6 };
        assert_close(
            &format!("softmax ({rows}, {c})"),
            &sm,
            &softmax_ref(&x, c),
            tol,
        );
        let mut ls = x.clone();
        log_softmax_rows(&mut ls, c).unwrap();
        assert_close(
            &format!("log_softmax ({rows}, {c})"),
            &ls,
            &log_softmax_ref(&x, c),
            1e-5,
        );
    }
    assert!(softmax_rows(&mut [0.0; 5], 2).is_err());
}
