// Exact (erf-based) GELU, as torch.nn.GELU() / F.gelu(approximate='none') (`#include gelu`):
//   gelu(x) = 0.5 * x * (1 + erf(x / sqrt(2)))
// WGSL has no erf. `erf_f32` is the rational approximation used by Eigen / XLA for f32 (odd degree-13
// numerator over even degree-8 denominator in x, input clamped to [-4, 4] where erf is +-1 to f32
// precision); it is accurate to a few ulp over the whole range, tested against an f64 series through the
// linear kernels' epilogue in tests/kernels/activation.rs.

fn erf_f32(a: f32) -> f32 {
    let v = clamp(a, -4.0, 4.0);
    let v2 = v * v;
    var n = fma(v2, -2.72614225801306e-10, 2.77068142495902e-08);
    n = fma(v2, n, -2.10102402082508e-06);
    n = fma(v2, n, -5.69250639462346e-05);
    n = fma(v2, n, -7.34990630326855e-04);
    n = fma(v2, n, -2.95459980854025e-03);
    n = fma(v2, n, -1.60960333262415e-02);
    n = v * n;
    var d = fma(v2, -1.45660718464996e-05, -2.13374055278905e-04);
    d = fma(v2, d, -1.68282697438203e-03);
    d = fma(v2, d, -7.37332916720468e-03);
    d = fma(v2, d, -1.42647390514189e-02);
    return n / d;
}

fn gelu_f32(v: f32) -> f32 {
    return 0.5 * v * (1.0 + erf_f32(v * 0.7071067811865476));
}
