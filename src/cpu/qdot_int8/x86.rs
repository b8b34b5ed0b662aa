//! The int8 row dots on x86_64 ([`super::int8_row_dots`]): AVX-512 VNNI (512-bit, two blocks per
//! `vpdpbusd`), AVX-VNNI and AVX2 (256-bit, one block per instruction sequence), each compiled for its
//! features and chosen at run time.

use std::arch::x86_64::*;

use super::Qx;
use crate::quant::{QFormat, QBLOCK};

/// One x86 kernel: `$name` compiled for `$features`, the 8 lane sums of 32 unsigned weight bytes
/// `$u` times 32 signed x bytes `$s`, plus the 8 lanes `$c`, given by `$dot`. q8 weights give their
/// |w| as `$u` and their signs to x; q4 weights their nibbles `n` (0..15) as they are, with x's offset
/// sums as `$c` (`Σ (n - 8) x = Σ n x - 8 Σ x`, exact: [`super::QuantX::s`]). Blocks go in groups of
/// 8: the group's d_w (F16C, 8 scales at once) times each x row's d_x is stored once per group and
/// broadcast per block.
macro_rules! x86_kernel {
    ($name:ident, $rows:ident, $features:literal, |$u:ident, $s:ident, $c:ident| $dot:expr) => {
        #[target_feature(enable = $features)]
        pub unsafe fn $name(fmt: QFormat, k: usize, r: &[u8], x: Qx, o: &mut [f32]) {
            by_shape_int8!($rows, fmt, k, r, x, o)
        }

        /// M = `M` rows of x; `Q4` picks the nibble layout. The caller checks the lengths.
        #[target_feature(enable = $features)]
        unsafe fn $rows<const M: usize, const Q4: bool>(k: usize, r: &[u8], x: Qx, o: &mut [f32]) {
            let ((qx, dx, sx), dst) = (x, o);
            let blocks = k / QBLOCK;
            let sp = r.as_ptr().add(if Q4 { k / 2 } else { k });
            let mut acc = [[_mm256_setzero_ps(); 4]; M];
            let mut dd = [[0f32; 8]; M];
            for b0 in (0..blocks).step_by(8) {
                // SAFETY: the row's scales are padded to whole 16 bytes, so the 8 halves from b0
                // lie in r (the caller checked r holds a whole row).
                let dw = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(sp.add(2 * b0).cast()) });
                let nb = (blocks - b0).min(8);
                for (i, d) in dd.iter_mut().enumerate() {
                    let mut xs = [0f32; 8];
                    xs[..nb].copy_from_slice(&dx[i * blocks + b0..i * blocks + b0 + nb]);
                    let v = _mm256_mul_ps(dw, _mm256_loadu_ps(xs.as_ptr()));
                    // SAFETY: writes the 8 floats of d.
                    unsafe { _mm256_storeu_ps(d.as_mut_ptr(), v) };
                }
                // Block b0 + j into chain j mod 4 (= b mod 4: b0 is a multiple of 8). Every
                // index into acc is a constant in each match arm, so acc stays in registers.
                macro_rules! block {
                    ($j:expr) => {{
                        let j = $j;
                        let b = b0 + j;
                        // SAFETY: the block's quant bytes lie in r (checked by the caller).
                        let w = unsafe { weights::<Q4>(r, b) };
                        // q8: |w| as unsigned bytes (|-128| = 128 as u8), the signs go onto x.
                        let $u = if Q4 { w } else { _mm256_sign_epi8(w, w) };
                        for (i, a) in acc.iter_mut().enumerate() {
                            // SAFETY: qx holds M rows of k values and 32 b + 32 <= k.
                            let xv = unsafe {
                                _mm256_loadu_si256(qx.as_ptr().add(i * k + b * QBLOCK).cast())
                            };
                            let $s = if Q4 { xv } else { _mm256_sign_epi8(xv, w) };
                            let $c = if Q4 {
                                // SAFETY: sx holds M rows of k / 4 sums and 8 b + 8 <= k / 4.
                                unsafe {
                                    _mm256_loadu_si256(sx.as_ptr().add(i * k / 4 + 8 * b).cast())
                                }
                            } else {
                                _mm256_setzero_si256()
                            };
                            let isum = $dot;
                            let ddv = _mm256_broadcast_ss(&dd[i][j]);
                            let p = _mm256_mul_ps(ddv, _mm256_cvtepi32_ps(isum));
                            match j % 4 {
                                0 => a[0] = _mm256_add_ps(a[0], p),
                                1 => a[1] = _mm256_add_ps(a[1], p),
                                2 => a[2] = _mm256_add_ps(a[2], p),
                                _ => a[3] = _mm256_add_ps(a[3], p),
                            }
                        }
                    }};
                }
                if nb == 8 {
                    block!(0);
                    block!(1);
                    block!(2);
                    block!(3);
                    block!(4);
                    block!(5);
                    block!(6);
                    block!(7);
                } else {
                    for j in 0..nb {
                        block!(j);
                    }
                }
            }
            for (d, a) in dst.iter_mut().zip(acc) {
                *d = fold(a);
            }
        }
    };
}

/// [`crate::cpu::sum32`] of the 4 chains' 8 lanes, in registers: lane-wise (c0 + c1) + (c2 + c3),
/// then the 8 lanes pairwise (adds commute, so the swapped operands give the same bits).
#[target_feature(enable = "avx2")]
#[inline]
fn fold(a: [__m256; 4]) -> f32 {
    let s = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
    // Lane 0 of each half: s0 + s1, lane 2: s2 + s3.
    let t = _mm256_add_ps(s, _mm256_permute_ps::<0b10_11_00_01>(s));
    // Lane 0 of each half: (s0 + s1) + (s2 + s3).
    let u = _mm256_add_ps(t, _mm256_permute_ps::<0b01_00_11_10>(t));
    let (lo, hi) = (_mm256_castps256_ps128(u), _mm256_extractf128_ps::<1>(u));
    _mm_cvtss_f32(_mm_add_ss(lo, hi))
}

/// Block `b`'s 32 weights in K order: q8's as signed bytes, q4's as their nibbles (0..15, the
/// weight plus 8).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn weights<const Q4: bool>(r: &[u8], b: usize) -> __m256i {
    if Q4 {
        // SAFETY: bytes 16 b .. 16 b + 16 of r exist (the caller's check).
        let v = unsafe { _mm_loadu_si128(r.as_ptr().add(b * 16).cast()) };
        // Byte j widened to 16 bits is 0x00hl (nibbles h, l); OR-ing it shifted left by 4 gives
        // 0x0hXl, and the mask 0x0F0F keeps bytes l, h: the two nibbles of byte j in K order.
        let v16 = _mm256_cvtepu8_epi16(v);
        let hl = _mm256_or_si256(v16, _mm256_slli_epi16::<4>(v16));
        _mm256_and_si256(hl, _mm256_set1_epi16(0x0F0F))
    } else {
        // SAFETY: bytes 32 b .. 32 b + 32 of r exist (the caller's check).
        unsafe { _mm256_loadu_si256(r.as_ptr().add(b * QBLOCK).cast()) }
    }
}

// maddubs adds pairs of products in 16 bits: q8's |w| <= 128 times |x| <= 127, q4's n <= 15 times
// |x| <= 127, twice, stay below 2^15.
x86_kernel!(dots_avx2, rows_avx2, "avx2,f16c", |u, s, c| {
    _mm256_add_epi32(
        c,
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)),
    )
});
x86_kernel!(
    dots_avxvnni,
    rows_avxvnni,
    "avx2,f16c,avxvnni",
    |u, s, c| { _mm256_dpbusd_avx_epi32(c, u, s) }
);

/// [`super::int8_row_dots`] with AVX-512 VNNI: two blocks per 512-bit `vpdpbusd` (block b0 + j in
/// lanes 0..8, b0 + j + 1 in lanes 8..16), so chains j mod 4 = 0, 1 share one register and 2, 3
/// the other; the same sums as the 256-bit kernels, lane for lane.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn dots_512vnni(fmt: QFormat, k: usize, r: &[u8], x: Qx, o: &mut [f32]) {
    by_shape_int8!(rows_512vnni, fmt, k, r, x, o)
}

/// Blocks b and b + 1's 64 weights in K order, as [`weights`] gives them (`PAIR` false: block b only,
/// the upper 32 bytes zero).
#[target_feature(enable = "avx2,avx512f,avx512bw")]
#[inline]
unsafe fn weights2<const Q4: bool, const PAIR: bool>(r: &[u8], b: usize) -> __m512i {
    if !PAIR {
        // SAFETY: block b's bytes exist (the caller's check).
        return _mm512_zextsi256_si512(unsafe { weights::<Q4>(r, b) });
    }
    if Q4 {
        // SAFETY: bytes 16 b .. 16 b + 32 of r exist (blocks b and b + 1, the caller's check).
        let v = unsafe { _mm256_loadu_si256(r.as_ptr().add(b * 16).cast()) };
        // Byte j widened to 16 bits is 0x00hl (nibbles h, l); OR-ing it shifted left by 4 gives
        // 0x0hXl, and the mask 0x0F0F keeps bytes l, h: the two nibbles of byte j in K order.
        let v16 = _mm512_cvtepu8_epi16(v);
        let s = _mm512_slli_epi16::<4>(v16);
        // (A | B) & C.
        _mm512_ternarylogic_epi32::<0xA8>(v16, s, _mm512_set1_epi16(0x0F0F))
    } else {
        // SAFETY: bytes 32 b .. 32 b + 64 of r exist (blocks b and b + 1, the caller's check).
        unsafe { _mm512_loadu_si512(r.as_ptr().add(b * QBLOCK).cast()) }
    }
}

/// Lanes 0..8 of each x row's register: d_w * d_x of blocks b0 .. b0 + 8 (those past the row's end 0).
#[target_feature(enable = "avx2,f16c,avx512f,avx512vl")]
#[inline]
unsafe fn group_scales<const M: usize, const Q4: bool>(
    k: usize,
    r: &[u8],
    dx: &[f32],
    b0: usize,
) -> [__m512; M] {
    let blocks = k / QBLOCK;
    // SAFETY: the scales follow the quants in the row, padded to whole 16 bytes, so the 8 halves from
    // b0 < blocks lie in r.
    let dw = unsafe {
        let sp = r.as_ptr().add(if Q4 { k / 2 } else { k });
        _mm256_cvtph_ps(_mm_loadu_si128(sp.add(2 * b0).cast()))
    };
    let mask = ((1u16 << (blocks - b0).min(8)) - 1) as u8;
    let mut dd = [_mm512_setzero_ps(); M];
    for (i, d) in dd.iter_mut().enumerate() {
        // SAFETY: the masked load reads dx[i * blocks + b0 ..][..nb] only, inside dx's M rows.
        let x = unsafe { _mm256_maskz_loadu_ps(mask, dx.as_ptr().add(i * blocks + b0)) };
        *d = _mm512_zextps256_ps512(_mm256_mul_ps(dw, x));
    }
    dd
}

/// M = `M` rows of x; `Q4` picks the nibble layout. The caller checks the lengths.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_512vnni<const M: usize, const Q4: bool>(k: usize, r: &[u8], x: Qx, o: &mut [f32]) {
    let ((qx, dx, sx), dst) = (x, o);
    let blocks = k / QBLOCK;
    // Chains (0, 1) and (2, 3) per x row.
    let mut acc = [[_mm512_setzero_ps(); 2]; M];
    for b0 in (0..blocks).step_by(8) {
        let nb = (blocks - b0).min(8);
        // SAFETY: the caller checked r holds a whole row and dx M rows of K / 32 scales.
        let dd = unsafe { group_scales::<M, Q4>(k, r, dx, b0) };
        // Lanes 0..8 from lane 0 of the group's d_w * d_x, 8..16 from lane 1 (plus j below).
        let base = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
        // Blocks j and j + 1 (`pair`; else j alone) into chains j mod 4 and j mod 4 + 1. Every
        // index into acc is a constant in each branch, so acc stays in registers.
        macro_rules! pair {
            ($j:expr, $pair:expr) => {{
                let (j, pair) = ($j, $pair);
                let b = b0 + j;
                // SAFETY: blocks b (and b + 1 with `pair`) lie in r.
                let w = unsafe {
                    if pair {
                        weights2::<Q4, true>(r, b)
                    } else {
                        weights2::<Q4, false>(r, b)
                    }
                };
                // q8: |w| and the signs onto x; q4: the nibbles and x's offset sums (as x86_kernel!).
                let u = if Q4 { w } else { _mm512_abs_epi8(w) };
                let neg = if Q4 { 0 } else { _mm512_movepi8_mask(w) };
                let idx = _mm512_add_epi32(base, _mm512_set1_epi32(j as i32));
                let lanes: u16 = if pair { 0xFFFF } else { 0x00FF };
                for (i, a) in acc.iter_mut().enumerate() {
                    // SAFETY: qx holds M rows of k values and 32 b + 32 (+ 32 with `pair`) <= k.
                    let xv = unsafe {
                        _mm512_maskz_loadu_epi8(
                            if pair { u64::MAX } else { u32::MAX as u64 },
                            qx.as_ptr().add(i * k + b * QBLOCK),
                        )
                    };
                    let isum = if Q4 {
                        // SAFETY: sx holds M rows of k / 4 sums and 8 b + 8 (+ 8 with `pair`)
                        // <= k / 4.
                        let c = unsafe {
                            _mm512_maskz_loadu_epi32(lanes, sx.as_ptr().add(i * k / 4 + 8 * b))
                        };
                        _mm512_dpbusd_epi32(c, u, xv)
                    } else {
                        let s = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s)
                    };
                    let ddv = _mm512_permutexvar_ps(idx, dd[i]);
                    let p = _mm512_mul_ps(ddv, _mm512_cvtepi32_ps(isum));
                    if j % 4 == 0 {
                        a[0] = _mm512_mask_add_ps(a[0], lanes, a[0], p);
                    } else {
                        a[1] = _mm512_mask_add_ps(a[1], lanes, a[1], p);
                    }
                }
            }};
        }
        if nb == 8 {
            pair!(0, true);
            pair!(2, true);
            pair!(4, true);
            pair!(6, true);
        } else {
            for j in (0..nb).step_by(2) {
                pair!(j, j + 1 < nb);
            }
        }
    }
    for (d, a) in dst.iter_mut().zip(acc) {
        let (lo, hi) = (
            |z: __m512| _mm512_castps512_ps256(z),
            |z: __m512| _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(z))),
        );
        *d = fold([lo(a[0]), hi(a[0]), lo(a[1]), hi(a[1])]);
    }
}
