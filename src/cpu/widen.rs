//! IEEE half to f32, exactly (every half, NaNs with the quiet bit set as `half::f16::to_f32` does):
//! the f16 weights, KV caches and cross K/V are widened row by row on their way into the kernels.
//!
//! Natively `half`'s slice conversion runs (F16C on x86_64, chosen at run time). wasm has no such
//! instruction and `half`'s portable conversion branches per value, so wasm built with `+simd128`
//! widens 8 halves per step with integer operations: the half's exponent and mantissa shifted into
//! place and rebiased, infinities and NaNs given the top exponent, zeros and subnormals renormalized
//! by one float subtraction, the sign put back.

use half::f16;

/// dst[i] = src[i] as f32 (equal lengths).
pub fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        simd128::widen(src, dst);
    }
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
    {
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst);
    }
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod simd128 {
    use core::arch::wasm32::*;

    use half::f16;

    pub fn widen(src: &[f16], dst: &mut [f32]) {
        assert_eq!(src.len(), dst.len());
        let body = src.len() / 8 * 8;
        for (s, d) in src[..body]
            .chunks_exact(8)
            .zip(dst[..body].chunks_exact_mut(8))
        {
            // SAFETY: reads the 8 halves (16 bytes) of `s`, writes the 8 floats of `d`; v128 loads and
            // stores accept unaligned addresses.
            unsafe {
                let h = v128_load(s.as_ptr().cast());
                v128_store(d.as_mut_ptr().cast(), four(u32x4_extend_low_u16x8(h)));
                v128_store(
                    d.as_mut_ptr().add(4).cast(),
                    four(u32x4_extend_high_u16x8(h)),
                );
            }
        }
        for (o, h) in dst[body..].iter_mut().zip(&src[body..]) {
            *o = h.to_f32();
        }
    }

    /// Four halves (in the low 16 bits of u32 lanes) as f32 bits.
    #[inline(always)]
    fn four(h: v128) -> v128 {
        const EXP: u32 = 0x7C00 << 13; // the half's exponent field, shifted into f32 position
        let sign = i32x4_shl(v128_and(h, u32x4_splat(0x8000)), 16);
        let em = i32x4_shl(v128_and(h, u32x4_splat(0x7FFF)), 13);
        let exp = v128_and(em, u32x4_splat(EXP));
        let o = i32x4_add(em, u32x4_splat((127 - 15) << 23));
        // Infinity / NaN: exponent 31 becomes 255; a NaN gets the quiet bit.
        let inf_nan = i32x4_eq(exp, u32x4_splat(EXP));
        let o = i32x4_add(o, v128_and(inf_nan, u32x4_splat((128 - 16) << 23)));
        let mant = v128_and(em, u32x4_splat(0x3FF << 13));
        let nan = v128_andnot(inf_nan, i32x4_eq(mant, u32x4_splat(0)));
        let o = v128_or(o, v128_and(nan, u32x4_splat(0x0040_0000)));
        // Zero / subnormal: m * 2^-24, as (2^-14 (1 + m / 1024)) - 2^-14.
        let sub = i32x4_eq(exp, u32x4_splat(0));
        let renorm = f32x4_sub(i32x4_add(o, u32x4_splat(1 << 23)), u32x4_splat(113 << 23));
        v128_or(v128_bitselect(renorm, o, sub), sign)
    }
}
