//! The CPU backend, whole: its kernels (every op the model uses, on host slices) and, in [`host`], the
//! twins the launchers in [`crate::ops`] call on a [`crate::gpu::Backend::Host`] device (operands read
//! from the tensors' host memory, the kernel run at once). Adding a backend adds a folder like this one
//! and an arm to each launcher's `match`.
//!
//! Each kernel computes exactly what its GPU counterpart in [`crate::ops`] defines (same layouts: tokens
//! are rows, heads interleaved in columns, PyTorch Linear weights (N, K), channels-last images; same
//! epilogue order; the same erf polynomial), in f32, so the two backends agree to rounding. Shapes are
//! checked and a mismatch is [`crate::Error::Shape`]; outputs are caller-owned slices, so a backend can
//! plan its own memory (activation buffers reused across layers, KV caches sized once).
//!
//! Threads: natively the kernels split their work over rayon's global pool ([`par`]); on wasm32 they run
//! on the calling thread (browser threads need cross-origin isolation and a standard library built with
//! atomics, which the stable toolchain does not ship). The GEMM is chosen by measurement: natively the
//! `gemm` crate's (runtime-detected AVX2/AVX-512; `cargo bench --bench cpu`), in wasm the engine's own
//! [`packed`] GEMM on four-lane vectors, fused multiply-adds in the relaxed-SIMD build
//! (`scripts/bench/browser_cpu_gemm.sh`); [`gemm::Backend::Blocked`] is the portable register-blocked
//! loop they are compared with.

pub mod activation;
pub mod attention;
pub mod channel_attn;
pub mod conv;
pub mod elementwise;
pub mod embedding;
pub mod gemm;
pub mod host;
pub mod lanes;
pub mod layout;
pub mod linear;
pub mod mat;
pub mod norm;
pub mod packed;
pub mod par;
pub mod qdot;
pub mod qdot_int8;
pub mod reduce;
pub mod softmax;
pub mod weight;
pub mod widen;
pub mod window;

pub use linear::{linear, linear_rows};
pub use weight::Weight;

use crate::error::{Error, Result};

/// Eight lane-wise partial sums added pairwise, the order every CPU dot product folds its lanes in.
#[inline(always)]
pub(crate) fn sum8(a: &[f32; 8]) -> f32 {
    ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}

/// 32 lane-wise partial sums (four 8-wide chains) folded: lanes l, l + 8, l + 16, l + 24 pairwise,
/// then the eight results by [`sum8`]. The fold of the dense and the quantized dots.
#[inline(always)]
pub(crate) fn sum32(acc: &[f32; 32]) -> f32 {
    let mut a8 = [0f32; 8];
    for (l, a) in a8.iter_mut().enumerate() {
        *a = (acc[l] + acc[l + 8]) + (acc[l + 16] + acc[l + 24]);
    }
    sum8(&a8)
}

/// `what` must hold exactly `len` elements ([`Error::Shape`] for `op` otherwise).
pub(crate) fn check_len<T>(op: &'static str, what: &str, s: &[T], len: usize) -> Result<()> {
    if s.len() != len {
        return Err(Error::shape(
            op,
            format!("{what} has {} elements, expected {len}", s.len()),
        ));
    }
    Ok(())
}
