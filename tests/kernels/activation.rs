//! Exact GELU against an f64 erf series. The library computes GELU only as the epilogue of its linear
//! kernels (`shaders/include/gelu.wgsl`, included by every linear variant), so it is tested there: x is
//! column 0 of an (M, K) input whose other columns are 0, and the weight is the single row e_0, so the
//! pre-activation x * 1 + 0 * 0 + ... is exactly x and the output is the kernel's gelu(x).
//!
//! Tolerance: 1e-6 absolute + 2e-7 relative. The shader's erf approximation is good to a few f32 ulp
//! (~1e-7) and gelu = 0.5 x (1 + erf) then scales that by |x| / 2; the remaining terms are one or two
//! f32 roundings of a value of size |x|. For x << 0, 1 + erf cancels (as it does in PyTorch's f32
//! kernel too), so the error there is absolute, not relative.
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use std::sync::Arc;

use common::cpu::{erf_f64, gelu_ref};
use common::{gpu, max_diff, run_f32, tf32, zf32, Rng};
use florence2_wasm::gpu::Device;
use florence2_wasm::ops::matmul::{self, Act, LinearVariant, GEMV_MAX_ROWS};

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

/// gelu(x) through the linear epilogue with K input columns: the run-time choice when `variant` is
/// `None`, else the forced variant (GEMV variants run in slices of [`GEMV_MAX_ROWS`] rows).
fn gelu_linear(g: &Arc<Device>, variant: Option<LinearVariant>, k: usize, x: &[f32]) -> Vec<f32> {
    let rows = match variant {
        Some(LinearVariant::Gemv | LinearVariant::GemvSubgroup) => GEMV_MAX_ROWS,
        _ => x.len(),
    };
    let mut w = vec![0.0f32; k];
    w[0] = 1.0;
    let tw = tf32(g, &[1, k], &w);
    let mut got = Vec::with_capacity(x.len());
    for xs in x.chunks(rows) {
        let mut input = vec![0.0f32; xs.len() * k];
        for (i, &v) in xs.iter().enumerate() {
            input[i * k] = v;
        }
        let tx = tf32(g, &[xs.len(), k], &input);
        let to = zf32(g, &[xs.len(), 1]);
        got.extend(run_f32(g, &to, |r| match variant {
            None => matmul::linear(
                r,
                &tx,
                &tw,
                matmul::LinearArgs::default().act(Act::Gelu),
                &to,
            )
            .unwrap(),
            Some(v) => matmul::linear(
                r,
                &tx,
                &tw,
                matmul::LinearArgs::default().act(Act::Gelu).variant(v),
                &to,
            )
            .unwrap(),
        }));
    }
    got
}

/// The variants [`matmul::choose_linear_variant`] can pick on this device.
fn run_time_variants(g: &Device) -> Vec<LinearVariant> {
    let mut v = vec![
        LinearVariant::Scalar,
        LinearVariant::Reg8x8,
        LinearVariant::Reg16x8,
        LinearVariant::Gemv,
    ];
    if g.caps.subgroups && g.caps.subgroup_min_size >= 8 {
        v.extend([LinearVariant::SubgroupC4, LinearVariant::GemvSubgroup]);
    }
    v
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
    // n = 1 runs the GEMV, the others the GEMM the device picks; K = 7 the scalar kernel.
    for n in [1usize, 1000, 4096, 70_001] {
        let x = rng.vec(n, 8.0);
        for k in [32, 7] {
            let got = gelu_linear(&g, None, k, &x);
            check(&format!("gelu n={n} (linear, K={k})"), &x, &got);
        }
    }
}

#[test]
fn gelu_special_points_in_every_linear_variant() {
    let g = gpu();
    let x: Vec<f32> = vec![
        0.0, -0.0, 1e-7, -1e-7, 1e-3, -1e-3, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 4.0, -4.0,
        5.5, -5.5, 6.0, -6.0, 10.0, -10.0, 100.0, -100.0, 1e4, -1e4,
    ];
    for v in run_time_variants(&g) {
        let got = gelu_linear(&g, Some(v), 32, &x);
        check(&format!("gelu special points ({v:?})"), &x, &got);
    }
}
