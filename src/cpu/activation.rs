//! Exact (erf-based) GELU, as `torch.nn.GELU()`: `0.5 x (1 + erf(x / sqrt 2))`, with the same f32 erf
//! polynomial as the shaders (`shaders/include/gelu.wgsl`: the Eigen/XLA rational approximation, input
//! clamped to [-4, 4], a few ulp over the whole range). Multiply-adds are written as `a * b + c`, the
//! arithmetic lavapipe emits for WGSL's `fma` (a fused `mul_add` is a library call on targets without
//! an FMA unit enabled at compile time, wasm32 included).

use crate::cpu::par;
pub use crate::opdef::linear::Act;

/// The shader's coefficients, written as there (f64 literals rounded to f32 once, as WGSL rounds its
/// abstract-float literals): numerator (odd, degree 13) and denominator (even, degree 8) in v^2.
const ERF_N: [f64; 7] = [
    -2.72614225801306e-10,
    2.77068142495902e-08,
    -2.10102402082508e-06,
    -5.69250639462346e-05,
    -7.34990630326855e-04,
    -2.95459980854025e-03,
    -1.60960333262415e-02,
];
const ERF_D: [f64; 5] = [
    -1.45660718464996e-05,
    -2.13374055278905e-04,
    -1.68282697438203e-03,
    -7.37332916720468e-03,
    -1.42647390514189e-02,
];

/// erf(a) in f32 (the shaders' `erf_f32`, Horner steps in the same order).
#[inline]
pub fn erf_f32(a: f32) -> f32 {
    let v = a.clamp(-4.0, 4.0);
    let v2 = v * v;
    let mut n = v2 * ERF_N[0] as f32 + ERF_N[1] as f32;
    for &c in &ERF_N[2..] {
        n = v2 * n + c as f32;
    }
    n *= v;
    let mut d = v2 * ERF_D[0] as f32 + ERF_D[1] as f32;
    for &c in &ERF_D[2..] {
        d = v2 * d + c as f32;
    }
    n / d
}

/// Exact GELU of one value (the shaders' `gelu_f32`).
#[inline]
pub fn gelu_f32(v: f32) -> f32 {
    0.5 * v * (1.0 + erf_f32(v * std::f32::consts::FRAC_1_SQRT_2))
}

/// x = gelu(x), element-wise, in place.
pub fn gelu(x: &mut [f32]) {
    par::chunks_mut(x, 1 << 14, |_, c| {
        c.iter_mut().for_each(|v| *v = gelu_f32(*v))
    });
}
