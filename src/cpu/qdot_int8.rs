//! Integer dot products for the quantized decode GEMV (opt-in: [`QuantDot::Int8`]).
//!
//! The x rows are quantized once per GEMV call ([`QuantX`]): per 32-value block a scale
//! `d_x = max|x| / 127` and int8 values `q_x = round(x / d_x)`. Each block of a q8/q4 weight row is then
//! dotted with them in integers, and only the block's sum is scaled, in f32:
//! `acc += (d_w * d_x) * isum`. The integer sums are exact (|isum| <= 32 * 128 * 127 < 2^24, so the
//! conversion to f32 is exact too), so every path below agrees bit for bit when it combines them in f32
//! in the same order:
//! - a block's 32 products go into 8 integer lanes, lane `l` the sum of products `4 l .. 4 l + 3`
//!   (what AVX2's `maddubs` + `madd` and VNNI's `vpdpbusd` produce);
//! - lane `l` of block `b` is scaled (`(d_w * d_x) * isum`, multiply then add, never fused) and added
//!   to lane `8 (b mod 4) + l` of 32 f32 partial sums (four independent chains per x row, so the adds'
//!   latency overlaps), which [`sum32`] folds at the end.
//!
//! Paths: x86_64 with AVX-512 VNNI (256-bit `vpdpbusd`), AVX-VNNI, or AVX2 (`vpsignb` makes the weights
//! unsigned and moves their signs onto x, `vpmaddubsw` + `vpmaddwd` sum them), chosen at run time;
//! wasm32 with `+simd128` (`i32x4.dot_i16x8_s` on sign-extended bytes); elsewhere [`portable`].
//!
//! Accuracy: the result is no longer the f32 GEMV on the dequantized weights. Rounding x to its grid
//! moves each x by at most `d_x / 2` (plus the division's rounding, < 127 u of a step), so against the
//! exact dot of the dequantized weights a block's error is at most `0.501 d_x sum_block |w|`, plus the
//! f32 combination's `gamma_K sum |w| (|x| + d_x / 2)` (tests/cpu/linear.rs asserts this bound).
//! Relative to the block's `sum |w x|` that is about 1/254 of the block's largest |x| over its typical
//! |x|: the same order as q8's weight quantization, far below q4's.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::cpu::sum32;
use crate::quant::{QFormat, QBLOCK};

/// How the decode GEMV dots quantized (q8/q4) weight rows with x.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantDot {
    /// Weights widened to f32 (`d * q`, exact) and dotted with x in f32: the f32 GEMV's bits on the
    /// dequantized weights ([`crate::cpu::qdot`]).
    Exact,
    /// x quantized to int8 per 32-block, integer block sums ([`int8_row_dots`]).
    Int8,
}

const UNSET: u8 = 0;
const EXACT: u8 = 1;
const INT8: u8 = 2;
static MODE: AtomicU8 = AtomicU8::new(UNSET);

/// The process's choice for [`crate::cpu::linear::linear_rows`]: what [`set_quant_dot`] set, else the
/// environment variable `FLORENCE2_CPU_QUANT_DOT` (`int8` or `exact`) read at the first call, else
/// [`QuantDot::Exact`].
pub fn quant_dot() -> QuantDot {
    let mode = match MODE.load(Ordering::Relaxed) {
        UNSET => {
            let int8 = std::env::var("FLORENCE2_CPU_QUANT_DOT")
                .map(|v| v.trim().eq_ignore_ascii_case("int8"))
                .unwrap_or(false);
            let m = if int8 { INT8 } else { EXACT };
            // A concurrent set_quant_dot wins over the environment.
            let _ = MODE.compare_exchange(UNSET, m, Ordering::Relaxed, Ordering::Relaxed);
            MODE.load(Ordering::Relaxed)
        }
        m => m,
    };
    if mode == INT8 {
        QuantDot::Int8
    } else {
        QuantDot::Exact
    }
}

/// Set the process's [`quant_dot`] (for every later GEMV call of [`crate::cpu::linear::linear_rows`]).
pub fn set_quant_dot(d: QuantDot) {
    let m = match d {
        QuantDot::Exact => EXACT,
        QuantDot::Int8 => INT8,
    };
    MODE.store(m, Ordering::Relaxed);
}

/// Rows of x quantized to int8 in 32-blocks: `q` (M, K) and the block scales `d` (M, K / 32).
#[derive(Clone, Debug)]
pub struct QuantX {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub k: usize,
}

impl QuantX {
    /// x (M, K), K a multiple of 32: per block d = max|x| / 127 and q = round(x / d) (ties away from
    /// zero; an all-zero block has d = 0, q = 0). A block holding a non-finite value gets d = NaN, so
    /// the dots it enters are NaN, as the f32 GEMV's would be NaN or infinite.
    pub fn new(x: &[f32], k: usize) -> Self {
        debug_assert!(k.is_multiple_of(QBLOCK) && x.len().is_multiple_of(k));
        let mut q = vec![0i8; x.len()];
        let mut d = vec![0f32; x.len() / QBLOCK];
        for ((xb, qb), db) in x
            .chunks_exact(QBLOCK)
            .zip(q.chunks_exact_mut(QBLOCK))
            .zip(&mut d)
        {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            if xb.iter().any(|v| !v.is_finite()) {
                *db = f32::NAN;
                continue;
            }
            *db = amax / 127.0;
            if amax > 0.0 {
                for (o, &v) in qb.iter_mut().zip(xb) {
                    *o = (v / *db).round().clamp(-127.0, 127.0) as i8;
                }
            }
        }
        QuantX { q, d, k }
    }

    /// Rows `i0 .. i0 + m` as (quants, scales).
    pub fn rows(&self, i0: usize, m: usize) -> (&[i8], &[f32]) {
        let blocks = self.k / QBLOCK;
        (
            &self.q[i0 * self.k..(i0 + m) * self.k],
            &self.d[i0 * blocks..(i0 + m) * blocks],
        )
    }
}

/// The kernels of [`int8_row_dots`], for tests and benchmarks to address each one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int8Kernel {
    Portable,
    /// x86_64 AVX2: `vpsignb` + `vpmaddubsw` + `vpmaddwd`.
    Avx2,
    /// x86_64 AVX-VNNI: 256-bit `vpdpbusd` (VEX).
    AvxVnni,
    /// x86_64 AVX-512 VNNI + VL: 256-bit `vpdpbusd` (EVEX).
    Avx512Vnni,
    /// wasm32 SIMD128: `i32x4.dot_i16x8_s`.
    Simd128,
}

impl Int8Kernel {
    /// Whether this build and CPU can run the kernel.
    pub fn is_available(self) -> bool {
        match self {
            Int8Kernel::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Int8Kernel::Avx512Vnni => {
                is_x86_feature_detected!("avx512vnni")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Int8Kernel::AvxVnni => {
                is_x86_feature_detected!("avxvnni")
                    && is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Int8Kernel::Avx2 => {
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")
            }
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
            Int8Kernel::Simd128 => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Every kernel this build and CPU can run, fastest first.
    pub fn available() -> Vec<Int8Kernel> {
        [
            Int8Kernel::Avx512Vnni,
            Int8Kernel::AvxVnni,
            Int8Kernel::Avx2,
            Int8Kernel::Simd128,
            Int8Kernel::Portable,
        ]
        .into_iter()
        .filter(|k| k.is_available())
        .collect()
    }

    /// The kernel [`int8_row_dots`] runs: the fastest available.
    pub fn best() -> Int8Kernel {
        #[cfg(target_arch = "x86_64")]
        {
            use std::sync::OnceLock;
            static BEST: OnceLock<Int8Kernel> = OnceLock::new();
            *BEST.get_or_init(|| Int8Kernel::available()[0])
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        {
            Int8Kernel::Simd128
        }
        #[cfg(not(any(
            target_arch = "x86_64",
            all(target_arch = "wasm32", target_feature = "simd128")
        )))]
        {
            Int8Kernel::Portable
        }
    }
}

/// dst[i] = Σ_b (d_w[b] * d_x[i, b]) * Σ_{k in b} q_w[k] * q_x[i, k] for the dst.len() (1..=4) rows of
/// `qx` (K = `k` each, scales `dx`, K / 32 per row) and the weight row `r`: one row of
/// [`crate::quant`]'s layout, `fmt.row_bytes(k)` bytes (quants, then the f16 block scales padded to
/// whole 16 bytes, which the x86 kernels read 8 at a time).
pub fn int8_row_dots(fmt: QFormat, k: usize, r: &[u8], qx: (&[i8], &[f32]), dst: &mut [f32]) {
    check_lengths(fmt, k, r, qx, dst);
    let (q, d) = qx;
    match Int8Kernel::best() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `best` detected the features each kernel is compiled for; the slices' lengths were
        // checked above.
        Int8Kernel::Avx512Vnni => unsafe { x86::dots_512vnni(fmt, k, r, q, d, dst) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Int8Kernel::AvxVnni => unsafe { x86::dots_avxvnni(fmt, k, r, q, d, dst) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Int8Kernel::Avx2 => unsafe { x86::dots_avx2(fmt, k, r, q, d, dst) },
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        Int8Kernel::Simd128 => simd128::dots(fmt, k, r, q, d, dst),
        _ => portable(fmt, k, r, qx, dst),
    }
}

/// [`int8_row_dots`] with a chosen kernel; one this build or CPU cannot run falls back to [`portable`].
pub fn int8_row_dots_with(
    kernel: Int8Kernel,
    fmt: QFormat,
    k: usize,
    r: &[u8],
    qx: (&[i8], &[f32]),
    dst: &mut [f32],
) {
    check_lengths(fmt, k, r, qx, dst);
    let (q, d) = qx;
    if !kernel.is_available() {
        return portable(fmt, k, r, qx, dst);
    }
    match kernel {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `is_available` detected the features each kernel is compiled for; the slices'
        // lengths were checked above.
        Int8Kernel::Avx512Vnni => unsafe { x86::dots_512vnni(fmt, k, r, q, d, dst) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Int8Kernel::AvxVnni => unsafe { x86::dots_avxvnni(fmt, k, r, q, d, dst) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Int8Kernel::Avx2 => unsafe { x86::dots_avx2(fmt, k, r, q, d, dst) },
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        Int8Kernel::Simd128 => simd128::dots(fmt, k, r, q, d, dst),
        _ => portable(fmt, k, r, qx, dst),
    }
}

/// The lengths every kernel relies on (a panic, as a slice index would: callers pass whole rows).
#[inline(always)]
fn check_lengths(fmt: QFormat, k: usize, r: &[u8], (qx, dx): (&[i8], &[f32]), dst: &[f32]) {
    let (m, blocks) = (dst.len(), k / QBLOCK);
    assert!(
        m <= 4 && k.is_multiple_of(QBLOCK),
        "int8 row dots: M {m}, K {k}"
    );
    assert!(qx.len() >= m * k && dx.len() >= m * blocks && r.len() >= fmt.row_bytes(k));
}

/// Block `b`'s weight scale d_w from row `r`'s f16 scales.
#[inline(always)]
fn block_scale(fmt: QFormat, k: usize, r: &[u8], b: usize) -> f32 {
    let s = fmt.quant_bytes(k) + 2 * b;
    half::f16::from_le_bytes([r[s], r[s + 1]]).to_f32()
}

/// Block `b`'s 32 weights as signed integers in K order.
#[inline(always)]
fn block_quants(fmt: QFormat, r: &[u8], b: usize) -> [i8; QBLOCK] {
    let mut w = [0i8; QBLOCK];
    match fmt {
        QFormat::Q8 => {
            for (o, &v) in w.iter_mut().zip(&r[b * QBLOCK..(b + 1) * QBLOCK]) {
                *o = v as i8;
            }
        }
        QFormat::Q4 => {
            for (o, &v) in w.chunks_exact_mut(2).zip(&r[b * 16..(b + 1) * 16]) {
                o[0] = (v & 0xF) as i8 - 8;
                o[1] = (v >> 4) as i8 - 8;
            }
        }
    }
    w
}

/// [`int8_row_dots`] in scalar code (the reference the SIMD kernels are tested against).
pub fn portable(fmt: QFormat, k: usize, r: &[u8], (qx, dx): (&[i8], &[f32]), dst: &mut [f32]) {
    let blocks = k / QBLOCK;
    let mut acc = [[0f32; QBLOCK]; 4];
    for b in 0..blocks {
        let (w, dw) = (block_quants(fmt, r, b), block_scale(fmt, k, r, b));
        let chain = 8 * (b % 4);
        for (i, a) in acc.iter_mut().enumerate().take(dst.len()) {
            let xq = &qx[i * k + b * QBLOCK..i * k + (b + 1) * QBLOCK];
            let dd = dw * dx[i * blocks + b];
            for l in 0..8 {
                let s: i32 = (4 * l..4 * l + 4)
                    .map(|j| i32::from(w[j]) * i32::from(xq[j]))
                    .sum();
                a[chain + l] += dd * s as f32;
            }
        }
    }
    for (d, a) in dst.iter_mut().zip(&acc) {
        *d = sum32(a);
    }
}

/// `$rows::<M, Q4>(k, r, qx, dx, dst)` for M = dst.len() (1..=4) and the format.
#[cfg(target_arch = "x86_64")]
macro_rules! by_shape_int8 {
    ($rows:ident, $fmt:expr, $k:expr, $r:expr, $qx:expr, $dx:expr, $dst:expr) => {
        match ($fmt, $dst.len()) {
            (_, 0) => {}
            (QFormat::Q8, 1) => $rows::<1, false>($k, $r, $qx, $dx, $dst),
            (QFormat::Q8, 2) => $rows::<2, false>($k, $r, $qx, $dx, $dst),
            (QFormat::Q8, 3) => $rows::<3, false>($k, $r, $qx, $dx, $dst),
            (QFormat::Q8, _) => $rows::<4, false>($k, $r, $qx, $dx, $dst),
            (QFormat::Q4, 1) => $rows::<1, true>($k, $r, $qx, $dx, $dst),
            (QFormat::Q4, 2) => $rows::<2, true>($k, $r, $qx, $dx, $dst),
            (QFormat::Q4, 3) => $rows::<3, true>($k, $r, $qx, $dx, $dst),
            (QFormat::Q4, _) => $rows::<4, true>($k, $r, $qx, $dx, $dst),
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::quant::{QFormat, QBLOCK};

    /// One x86 kernel: `$name` compiled for `$features`, the 8 lane sums of 32 unsigned weight bytes
    /// `$u` times 32 signed x bytes `$s` given by `$dot`. Blocks go in groups of 8: the group's d_w
    /// (F16C, 8 scales at once) times each x row's d_x is stored once per group and broadcast per block.
    macro_rules! x86_kernel {
        ($name:ident, $rows:ident, $features:literal, |$u:ident, $s:ident| $dot:expr) => {
            #[target_feature(enable = $features)]
            pub unsafe fn $name(
                fmt: QFormat,
                k: usize,
                r: &[u8],
                qx: &[i8],
                dx: &[f32],
                dst: &mut [f32],
            ) {
                by_shape_int8!($rows, fmt, k, r, qx, dx, dst)
            }

            /// M = `M` rows of x; `Q4` picks the nibble layout. The caller checks the lengths.
            #[target_feature(enable = $features)]
            unsafe fn $rows<const M: usize, const Q4: bool>(
                k: usize,
                r: &[u8],
                qx: &[i8],
                dx: &[f32],
                dst: &mut [f32],
            ) {
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
                            // |w| as unsigned bytes (|-128| = 128 as u8); the signs go onto x.
                            let $u = _mm256_sign_epi8(w, w);
                            for (i, a) in acc.iter_mut().enumerate() {
                                // SAFETY: qx holds M rows of k values and 32 b + 32 <= k.
                                let xv = unsafe {
                                    _mm256_loadu_si256(qx.as_ptr().add(i * k + b * QBLOCK).cast())
                                };
                                let $s = _mm256_sign_epi8(xv, w);
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

    /// Block `b`'s 32 weights as signed bytes in K order.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn weights<const Q4: bool>(r: &[u8], b: usize) -> __m256i {
        if Q4 {
            // SAFETY: bytes 16 b .. 16 b + 16 of r exist (the caller's check).
            let v = unsafe { _mm_loadu_si128(r.as_ptr().add(b * 16).cast()) };
            // Byte j widened to 16 bits is 0x00hl (nibbles h, l); OR-ing it shifted left by 4 gives
            // 0x0hXl, and the mask 0x0F0F keeps bytes l, h: the two weights of byte j in K order.
            let v16 = _mm256_cvtepu8_epi16(v);
            let hl = _mm256_or_si256(v16, _mm256_slli_epi16::<4>(v16));
            let w = _mm256_and_si256(hl, _mm256_set1_epi16(0x0F0F));
            _mm256_sub_epi8(w, _mm256_set1_epi8(8))
        } else {
            // SAFETY: bytes 32 b .. 32 b + 32 of r exist (the caller's check).
            unsafe { _mm256_loadu_si256(r.as_ptr().add(b * QBLOCK).cast()) }
        }
    }

    x86_kernel!(dots_avx2, rows_avx2, "avx2,f16c", |u, s| _mm256_madd_epi16(
        _mm256_maddubs_epi16(u, s),
        _mm256_set1_epi16(1)
    ));
    x86_kernel!(dots_avxvnni, rows_avxvnni, "avx2,f16c,avxvnni", |u, s| {
        _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s)
    });

    /// [`super::int8_row_dots`] with AVX-512 VNNI: two blocks per 512-bit `vpdpbusd` (block b0 + j in
    /// lanes 0..8, b0 + j + 1 in lanes 8..16), so chains j mod 4 = 0, 1 share one register and 2, 3
    /// the other; the same sums as the 256-bit kernels, lane for lane.
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn dots_512vnni(
        fmt: QFormat,
        k: usize,
        r: &[u8],
        qx: &[i8],
        dx: &[f32],
        dst: &mut [f32],
    ) {
        by_shape_int8!(rows_512vnni, fmt, k, r, qx, dx, dst)
    }

    /// Blocks b and b + 1's 64 weights as signed bytes in K order (`PAIR` false: block b only, the
    /// upper 32 bytes zero).
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
            // 0x0hXl, and the mask 0x0F0F keeps bytes l, h: the two weights of byte j in K order.
            let v16 = _mm512_cvtepu8_epi16(v);
            let s = _mm512_slli_epi16::<4>(v16);
            // (A | B) & C.
            let w = _mm512_ternarylogic_epi32::<0xA8>(v16, s, _mm512_set1_epi16(0x0F0F));
            _mm512_sub_epi8(w, _mm512_set1_epi8(8))
        } else {
            // SAFETY: bytes 32 b .. 32 b + 64 of r exist (blocks b and b + 1, the caller's check).
            unsafe { _mm512_loadu_si512(r.as_ptr().add(b * QBLOCK).cast()) }
        }
    }

    /// M = `M` rows of x; `Q4` picks the nibble layout. The caller checks the lengths.
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn rows_512vnni<const M: usize, const Q4: bool>(
        k: usize,
        r: &[u8],
        qx: &[i8],
        dx: &[f32],
        dst: &mut [f32],
    ) {
        let blocks = k / QBLOCK;
        // SAFETY: the scales follow the quants in the row.
        let sp = unsafe { r.as_ptr().add(if Q4 { k / 2 } else { k }) };
        // Chains (0, 1) and (2, 3) per x row.
        let mut acc = [[_mm512_setzero_ps(); 2]; M];
        for b0 in (0..blocks).step_by(8) {
            // SAFETY: the row's scales are padded to whole 16 bytes, so the 8 halves from b0 lie in r.
            let dw = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(sp.add(2 * b0).cast()) });
            let nb = (blocks - b0).min(8);
            let mask = ((1u16 << nb) - 1) as u8;
            let mut dd = [_mm512_setzero_ps(); M];
            for (i, d) in dd.iter_mut().enumerate() {
                // SAFETY: the masked load reads dx[i * blocks + b0 ..][..nb] only.
                let x = unsafe { _mm256_maskz_loadu_ps(mask, dx.as_ptr().add(i * blocks + b0)) };
                *d = _mm512_zextps256_ps512(_mm256_mul_ps(dw, x));
            }
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
                    let u = _mm512_abs_epi8(w);
                    let neg = _mm512_movepi8_mask(w);
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
                        let s = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
                        let isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
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
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod simd128 {
    use core::arch::wasm32::*;

    use super::block_scale;
    use crate::cpu::sum32;
    use crate::quant::{QFormat, QBLOCK};

    pub fn dots(fmt: QFormat, k: usize, r: &[u8], qx: &[i8], dx: &[f32], dst: &mut [f32]) {
        match (fmt, dst.len()) {
            (_, 0) => {}
            (QFormat::Q8, 1) => rows::<1, false>(fmt, k, r, qx, dx, dst),
            (QFormat::Q8, 2) => rows::<2, false>(fmt, k, r, qx, dx, dst),
            (QFormat::Q8, 3) => rows::<3, false>(fmt, k, r, qx, dx, dst),
            (QFormat::Q8, _) => rows::<4, false>(fmt, k, r, qx, dx, dst),
            (QFormat::Q4, 1) => rows::<1, true>(fmt, k, r, qx, dx, dst),
            (QFormat::Q4, 2) => rows::<2, true>(fmt, k, r, qx, dx, dst),
            (QFormat::Q4, 3) => rows::<3, true>(fmt, k, r, qx, dx, dst),
            (QFormat::Q4, _) => rows::<4, true>(fmt, k, r, qx, dx, dst),
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

    /// Block `b`'s 32 weights as two v128 of signed bytes in K order.
    #[inline(always)]
    fn weights<const Q4: bool>(r: &[u8], b: usize) -> (v128, v128) {
        // SAFETY (all loads): the bytes read lie inside r (checked by the caller); v128_load reads
        // unaligned memory.
        if Q4 {
            let v = unsafe { v128_load(r.as_ptr().add(b * 16).cast()) };
            let l = v128_and(v, u8x16_splat(0x0F));
            let h = u8x16_shr(v, 4);
            let eight = i8x16_splat(8);
            (
                i8x16_sub(
                    i8x16_shuffle::<0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23>(l, h),
                    eight,
                ),
                i8x16_sub(
                    i8x16_shuffle::<8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31>(
                        l, h,
                    ),
                    eight,
                ),
            )
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

    /// M = `M` rows of x; `Q4` picks the nibble layout. The caller checks the lengths. Chain c's
    /// lanes 0..4 and 4..8 are registers 2 c and 2 c + 1.
    fn rows<const M: usize, const Q4: bool>(
        fmt: QFormat,
        k: usize,
        r: &[u8],
        qx: &[i8],
        dx: &[f32],
        dst: &mut [f32],
    ) {
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
                let (lo, hi) = weights::<Q4>(r, b);
                for (i, a) in acc.iter_mut().enumerate() {
                    let p = qx.as_ptr();
                    // SAFETY: qx holds M rows of k values and 32 b + 32 <= k.
                    let (x0, x1) = unsafe {
                        (
                            v128_load(p.add(i * k + b * QBLOCK).cast()),
                            v128_load(p.add(i * k + b * QBLOCK + 16).cast()),
                        )
                    };
                    let dd = f32x4_splat(dw * dx[i * blocks + b]);
                    let s0 = f32x4_mul(dd, f32x4_convert_i32x4(dot16(lo, x0)));
                    let s1 = f32x4_mul(dd, f32x4_convert_i32x4(dot16(hi, x1)));
                    a[2 * cb] = f32x4_add(a[2 * cb], s0);
                    a[2 * cb + 1] = f32x4_add(a[2 * cb + 1], s1);
                }
            }
        }
        for (d, a) in dst.iter_mut().zip(acc) {
            let mut l = [0f32; QBLOCK];
            for (j, quarter) in a.into_iter().enumerate() {
                l[4 * j] = f32x4_extract_lane::<0>(quarter);
                l[4 * j + 1] = f32x4_extract_lane::<1>(quarter);
                l[4 * j + 2] = f32x4_extract_lane::<2>(quarter);
                l[4 * j + 3] = f32x4_extract_lane::<3>(quarter);
            }
            *d = sum32(&l);
        }
    }
}
