//! The CPU kernels (`florence2_wasm::cpu`) against f64 host references: one module per op family, each
//! stating its tolerance and why (the same error analyses as the GPU kernel tests, tests/kernels/*.rs,
//! since the CPU kernels compute the same definitions in f32). `gpu_parity` also runs a few calls on the
//! GPU kernels with the same inputs and compares the two backends.
#![cfg(not(target_arch = "wasm32"))]

#[path = "../common/mod.rs"]
mod common;

mod activation;
mod attention;
mod channel_attn;
mod conv;
mod copies;
mod gemm;
mod gpu_parity;
mod linear;
mod norm;
mod pipeline;
mod profile;

/// Unit roundoff of f32 (2^-24).
pub const U: f64 = f32::EPSILON as f64 / 2.0;

/// Assert every |got - want| is within its own bound; print the max difference and the worst ratio.
pub fn check_bounds(name: &str, got: &[f32], want: &[f32], bound: &[f64]) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    let (mut maxd, mut worst) = (0f64, 0f64);
    for (i, ((&g, &w), &b)) in got.iter().zip(want).zip(bound).enumerate() {
        assert!(g.is_finite(), "{name}: non-finite output at {i}");
        let d = (g as f64 - w as f64).abs();
        maxd = maxd.max(d);
        worst = worst.max(d / b);
        assert!(
            d <= b,
            "{name}: element {i}: got {g}, want {w}, |diff| {d:e} > {b:e}"
        );
    }
    eprintln!("{name}: max |diff| = {maxd:.3e} (worst diff/bound = {worst:.3})");
}
