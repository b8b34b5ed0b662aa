//! Four f32 lanes, the register of the packed GEMM ([`crate::cpu::packed`]): wasm32's `v128` where the
//! module is built with `+simd128` (`f32x4.relaxed_madd` for the multiply-add where it is also built with
//! `+relaxed-simd`: one fused instruction where the engine's CPU has FMA, a multiply and an add where it
//! has not), plain arrays elsewhere (natively the kernel serves its tests; LLVM vectorizes the arrays).

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod imp {
    use core::arch::wasm32::*;

    /// Four f32 lanes.
    #[derive(Clone, Copy)]
    pub struct V4(v128);

    impl V4 {
        #[inline(always)]
        pub fn splat(x: f32) -> Self {
            V4(f32x4_splat(x))
        }

        #[inline(always)]
        pub fn load(s: &[f32; 4]) -> Self {
            // SAFETY: `s` holds 4 f32 (16 bytes); v128_load reads them unaligned.
            V4(unsafe { v128_load(s.as_ptr().cast::<v128>()) })
        }

        #[inline(always)]
        pub fn store(self, d: &mut [f32; 4]) {
            // SAFETY: `d` holds 4 f32 (16 bytes), uniquely borrowed; v128_store writes them unaligned.
            unsafe { v128_store(d.as_mut_ptr().cast::<v128>(), self.0) }
        }

        /// `self * b + c`, lane-wise: fused or not, as the engine's CPU does it with relaxed SIMD.
        #[inline(always)]
        pub fn madd(self, b: V4, c: V4) -> Self {
            #[cfg(target_feature = "relaxed-simd")]
            {
                V4(f32x4_relaxed_madd(self.0, b.0, c.0))
            }
            #[cfg(not(target_feature = "relaxed-simd"))]
            {
                V4(f32x4_add(f32x4_mul(self.0, b.0), c.0))
            }
        }
    }
}

#[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
mod imp {
    /// Four f32 lanes.
    #[derive(Clone, Copy)]
    pub struct V4([f32; 4]);

    impl V4 {
        #[inline(always)]
        pub fn splat(x: f32) -> Self {
            V4([x; 4])
        }

        #[inline(always)]
        pub fn load(s: &[f32; 4]) -> Self {
            V4(*s)
        }

        #[inline(always)]
        pub fn store(self, d: &mut [f32; 4]) {
            *d = self.0;
        }

        /// `self * b + c`, lane-wise (a multiply and an add).
        #[inline(always)]
        pub fn madd(self, b: V4, c: V4) -> Self {
            V4(std::array::from_fn(|l| self.0[l] * b.0[l] + c.0[l]))
        }
    }
}

pub use imp::V4;

/// Whether [`V4::madd`] may fuse (a wasm module built with `+relaxed-simd`).
pub const RELAXED: bool = cfg!(all(target_arch = "wasm32", target_feature = "relaxed-simd"));
