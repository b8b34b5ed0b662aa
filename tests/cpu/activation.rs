//! Exact GELU (`cpu::activation`) against the f64 erf series.
//!
//! Tolerance (as tests/kernels/activation.rs, same polynomial): 1e-6 absolute + 2e-7 relative. The erf
//! approximation is good to a few f32 ulp (~1e-7) and gelu = 0.5 x (1 + erf) scales that by |x| / 2;
//! the rest is one or two f32 roundings of a value of size |x|. For x << 0, 1 + erf cancels, so the
//! error there is absolute.

use florence2_wasm::cpu::activation::{erf_f32, gelu};

use crate::common::cpu::{erf_f64, gelu_ref};
use crate::common::Rng;

#[test]
fn gelu_matches_the_f64_series() {
    let mut x: Vec<f32> = (-2000..=2000).map(|i| i as f32 * 0.005).collect();
    x.extend(Rng::new(3).vec(10_000, 8.0));
    x.extend([0.0, -0.0, 4.0, -4.0, 30.0, -30.0, 1e-20]);
    let want = gelu_ref(&x);
    let mut got = x.clone();
    gelu(&mut got);
    let mut worst = f32::MIN;
    for ((&xi, &g), &w) in x.iter().zip(&got).zip(&want) {
        worst = worst.max((g - w).abs() - (1e-6 + 2e-7 * xi.abs()));
    }
    eprintln!("gelu: worst excess over 1e-6 + 2e-7 |x| = {worst:.3e}");
    assert!(worst <= 0.0);
    for &v in &[0.3f32, -1.7, 2.9, 5.0] {
        assert!(
            (erf_f32(v) as f64 - erf_f64(v as f64)).abs() < 3e-7,
            "erf({v})"
        );
    }
}
