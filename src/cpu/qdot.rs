//! Dots of one block-quantized weight row (q8/q4, [`crate::quant`]) with up to
//! [`GEMV_MAX_ROWS`](crate::cpu::linear::GEMV_MAX_ROWS) rows of x: the inner loop of the decode GEMV.
//!
//! Every path computes the same sums in the same order, so they agree bit for bit: a weight is
//! `d * q` (exact in f32: |q| <= 127 and d is an f16), each product `w * x` is rounded and added into
//! lane `k mod 32` of 32 partial sums, in K order, and the lanes are folded at the end as the dense
//! dots fold theirs ([`crate::cpu::sum32`]): a quantized row gives the bits of the f32 GEMV on its
//! dequantized values. 32 lanes are four independent 8-wide chains per x row, so the adds' latency
//! overlaps (one chain made a single decode row latency-bound). The paths differ only in how they
//! widen the integers:
//! - x86_64 with AVX2: a block's 8-weight groups sign-extended to 8 i32 lanes and converted in one
//!   instruction each, chosen at run time;
//! - wasm32 built with `+simd128`: the same with 4-lane quarters;
//! - elsewhere ([`portable`]): scalar loops that LLVM vectorizes as it can (NEON on aarch64).
//!
//! The faster, inexact alternative (x quantized to int8, integer block sums) is
//! [`crate::cpu::qdot_int8`].

use crate::quant::{QFormat, QBLOCK};

/// dst[i] = Σ_k (d_b(k) * q_k) * x[i, k] for the dst.len() rows of x (K = `k` each), row `r` holding the
/// row's quants (`fmt.quant_bytes(k)` bytes) and `scales` its K/32 block scales as f32.
pub fn quant_row_dots(
    fmt: QFormat,
    k: usize,
    r: &[u8],
    scales: &[f32],
    x: &[f32],
    dst: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2, the feature `avx2::dots` is compiled for, was detected just above.
        unsafe { avx2::dots(fmt, k, r, scales, x, dst) };
        return;
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        simd128::dots(fmt, k, r, scales, x, dst);
        return;
    }
    #[allow(unreachable_code)]
    portable(fmt, k, r, scales, x, dst)
}

/// [`quant_row_dots`] in scalar code (the reference the SIMD paths are tested against).
pub fn portable(fmt: QFormat, k: usize, r: &[u8], scales: &[f32], x: &[f32], dst: &mut [f32]) {
    let mut acc = [[0f32; QBLOCK]; 4];
    let acc = &mut acc[..dst.len()];
    let mut blk = [0f32; QBLOCK];
    for (b, &d) in scales.iter().enumerate().take(k / QBLOCK) {
        match fmt {
            QFormat::Q8 => {
                for (o, &v) in blk.iter_mut().zip(&r[b * QBLOCK..(b + 1) * QBLOCK]) {
                    *o = d * f32::from(v as i8);
                }
            }
            QFormat::Q4 => {
                let q = &r[b * QBLOCK / 2..(b + 1) * QBLOCK / 2];
                for (o, &v) in blk.chunks_exact_mut(2).zip(q) {
                    o[0] = d * (f32::from(v & 0xF) - 8.0);
                    o[1] = d * (f32::from(v >> 4) - 8.0);
                }
            }
        }
        for (i, a) in acc.iter_mut().enumerate() {
            let xb = &x[i * k + b * QBLOCK..i * k + (b + 1) * QBLOCK];
            for l in 0..QBLOCK {
                a[l] += blk[l] * xb[l];
            }
        }
    }
    for (d, a) in dst.iter_mut().zip(acc.iter()) {
        *d = crate::cpu::sum32(a);
    }
}

/// `$rows::<M, Q4>(k, r, scales, x, dst)` for M = dst.len() (1..=4) and the format: the SIMD paths'
/// dispatch to their monomorphized row counts.
#[cfg(any(
    target_arch = "x86_64",
    all(target_arch = "wasm32", target_feature = "simd128")
))]
macro_rules! by_shape {
    ($rows:ident, $fmt:expr, $k:expr, $r:expr, $scales:expr, $x:expr, $dst:expr) => {
        match ($fmt, $dst.len()) {
            (QFormat::Q8, 1) => $rows::<1, false>($k, $r, $scales, $x, $dst),
            (QFormat::Q8, 2) => $rows::<2, false>($k, $r, $scales, $x, $dst),
            (QFormat::Q8, 3) => $rows::<3, false>($k, $r, $scales, $x, $dst),
            (QFormat::Q8, _) => $rows::<4, false>($k, $r, $scales, $x, $dst),
            (QFormat::Q4, 1) => $rows::<1, true>($k, $r, $scales, $x, $dst),
            (QFormat::Q4, 2) => $rows::<2, true>($k, $r, $scales, $x, $dst),
            (QFormat::Q4, 3) => $rows::<3, true>($k, $r, $scales, $x, $dst),
            (QFormat::Q4, _) => $rows::<4, true>($k, $r, $scales, $x, $dst),
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use crate::cpu::sum32;
    use crate::quant::{QFormat, QBLOCK};

    /// [`super::quant_row_dots`] with AVX2 (no FMA: each product is rounded before its sum, as in
    /// [`super::portable`]).
    #[target_feature(enable = "avx2")]
    pub unsafe fn dots(
        fmt: QFormat,
        k: usize,
        r: &[u8],
        scales: &[f32],
        x: &[f32],
        dst: &mut [f32],
    ) {
        by_shape!(rows, fmt, k, r, scales, x, dst)
    }

    /// M = `M` rows of x; `Q4` picks the nibble layout.
    #[target_feature(enable = "avx2")]
    unsafe fn rows<const M: usize, const Q4: bool>(
        k: usize,
        r: &[u8],
        scales: &[f32],
        x: &[f32],
        dst: &mut [f32],
    ) {
        let blocks = k / QBLOCK;
        assert!(scales.len() >= blocks && x.len() >= M * k && dst.len() >= M);
        assert!(r.len() >= blocks * QBLOCK * if Q4 { 1 } else { 2 } / 2);
        let mut acc = [[_mm256_setzero_ps(); 4]; M];
        for (b, &d) in scales.iter().enumerate().take(blocks) {
            let dv = _mm256_set1_ps(d);
            // The block's 32 quants as signed bytes in K order (two 16-byte halves).
            let (lo, hi) = if Q4 {
                // SAFETY: bytes 16 b .. 16 b + 16 of r exist (asserted above).
                let v = _mm_loadu_si128(r.as_ptr().add(b * 16).cast());
                let m = _mm_set1_epi8(0x0F);
                let l = _mm_and_si128(v, m);
                let h = _mm_and_si128(_mm_srli_epi16(v, 4), m);
                let eight = _mm_set1_epi8(8);
                (
                    _mm_sub_epi8(_mm_unpacklo_epi8(l, h), eight),
                    _mm_sub_epi8(_mm_unpackhi_epi8(l, h), eight),
                )
            } else {
                // SAFETY: bytes 32 b .. 32 b + 32 of r exist (asserted above).
                let p = r.as_ptr().add(b * QBLOCK);
                (_mm_loadu_si128(p.cast()), _mm_loadu_si128(p.add(16).cast()))
            };
            let groups = [lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)];
            for (g, q) in groups.into_iter().enumerate() {
                let w = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
                for (i, a) in acc.iter_mut().enumerate() {
                    // SAFETY: x holds M rows of k values (asserted above); 8 b + g < k / 8.
                    let xv = _mm256_loadu_ps(x.as_ptr().add(i * k + b * QBLOCK + g * 8));
                    a[g] = _mm256_add_ps(a[g], _mm256_mul_ps(w, xv));
                }
            }
        }
        for (d, a) in dst.iter_mut().zip(acc) {
            let mut l = [0f32; QBLOCK];
            for (g, ag) in a.into_iter().enumerate() {
                _mm256_storeu_ps(l.as_mut_ptr().add(8 * g), ag);
            }
            *d = sum32(&l);
        }
    }
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod simd128 {
    use core::arch::wasm32::*;

    use crate::quant::{QFormat, QBLOCK};

    /// [`super::quant_row_dots`] with SIMD128: the 32 partial sums are eight f32x4 registers, lanes
    /// 4 j .. 4 j + 3 in register j.
    pub fn dots(fmt: QFormat, k: usize, r: &[u8], scales: &[f32], x: &[f32], dst: &mut [f32]) {
        by_shape!(rows, fmt, k, r, scales, x, dst)
    }

    /// 16 signed bytes as four f32x4 in order.
    #[inline(always)]
    fn widen(q: v128) -> [v128; 4] {
        let l = i16x8_extend_low_i8x16(q);
        let h = i16x8_extend_high_i8x16(q);
        [
            f32x4_convert_i32x4(i32x4_extend_low_i16x8(l)),
            f32x4_convert_i32x4(i32x4_extend_high_i16x8(l)),
            f32x4_convert_i32x4(i32x4_extend_low_i16x8(h)),
            f32x4_convert_i32x4(i32x4_extend_high_i16x8(h)),
        ]
    }

    fn rows<const M: usize, const Q4: bool>(
        k: usize,
        r: &[u8],
        scales: &[f32],
        x: &[f32],
        dst: &mut [f32],
    ) {
        let blocks = k / QBLOCK;
        assert!(scales.len() >= blocks && x.len() >= M * k && dst.len() >= M);
        assert!(r.len() >= blocks * QBLOCK * if Q4 { 1 } else { 2 } / 2);
        let mut acc = [[f32x4_splat(0.0); 8]; M];
        for (b, &d) in scales.iter().enumerate().take(blocks) {
            let dv = f32x4_splat(d);
            // SAFETY: block b's bytes lie inside r (asserted above).
            let (lo, hi) = unsafe { crate::cpu::qdot_int8::simd128::weights::<Q4>(r, b) };
            let [w0, w1, w2, w3] = widen(lo);
            let [w4, w5, w6, w7] = widen(hi);
            for (j, w) in [w0, w1, w2, w3, w4, w5, w6, w7].into_iter().enumerate() {
                let w = f32x4_mul(dv, w);
                for (i, a) in acc.iter_mut().enumerate() {
                    // SAFETY: x holds M rows of k values (asserted above), and 32 b + 4 j + 3 < k.
                    let xv =
                        unsafe { v128_load(x.as_ptr().add(i * k + b * QBLOCK + j * 4).cast()) };
                    a[j] = f32x4_add(a[j], f32x4_mul(w, xv));
                }
            }
        }
        for (d, a) in dst.iter_mut().zip(acc) {
            *d = crate::cpu::qdot_int8::simd128::fold32(a);
        }
    }
}
