//! The f32 GEMM core every CPU linear, im2col convolution and panel product runs on:
//! `c[i, c0 + j] = sum_k a[i, k] * b[j, k]`, i.e. x (M, K) @ w (N, K)^T, both operands with K contiguous
//! (PyTorch Linear layout), written into columns c0 .. c0 + N of a row-major c with row stride `ldc`.
//!
//! Three implementations ([`Backend`]): the `gemm` crate (packed, cache-blocked, runtime-detected
//! AVX2/FMA/AVX-512 microkernels natively, rayon threads), the native default (`cargo bench --bench
//! cpu`); [`Backend::Packed`] ([`crate::cpu::packed`]), the wasm default (`scripts/bench/
//! browser_cpu_gemm.sh`); and [`Backend::Blocked`], a portable register-blocked loop (4x4 output tiles
//! of 4-lane dot products, K in 512-wide slices, rows split over threads) that LLVM vectorizes for
//! whatever SIMD the target has: SSE2 natively, SIMD128 in wasm built with `+simd128`.

use std::array;

pub use crate::cpu::mat::MatRef;
use crate::cpu::par;
use crate::error::{Error, Result};

/// Which GEMM implementation runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The `gemm` crate.
    Gemm,
    /// The portable register-blocked loop of this module.
    Blocked,
    /// The packed GEMM on four-lane vectors ([`crate::cpu::packed`]): wasm's, fused where the module is
    /// built with relaxed SIMD.
    Packed,
}

/// The backend [`sgemm_nt`] uses: the packed GEMM in wasm (2.3x the `gemm` crate's SIMD128 kernels in
/// Chromium on Florence-2's shapes, `scripts/bench/browser_cpu_gemm.sh`), the `gemm` crate natively.
pub const DEFAULT: Backend = if cfg!(target_arch = "wasm32") {
    Backend::Packed
} else {
    Backend::Gemm
};

/// c[i, c0 + j] = sum_k a[i, k] * b[j, k] for a (M, K), b (N, K), c (M, ldc) with `c.len() == M * ldc`
/// and c0 + N <= ldc; other columns of c are left as they are.
pub fn sgemm_nt(a: MatRef, b: MatRef, c: &mut [f32], ldc: usize, c0: usize) -> Result<()> {
    sgemm_nt_with(DEFAULT, a, b, c, ldc, c0)
}

/// [`sgemm_nt`] with a given backend (the benchmark and the tests compare them).
pub fn sgemm_nt_with(
    backend: Backend,
    a: MatRef,
    b: MatRef,
    c: &mut [f32],
    ldc: usize,
    c0: usize,
) -> Result<()> {
    const OP: &str = "cpu sgemm";
    a.check(OP, "a")?;
    b.check(OP, "b")?;
    let (m, n, k) = (a.rows, b.rows, a.cols);
    if b.cols != k || c.len() != m * ldc || c0 + n > ldc {
        return Err(Error::shape(
            OP,
            format!(
                "a ({m}, {k}) @ b ({n}, {})^T into {} values at row stride {ldc}, column {c0}",
                b.cols,
                c.len()
            ),
        ));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        c.chunks_mut(ldc).for_each(|row| row[c0..c0 + n].fill(0.0));
        return Ok(());
    }
    match backend {
        Backend::Gemm => crate_gemm(a, b, c, ldc, c0),
        Backend::Blocked => blocked(a, b, c, ldc, c0),
        Backend::Packed => crate::cpu::packed::sgemm(a, b, c, ldc, c0),
    }
    Ok(())
}

/// Multiply-adds under which the `gemm` crate runs on the calling thread only.
#[cfg(not(target_arch = "wasm32"))]
const THREADING_MIN: usize = 1 << 18;

fn crate_gemm(a: MatRef, b: MatRef, c: &mut [f32], ldc: usize, c0: usize) {
    let (m, n, k) = (a.rows, b.rows, a.cols);
    #[cfg(not(target_arch = "wasm32"))]
    let par = match par::threads() {
        t if t > 1 && m * n * k >= THREADING_MIN => gemm::Parallelism::Rayon(t),
        _ => gemm::Parallelism::None,
    };
    #[cfg(target_arch = "wasm32")]
    let par = gemm::Parallelism::None;
    // SAFETY: `sgemm_nt_with` checked every index the call touches: reads a[i * lda + kk] and
    // b[j * ldb + kk] for i < M, j < N, kk < K inside `a.data` / `b.data` (MatRef::check), writes
    // c[i * ldc + c0 + j] < M * ldc = c.len() (c0 + N <= ldc); c is a unique borrow, so it aliases
    // neither operand. The rhs is b viewed as (K, N): element (kk, j) at j * ldb + kk.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr().add(c0),
            1,
            ldc as isize,
            false,
            a.data.as_ptr(),
            1,
            a.stride as isize,
            b.data.as_ptr(),
            b.stride as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

/// Output tile of the blocked kernel (rows x columns), SIMD lanes of its dot products, K slice and the
/// b rows kept hot in L2 while a task's rows stream past them.
const MR: usize = 4;
const NR: usize = 4;
const LANES: usize = 4;
const KC: usize = 512;
const NC: usize = 64;

fn blocked(a: MatRef, b: MatRef, c: &mut [f32], ldc: usize, c0: usize) {
    let (m, n, k) = (a.rows, b.rows, a.cols);
    let task_rows = par::task_len(m, MR).next_multiple_of(MR);
    par::chunks_mut(c, task_rows * ldc, |t, cc| {
        let r0 = t * task_rows;
        let rows = cc.len() / ldc;
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            for j0 in (0..n).step_by(NC) {
                let jn = (j0 + NC).min(n);
                for i in (0..rows).step_by(MR) {
                    let ar: [&[f32]; MR] =
                        array::from_fn(|r| &a.row(r0 + (i + r).min(rows - 1))[k0..k0 + kc]);
                    for j in (j0..jn).step_by(NR) {
                        let br: [&[f32]; NR] =
                            array::from_fn(|s| &b.row((j + s).min(n - 1))[k0..k0 + kc]);
                        let acc = tile(ar, br);
                        for (r, acc_r) in acc.iter().enumerate().take(rows - i) {
                            let dst = &mut cc[(i + r) * ldc + c0 + j..];
                            for (s, &v) in acc_r.iter().enumerate().take(n - j) {
                                dst[s] = if k0 == 0 { v } else { dst[s] + v };
                            }
                        }
                    }
                }
            }
        }
    });
}

/// The MR x NR dot products of `a` rows with `b` rows (all of one length), in LANES-wide partial sums.
#[inline(always)]
fn tile(a: [&[f32]; MR], b: [&[f32]; NR]) -> [[f32; NR]; MR] {
    let len = a[0].len();
    let steps = len / LANES;
    let body = steps * LANES;
    let af: [&[f32]; MR] = array::from_fn(|r| &a[r][..body]);
    let bf: [&[f32]; NR] = array::from_fn(|s| &b[s][..body]);
    let mut acc = [[[0f32; LANES]; NR]; MR];
    for st in 0..steps {
        let p = st * LANES;
        let av: [[f32; LANES]; MR] = array::from_fn(|r| array::from_fn(|l| af[r][p + l]));
        let bv: [[f32; LANES]; NR] = array::from_fn(|s| array::from_fn(|l| bf[s][p + l]));
        for r in 0..MR {
            for s in 0..NR {
                for l in 0..LANES {
                    acc[r][s][l] += av[r][l] * bv[s][l];
                }
            }
        }
    }
    array::from_fn(|r| {
        array::from_fn(|s| {
            let v = acc[r][s];
            let mut sum = (v[0] + v[1]) + (v[2] + v[3]);
            for p in body..len {
                sum += a[r][p] * b[s][p];
            }
            sum
        })
    })
}
