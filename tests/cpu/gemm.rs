//! The GEMM core (`cpu::gemm`), every backend, against an f64 product.
//!
//! Tolerance: any f32 summation order of K products satisfies |fl(s) - s| <= gamma_K sum_k |a_k b_k|
//! (gamma_K = K u / (1 - K u)), plus one rounding of the result; checked per element. Columns outside
//! c0 .. c0 + N must be untouched (exact).

use florence2_wasm::cpu::gemm::{sgemm_nt_with, Backend, MatRef};

use crate::common::Rng;
use crate::{check_bounds, U};

/// (values, bounds) of a (M, K) @ b (N, K)^T, a rows at `lda`.
pub fn gemm_ref(
    a: &[f32],
    lda: usize,
    b: &[f32],
    (m, n, k): (usize, usize, usize),
) -> (Vec<f32>, Vec<f64>) {
    let gamma = k as f64 * U / (1.0 - k as f64 * U);
    let mut out = vec![0f32; m * n];
    let mut bound = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut mag) = (0f64, 0f64);
            for kk in 0..k {
                let p = a[i * lda + kk] as f64 * b[j * k + kk] as f64;
                s += p;
                mag += p.abs();
            }
            out[i * n + j] = s as f32;
            bound[i * n + j] = gamma * mag + U * s.abs() + 1e-30;
        }
    }
    (out, bound)
}

#[test]
fn backends_match_the_f64_product() {
    let mut rng = Rng::new(11);
    for (m, n, k) in [
        (1, 1, 1),
        (5, 7, 3),
        (17, 33, 147),
        (64, 40, 520),
        (3, 130, 1030),
        (9, 4, 8),
        (150, 17, 300), // rows past the packed GEMM's A block (72), K past its depth (256)
        (7, 1100, 9),   // columns past its B block (1024)
    ] {
        let lda = k + 3; // a strided a
        let a = rng.vec(m * lda, 1.0);
        let b = rng.vec(n * k, 1.0);
        let (want, bound) = gemm_ref(&a, lda, &b, (m, n, k));
        for backend in [Backend::Gemm, Backend::Blocked, Backend::Packed] {
            let (ldc, c0) = (n + 5, 2);
            let mut c = vec![7.5f32; m * ldc];
            let am = MatRef {
                data: &a,
                rows: m,
                cols: k,
                stride: lda,
            };
            sgemm_nt_with(backend, am, MatRef::new(&b, n, k), &mut c, ldc, c0).unwrap();
            let got: Vec<f32> = c.chunks(ldc).flat_map(|r| r[c0..c0 + n].to_vec()).collect();
            check_bounds(
                &format!("sgemm {backend:?} ({m}, {n}, {k})"),
                &got,
                &want,
                &bound,
            );
            let outside = c
                .chunks(ldc)
                .flat_map(|r| r[..c0].iter().chain(&r[c0 + n..]));
            assert!(
                outside.into_iter().all(|&v| v == 7.5),
                "{backend:?}: wrote outside its columns"
            );
        }
    }
}

#[test]
fn k_zero_gives_zeros_and_bad_shapes_are_refused() {
    let mut c = vec![1f32; 6];
    sgemm_nt_with(
        Backend::Blocked,
        MatRef::new(&[], 2, 0),
        MatRef::new(&[], 3, 0),
        &mut c,
        3,
        0,
    )
    .unwrap();
    assert!(c.iter().all(|&v| v == 0.0));
    let a = [0f32; 6];
    for (b_cols, ldc, c0) in [(2, 3, 0), (3, 2, 0), (3, 3, 1)] {
        let b = vec![0f32; 3 * b_cols];
        let r = sgemm_nt_with(
            Backend::Gemm,
            MatRef::new(&a, 2, 3),
            MatRef::new(&b, 3, b_cols),
            &mut c,
            ldc,
            c0,
        );
        assert!(
            matches!(r, Err(florence2_wasm::Error::Shape { .. })),
            "{b_cols} {ldc} {c0}: {r:?}"
        );
    }
}
