//! Exact GELU against an f64 erf series.
//!
//! Tolerance: 1e-6 absolute + 2e-7 relative. The shader's erf approximation is good to a few f32 ulp
//! (~1e-7) and gelu = 0.5 x (1 + erf) then scales that by |x| / 2; the remaining terms are one or two
//! f32 roundings of a value of size |x|. For x << 0, 1 + erf cancels (as it does in PyTorch's f32
//! kernel too), so the error there is absolute, not relative.
#![cfg(not(target_arch = "wasm32"))]
mod common;

use common::cpu::{erf_f64, gelu_ref};
use common::{assert_shape_err, gpu, max_diff, run_f32, tf32, zf32, Rng};
use florence2_wasm::ops;

fn check(name: &str, x: &[f32], got: &[f32]) {
    let want = gelu_ref(x);
    let (d, _) = max_diff(got, &want);
    let worst = x
        .iter()
        .zip(got.iter().zip(&want))
        .map(|(&xi, (&g, &w))| (g - w).abs() - (1e-6 + 2e-7 * xi.abs()))
        .fold(f32::MIN, f32::max);
    eprintln!("{name}: max |diff| = {d:.3e}, worst excess over tol = {worst:.3e}");
    assert!(got.iter().all(|v| v.is_finite()), "{name}: non-finite");
    assert!(worst <= 0.0, "{name}: error above 1e-6 + 2e-7 |x|");
}

#[test]
fn erf_reference_is_accurate() {
    // Known values (Abramowitz & Stegun table 7.1 / high-precision): erf(0.5), erf(1), erf(2), erf(3).
    for (x, want) in [
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (2.0, 0.995_322_265_018_952_7),
        (3.0, 0.999_977_909_503_001_4),
        (-1.0, -0.842_700_792_949_714_9),
    ] {
        let got = erf_f64(x);
        assert!((got - want).abs() < 1e-14, "erf({x}) = {got}, want {want}");
    }
}

#[test]
fn gelu_matches_cpu() {
    let g = gpu();
    let mut rng = Rng::new(11);
    // 1000 and 4096 run the vec4 entry, 1 and 70001 the scalar one.
    for n in [1usize, 1000, 4096, 70_001] {
        let x = rng.vec(n, 8.0);
        let tx = tf32(&g, &[n], &x);
        let to = zf32(&g, &[n]);
        let got = run_f32(&g, &to, |r| ops::activation::gelu(r, &tx, &to).unwrap());
        check(&format!("gelu n={n}"), &x, &got);
    }
}

#[test]
fn gelu_special_points_and_in_place() {
    let g = gpu();
    let x: Vec<f32> = vec![
        0.0, -0.0, 1e-7, -1e-7, 1e-3, -1e-3, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 4.0, -4.0,
        5.5, -5.5, 6.0, -6.0, 10.0, -10.0, 100.0, -100.0, 1e4, -1e4,
    ];
    let n = x.len();
    let tx = tf32(&g, &[n], &x);
    // In place: x is both input and output.
    let got = run_f32(&g, &tx, |r| ops::activation::gelu(r, &tx, &tx).unwrap());
    check("gelu special points (in place)", &x, &got);
    // In place, vec4 entry (a multiple of 4 elements).
    let x = &x[..24];
    let tx = tf32(&g, &[24], x);
    let got = run_f32(&g, &tx, |r| ops::activation::gelu(r, &tx, &tx).unwrap());
    check("gelu special points (in place, vec4)", x, &got);
}

#[test]
fn gelu_rejects_mismatched_shapes() {
    let g = gpu();
    let a = zf32(&g, &[4, 3]);
    let b = zf32(&g, &[3, 4]);
    let mut rec = florence2_wasm::gpu::Recorder::new(&g);
    assert_shape_err(ops::activation::gelu(&mut rec, &a, &b), "gelu");
}
