//! The int8 row dots in wasm32 built with `+simd128` ([`super::int8_row_dots`]): `i32x4.dot_i16x8_s` on
//! sign-extended bytes. In the relaxed-SIMD build q4 blocks take `i32x4.relaxed_dot_i8x16_i7x16_add_s`
//! instead: the nibbles `n = w + 8` (0..15, so the 7-bit operand's result is defined and no 16-bit
//! intermediate saturates: |n x| <= 15 * 128) dotted with x, each lane starting from x's offset sum
//! `-8 Σ x` ([`super::QuantX::s`]): the same integers, one instruction for four products per lane.

use core::arch::wasm32::*;

use super::{block_scale, Qx};
use crate::cpu::sum32;
use crate::quant::{QFormat, QBLOCK};

pub fn dots(fmt: QFormat, k: usize, r: &[u8], x: Qx, dst: &mut [f32]) {
    match (fmt, dst.len()) {
        (_, 0) => {}
        (QFormat::Q8, 1) => rows::<1, false>(fmt, k, r, x, dst),
        (QFormat::Q8, 2) => rows::<2, false>(fmt, k, r, x, dst),
        (QFormat::Q8, 3) => rows::<3, false>(fmt, k, r, x, dst),
        (QFormat::Q8, _) => rows::<4, false>(fmt, k, r, x, dst),
        (QFormat::Q4, 1) => rows::<1, true>(fmt, k, r, x, dst),
        (QFormat::Q4, 2) => rows::<2, true>(fmt, k, r, x, dst),
        (QFormat::Q4, 3) => rows::<3, true>(fmt, k, r, x, dst),
        (QFormat::Q4, _) => rows::<4, true>(fmt, k, r, x, dst),
    }
}

/// The 4 lane sums (products 4 l .. 4 l + 3) of 16 signed bytes w times 16 signed bytes x.
#[inline(always)]
fn dot16(w: v128, x: v128) -> v128 {
    let lo = i32x4_dot_i16x8(i16x8_extend_low_i8x16(w), i16x8_extend_low_i8x16(x));
    let hi = i32x4_dot_i16x8(i16x8_extend_high_i8x16(w), i16x8_extend_high_i8x16(x));
    i32x4_add(
        i32x4_shuffle::<0, 2, 4, 6>(lo, hi),
        i32x4_shuffle::<1, 3, 5, 7>(lo, hi),
    )
}

/// Block `b`'s 32 weights as two v128 of signed bytes in K order (also the exact GEMV's,
/// [`crate::cpu::qdot`]).
///
/// # Safety
/// Block `b`'s quants (bytes 16 b .. 16 b + 16 for q4, 32 b .. 32 b + 32 for q8) lie inside `r`.
#[inline(always)]
pub(crate) unsafe fn weights<const Q4: bool>(r: &[u8], b: usize) -> (v128, v128) {
    // SAFETY (all loads): the bytes read lie inside r (checked by the caller); v128_load reads
    // unaligned memory.
    if Q4 {
        // SAFETY: the caller's contract.
        let (l, h) = unsafe { nibbles(r, b) };
        let eight = i8x16_splat(8);
        (i8x16_sub(l, eight), i8x16_sub(h, eight))
    } else {
        let p = r.as_ptr();
        unsafe {
            (
                v128_load(p.add(b * QBLOCK).cast()),
                v128_load(p.add(b * QBLOCK + 16).cast()),
            )
        }
    }
}

/// Q4 block `b`'s 32 nibbles `n = w + 8` (0..15) as two v128 of bytes in K order.
///
/// # Safety
/// Bytes 16 b .. 16 b + 16 lie inside `r`.
#[inline(always)]
unsafe fn nibbles(r: &[u8], b: usize) -> (v128, v128) {
    // SAFETY: the caller's contract; v128_load reads unaligned memory.
    let v = unsafe { v128_load(r.as_ptr().add(b * 16).cast()) };
    let l = v128_and(v, u8x16_splat(0x0F));
    let h = u8x16_shr(v, 4);
    (
        i8x16_shuffle::<0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23>(l, h),
        i8x16_shuffle::<8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31>(l, h),
    )
}

/// The lane sums of block `b` (its weights `w` as [`weights`] gives them, or for q4 in the relaxed-SIMD
/// build its [`nibbles`]) with one x row's quants `x0`, `x1`: lane l of the first holds products
/// 4 l .. 4 l + 3, of the second 16 + 4 l .. 16 + 4 l + 3. `s`: that row's offset sums from the block's
/// first, `s[at .. at + 8]` (q4 in the relaxed build only).
#[inline(always)]
fn block_sums<const Q4: bool>(
    w: (v128, v128),
    x0: v128,
    x1: v128,
    (s, at): (&[i32], usize),
) -> (v128, v128) {
    #[cfg(target_feature = "relaxed-simd")]
    if Q4 {
        let s = &s[at..at + 8];
        // SAFETY: `s` holds the 8 i32 (32 bytes) read; v128_load reads unaligned memory.
        let (c0, c1) = unsafe {
            (
                v128_load(s.as_ptr().cast()),
                v128_load(s.as_ptr().add(4).cast()),
            )
        };
        return (
            i32x4_relaxed_dot_i8x16_i7x16_add(x0, w.0, c0),
            i32x4_relaxed_dot_i8x16_i7x16_add(x1, w.1, c1),
        );
    }
    let _ = (s, at);
    (dot16(w.0, x0), dot16(w.1, x1))
}

/// M = `M` rows of x; `Q4` picks the nibble layout. The caller checks the lengths. Chain c's
/// lanes 0..4 and 4..8 are registers 2 c and 2 c + 1.
fn rows<const M: usize, const Q4: bool>(fmt: QFormat, k: usize, r: &[u8], x: Qx, o: &mut [f32]) {
    let ((qx, dx, offsets), dst) = (x, o);
    let blocks = k / QBLOCK;
    let mut acc = [[f32x4_splat(0.0); 8]; M];
    // Blocks in fours, block b0 + cb into chain cb (a constant once unrolled).
    for b0 in (0..blocks).step_by(4) {
        for cb in 0..4 {
            let b = b0 + cb;
            if b >= blocks {
                break;
            }
            let dw = block_scale(fmt, k, r, b);
            // SAFETY: b < blocks and the caller checked that r holds `blocks` blocks.
            let w = unsafe {
                if Q4 && cfg!(target_feature = "relaxed-simd") {
                    nibbles(r, b)
                } else {
                    weights::<Q4>(r, b)
                }
            };
            for (i, a) in acc.iter_mut().enumerate() {
                let p = qx.as_ptr();
                // SAFETY: qx holds M rows of k values and 32 b + 32 <= k.
                let (x0, x1) = unsafe {
                    (
                        v128_load(p.add(i * k + b * QBLOCK).cast()),
                        v128_load(p.add(i * k + b * QBLOCK + 16).cast()),
                    )
                };
                let (i0, i1) = block_sums::<Q4>(w, x0, x1, (offsets, (i * k + b * QBLOCK) / 4));
                let dd = f32x4_splat(dw * dx[i * blocks + b]);
                let s0 = f32x4_mul(dd, f32x4_convert_i32x4(i0));
                let s1 = f32x4_mul(dd, f32x4_convert_i32x4(i1));
                a[2 * cb] = f32x4_add(a[2 * cb], s0);
                a[2 * cb + 1] = f32x4_add(a[2 * cb + 1], s1);
            }
        }
    }
    for (d, a) in dst.iter_mut().zip(acc) {
        *d = fold32(a);
    }
}

/// 32 lane sums held as eight f32x4 (lanes 4 j .. 4 j + 3 in register j), folded as [`sum32`] folds
/// them (also the exact GEMV's, [`crate::cpu::qdot`]).
#[inline(always)]
pub(crate) fn fold32(a: [v128; 8]) -> f32 {
    let mut l = [0f32; QBLOCK];
    for (j, quarter) in a.into_iter().enumerate() {
        l[4 * j] = f32x4_extract_lane::<0>(quarter);
        l[4 * j + 1] = f32x4_extract_lane::<1>(quarter);
        l[4 * j + 2] = f32x4_extract_lane::<2>(quarter);
        l[4 * j + 3] = f32x4_extract_lane::<3>(quarter);
    }
    sum32(&l)
}
