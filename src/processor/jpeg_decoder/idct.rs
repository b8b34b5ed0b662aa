//! libjpeg's accurate integer inverse DCT (`jidctint.c`, `JDCT_ISLOW`, the Loeffler-Ligtenberg-Moschytz
//! algorithm with 13-bit constants and 2 extra bits between the passes), with its range limiting: the
//! result, offset by 128, is clamped to 0..=255 for outputs within -512..511 and wraps (masked to 10
//! bits) beyond, as libjpeg's `range_limit` table does. libjpeg-turbo's SIMD versions give the same bits.

const CONST_BITS: u32 = 13;
const PASS1_BITS: u32 = 2;

// FIX(x) = round(x * 2^13).
const FIX_0_298631336: i32 = 2446;
const FIX_0_390180644: i32 = 3196;
const FIX_0_541196100: i32 = 4433;
const FIX_0_765366865: i32 = 6270;
const FIX_0_899976223: i32 = 7373;
const FIX_1_175875602: i32 = 9633;
const FIX_1_501321110: i32 = 12299;
const FIX_1_847759065: i32 = 15137;
const FIX_1_961570560: i32 = 16069;
const FIX_2_053119869: i32 = 16819;
const FIX_2_562915447: i32 = 20995;
const FIX_3_072711026: i32 = 25172;

#[inline]
fn descale(x: i32, n: u32) -> i32 {
    x.wrapping_add(1 << (n - 1)) >> n
}

/// libjpeg's post-IDCT range limit of a descaled output `v` (centred on 0).
#[inline]
fn range_limit(v: i32) -> u8 {
    match v & 1023 {
        j @ 0..=127 => (j + 128) as u8,
        128..=511 => 255,
        512..=895 => 0,
        j => (j - 896) as u8,
    }
}

/// The even and odd halves of one 8-point pass: outputs (0..8) before descaling.
#[inline]
fn butterfly(x: [i32; 8], dc_shift: u32) -> [i32; 8] {
    // Even part.
    let (z2, z3) = (x[2], x[6]);
    let z1 = z2.wrapping_add(z3).wrapping_mul(FIX_0_541196100);
    let tmp2 = z1.wrapping_add(z3.wrapping_mul(-FIX_1_847759065));
    let tmp3 = z1.wrapping_add(z2.wrapping_mul(FIX_0_765366865));
    let tmp0 = x[0].wrapping_add(x[4]).wrapping_shl(dc_shift);
    let tmp1 = x[0].wrapping_sub(x[4]).wrapping_shl(dc_shift);
    let tmp10 = tmp0.wrapping_add(tmp3);
    let tmp13 = tmp0.wrapping_sub(tmp3);
    let tmp11 = tmp1.wrapping_add(tmp2);
    let tmp12 = tmp1.wrapping_sub(tmp2);
    // Odd part.
    let (t0, t1, t2, t3) = (x[7], x[5], x[3], x[1]);
    let z1 = t0.wrapping_add(t3);
    let z2 = t1.wrapping_add(t2);
    let z3 = t0.wrapping_add(t2);
    let z4 = t1.wrapping_add(t3);
    let z5 = z3.wrapping_add(z4).wrapping_mul(FIX_1_175875602);
    let t0 = t0.wrapping_mul(FIX_0_298631336);
    let t1 = t1.wrapping_mul(FIX_2_053119869);
    let t2 = t2.wrapping_mul(FIX_3_072711026);
    let t3 = t3.wrapping_mul(FIX_1_501321110);
    let z1 = z1.wrapping_mul(-FIX_0_899976223);
    let z2 = z2.wrapping_mul(-FIX_2_562915447);
    let z3 = z3.wrapping_mul(-FIX_1_961570560).wrapping_add(z5);
    let z4 = z4.wrapping_mul(-FIX_0_390180644).wrapping_add(z5);
    let t0 = t0.wrapping_add(z1).wrapping_add(z3);
    let t1 = t1.wrapping_add(z2).wrapping_add(z4);
    let t2 = t2.wrapping_add(z2).wrapping_add(z3);
    let t3 = t3.wrapping_add(z1).wrapping_add(z4);
    [
        tmp10.wrapping_add(t3),
        tmp11.wrapping_add(t2),
        tmp12.wrapping_add(t1),
        tmp13.wrapping_add(t0),
        tmp13.wrapping_sub(t0),
        tmp12.wrapping_sub(t1),
        tmp11.wrapping_sub(t2),
        tmp10.wrapping_sub(t3),
    ]
}

/// Dequantise `coef` (natural order) by `quant` and inverse-transform it into the 8x8 samples at
/// `out[0]`, rows `stride` apart.
pub(super) fn idct_islow(coef: &[i16; 64], quant: &[u16; 64], out: &mut [u8], stride: usize) {
    let mut ws = [0i32; 64];
    // Pass 1: columns, results scaled by 2^PASS1_BITS.
    for c in 0..8 {
        let x: [i32; 8] = std::array::from_fn(|r| {
            i32::from(coef[r * 8 + c]).wrapping_mul(i32::from(quant[r * 8 + c]))
        });
        if x[1..].iter().all(|&v| v == 0) {
            let dc = x[0].wrapping_shl(PASS1_BITS);
            for r in 0..8 {
                ws[r * 8 + c] = dc;
            }
            continue;
        }
        let y = butterfly(x, CONST_BITS);
        for r in 0..8 {
            ws[r * 8 + c] = descale(y[r], CONST_BITS - PASS1_BITS);
        }
    }
    // Pass 2: rows, descaled by the pass-1 scale and the transform's factor of 8.
    for r in 0..8 {
        let x: [i32; 8] = std::array::from_fn(|c| ws[r * 8 + c]);
        let row = &mut out[r * stride..r * stride + 8];
        if x[1..].iter().all(|&v| v == 0) {
            row.fill(range_limit(descale(x[0], PASS1_BITS + 3)));
            continue;
        }
        let y = butterfly(x, CONST_BITS);
        for (o, v) in row.iter_mut().zip(y) {
            *o = range_limit(descale(v, CONST_BITS + PASS1_BITS + 3));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DC-only block is flat at 128 + DC * q / 8, rounded; the range limit clamps and wraps as
    /// libjpeg's table does.
    #[test]
    fn dc_only_and_range_limit() {
        let mut coef = [0i16; 64];
        let quant = [1u16; 64];
        let mut out = [0u8; 64];
        coef[0] = 80; // 128 + 10
        idct_islow(&coef, &quant, &mut out, 8);
        assert!(out.iter().all(|&v| v == 138), "{out:?}");
        coef[0] = -1100; // -137.5 -> clamped to 0
        idct_islow(&coef, &quant, &mut out, 8);
        assert!(out.iter().all(|&v| v == 0), "{out:?}");
        assert_eq!(range_limit(127), 255);
        assert_eq!(range_limit(511), 255);
        assert_eq!(range_limit(-128), 0);
        assert_eq!(range_limit(-129), 0);
        assert_eq!(range_limit(-512), 0);
        assert_eq!(range_limit(512), 0); // wraps, as the table does
        assert_eq!(range_limit(-1), 127);
    }
}
