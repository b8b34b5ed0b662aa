//! Integer dot products for the quantized decode GEMV ([`QuantDot::Int8`]; by default for q4 rows, see
//! [`QuantDot::Auto`]).
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
//! Paths: x86_64 with AVX-512 VNNI (512-bit `vpdpbusd`, two blocks at once), AVX-VNNI, or AVX2
//! (`vpmaddubsw` + `vpmaddwd`), chosen at run time; these take unsigned weight bytes: q8's |w|, the
//! signs moved onto x, and q4's nibbles `n = w + 8` as they are, each lane's sum starting from x's
//! offset sum `-8 Σ x` ([`QuantX::s`], made once per GEMV call), which gives `Σ (n - 8) x` exactly;
//! wasm32 with `+simd128` (`i32x4.dot_i16x8_s` on sign-extended bytes); elsewhere [`portable`].
//!
//! Accuracy: the result is no longer the f32 GEMV on the dequantized weights. Rounding x to its grid
//! moves each x by at most `d_x / 2` (plus the division's rounding, < 127 u of a step), so against the
//! exact dot of the dequantized weights a block's error is at most `0.501 d_x sum_block |w|`, plus the
//! f32 combination's `gamma_K sum |w| (|x| + d_x / 2)` (tests/cpu/linear.rs asserts this bound).
//! Relative to the block's `sum |w x|` that is about 1/254 of the block's largest |x| over its typical
//! |x|: the same order as q8's weight quantization, far below q4's. End to end, q8/q4 with int8 dots
//! meet the thresholds the exact dots meet against f32 on the fixtures (tests/model/dtype_fidelity.rs,
//! which also bounds the logits' change from the exact dots by q8's own change from f32). On the
//! trained demo model (its 54 sample answers, 3 beams, measured on the CPU backend) q4 with int8 keeps
//! fp32's answer as often as with the exact dots (18 of 54 both; teacher-forced top-1 480 and 479 of
//! 619 steps), and so does q8 step by step (599 and 598 of 619), but q8's beam answers take another
//! path more often: 38 of 54 kept (70%) against the exact dots' 42 (78%), below the 75% that
//! tests/model/demo_model.rs asks of q8. Hence [`QuantDot::Auto`]: int8 for q4 rows, exact for q8.

use std::cell::Cell;
use std::str::FromStr;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::cpu::sum32;
use crate::error::{Error, Result};
use crate::quant::{QFormat, QBLOCK};

/// How the decode GEMV dots quantized (q8/q4) weight rows with x.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantDot {
    /// Weights widened to f32 (`d * q`, exact) and dotted with x in f32: the f32 GEMV's bits on the
    /// dequantized weights ([`crate::cpu::qdot`]), the GPU's results up to summation order.
    Exact = 0,
    /// x quantized to int8 per 32-block, integer block sums ([`int8_row_dots`]): about twice as fast.
    Int8 = 1,
    /// The default: [`QuantDot::Int8`] for q4 rows, [`QuantDot::Exact`] for q8 rows (the module doc
    /// says why).
    Auto = 2,
}

impl QuantDot {
    /// The dot for rows of `fmt`: [`QuantDot::Exact`] or [`QuantDot::Int8`].
    pub fn for_format(self, fmt: QFormat) -> QuantDot {
        match (self, fmt) {
            (QuantDot::Auto, QFormat::Q4) => QuantDot::Int8,
            (QuantDot::Auto, QFormat::Q8) => QuantDot::Exact,
            (d, _) => d,
        }
    }
}

impl FromStr for QuantDot {
    type Err = Error;

    /// `auto`, `int8` or `exact` (any case).
    fn from_str(s: &str) -> Result<QuantDot> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(QuantDot::Auto),
            "int8" => Ok(QuantDot::Int8),
            "exact" => Ok(QuantDot::Exact),
            other => Err(Error::InvalidInput(format!(
                "unknown quantized dot '{other}' (expected auto, int8 or exact)"
            ))),
        }
    }
}

/// The process's choice: 0 while unset, else 1 + the [`QuantDot`]'s discriminant (its index in `ALL`).
static MODE: AtomicU8 = AtomicU8::new(0);

const ALL: [QuantDot; 3] = [QuantDot::Exact, QuantDot::Int8, QuantDot::Auto];

thread_local! {
    /// [`with_quant_dot`]'s choice for this thread, over the process's.
    static SCOPED: Cell<Option<QuantDot>> = const { Cell::new(None) };
}

/// The choice for [`crate::cpu::linear::linear_rows`] on this thread: [`with_quant_dot`]'s while it
/// runs, else the process's: what [`set_quant_dot`] set, else the environment variable
/// `FLORENCE2_CPU_QUANT_DOT` (`auto`, `int8` or `exact`) read at the first call, else
/// [`QuantDot::Auto`].
pub fn quant_dot() -> QuantDot {
    if let Some(d) = SCOPED.with(Cell::get) {
        return d;
    }
    let mut mode = MODE.load(Ordering::Relaxed);
    if mode == 0 {
        // A concurrent set_quant_dot wins over the environment.
        let m = 1 + env_quant_dot() as u8;
        let _ = MODE.compare_exchange(0, m, Ordering::Relaxed, Ordering::Relaxed);
        mode = MODE.load(Ordering::Relaxed);
    }
    ALL[usize::from(mode - 1)]
}

/// `FLORENCE2_CPU_QUANT_DOT` when it names a [`QuantDot`], else [`QuantDot::Auto`] (always in wasm,
/// where a page has no environment).
fn env_quant_dot() -> QuantDot {
    std::env::var("FLORENCE2_CPU_QUANT_DOT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(QuantDot::Auto)
}

/// Set the process's [`quant_dot`] (for every later GEMV call of [`crate::cpu::linear::linear_rows`]).
pub fn set_quant_dot(d: QuantDot) {
    MODE.store(1 + d as u8, Ordering::Relaxed);
}

/// Run `f` with [`quant_dot`] answering `d` on this thread, whatever the process's choice: the CPU
/// backend runs each op on the thread that records it, so a model used inside `f` (on this thread)
/// dots its quantized rows with `d`, while other threads keep theirs (tests comparing both paths in
/// one process). The previous choice of this thread comes back when `f` returns or panics.
pub fn with_quant_dot<R>(d: QuantDot, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<QuantDot>);
    impl Drop for Restore {
        fn drop(&mut self) {
            SCOPED.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SCOPED.with(|s| s.replace(Some(d))));
    f()
}

/// Rows of x quantized to int8 in 32-blocks: `q` (M, K) and the block scales `d` (M, K / 32).
#[derive(Clone, Debug)]
pub struct QuantX {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    /// q4's offset sums (M, K / 4): -8 times the sum of each 4 consecutive quants ([`offset_sums`]).
    pub s: Vec<i32>,
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
        let s = offset_sums(&q);
        QuantX { q, d, s, k }
    }

    /// Rows `i0 .. i0 + m` as (quants, scales, offset sums).
    pub fn rows(&self, i0: usize, m: usize) -> Qx<'_> {
        let (k, blocks) = (self.k, self.k / QBLOCK);
        (
            &self.q[i0 * k..(i0 + m) * k],
            &self.d[i0 * blocks..(i0 + m) * blocks],
            &self.s[i0 * k / 4..(i0 + m) * k / 4],
        )
    }

    /// [`int8_row_dots_with`] of the weight row `r` with x rows `i0 .. i0 + dst.len()`, from the
    /// offset sums made once here (the GEMV's path: no allocation per row).
    pub fn row_dots_with(
        &self,
        kernel: Int8Kernel,
        fmt: QFormat,
        r: &[u8],
        i0: usize,
        dst: &mut [f32],
    ) {
        dots_x(kernel, fmt, self.k, r, self.rows(i0, dst.len()), dst)
    }

    /// [`QuantX::row_dots_with`] by the fastest kernel ([`Int8Kernel::best`]).
    pub fn row_dots(&self, fmt: QFormat, r: &[u8], i0: usize, dst: &mut [f32]) {
        self.row_dots_with(Int8Kernel::best(), fmt, r, i0, dst)
    }
}

/// -8 times the sum of each 4 consecutive quants of `q`: a q4 weight is `n - 8` with `n` its nibble,
/// so a lane's integer sum `Σ (n - 8) q_x` is `Σ n q_x` (unsigned bytes times signed ones, what
/// `maddubs` and `vpdpbusd` take as they are) plus this offset, exactly.
fn offset_sums(q: &[i8]) -> Vec<i32> {
    q.chunks_exact(4)
        .map(|g| -8 * g.iter().map(|&v| i32::from(v)).sum::<i32>())
        .collect()
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

    /// [`Int8Kernel::is_available`], detected once per process (one load per call: the GEMV asks for
    /// every weight row).
    fn usable(self) -> bool {
        static MASK: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
        let mask = *MASK.get_or_init(|| {
            let avail = Int8Kernel::available();
            avail.iter().fold(0, |m, &k| m | 1 << k as u8)
        });
        mask & (1 << self as u8) != 0
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

/// M rows of x quantized to int8 (K each), their K / 32 block scales and K / 4 offset sums each
/// ([`QuantX::rows`]).
pub type Qx<'a> = (&'a [i8], &'a [f32], &'a [i32]);

/// dst[i] = Σ_b (d_w[b] * d_x[i, b]) * Σ_{k in b} q_w[k] * q_x[i, k] for the dst.len() (1..=4) rows of
/// `qx` (K = `k` each, scales `dx`, K / 32 per row) and the weight row `r`: one row of
/// [`crate::quant`]'s layout, `fmt.row_bytes(k)` bytes (quants, then the f16 block scales padded to
/// whole 16 bytes, which the x86 kernels read 8 at a time).
pub fn int8_row_dots(fmt: QFormat, k: usize, r: &[u8], qx: (&[i8], &[f32]), dst: &mut [f32]) {
    int8_row_dots_with(Int8Kernel::best(), fmt, k, r, qx, dst)
}

/// [`int8_row_dots`] with a chosen kernel; one this build or CPU cannot run falls back to [`portable`].
/// Each call makes the x rows' offset sums ([`QuantX::row_dots_with`] keeps them across calls).
pub fn int8_row_dots_with(
    kernel: Int8Kernel,
    fmt: QFormat,
    k: usize,
    r: &[u8],
    (q, d): (&[i8], &[f32]),
    dst: &mut [f32],
) {
    let q = &q[..(dst.len() * k).min(q.len())];
    dots_x(kernel, fmt, k, r, (q, d, &offset_sums(q)), dst)
}

/// [`int8_row_dots_with`] on x rows with their offset sums.
fn dots_x(kernel: Int8Kernel, fmt: QFormat, k: usize, r: &[u8], qx: Qx, dst: &mut [f32]) {
    check_lengths(fmt, k, r, qx, dst);
    let kernel = if kernel.usable() {
        kernel
    } else {
        Int8Kernel::Portable
    };
    match kernel {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` (`is_available`) detected the features each kernel is compiled for; the
        // slices' lengths were checked above.
        Int8Kernel::Avx512Vnni => unsafe { x86::dots_512vnni(fmt, k, r, qx, dst) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Int8Kernel::AvxVnni => unsafe { x86::dots_avxvnni(fmt, k, r, qx, dst) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Int8Kernel::Avx2 => unsafe { x86::dots_avx2(fmt, k, r, qx, dst) },
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        Int8Kernel::Simd128 => simd128::dots(fmt, k, r, qx, dst),
        _ => portable(fmt, k, r, (qx.0, qx.1), dst),
    }
}

/// The lengths every kernel relies on (a panic, as a slice index would: callers pass whole rows).
#[inline(always)]
fn check_lengths(fmt: QFormat, k: usize, r: &[u8], (qx, dx, sx): Qx, dst: &[f32]) {
    let (m, blocks) = (dst.len(), k / QBLOCK);
    assert!(
        m <= 4 && k.is_multiple_of(QBLOCK),
        "int8 row dots: M {m}, K {k}"
    );
    assert!(qx.len() >= m * k && dx.len() >= m * blocks && r.len() >= fmt.row_bytes(k));
    assert!(sx.len() >= m * k / 4);
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
    ($rows:ident, $fmt:expr, $k:expr, $r:expr, $x:expr, $dst:expr) => {
        match ($fmt, $dst.len()) {
            (_, 0) => {}
            (QFormat::Q8, 1) => $rows::<1, false>($k, $r, $x, $dst),
            (QFormat::Q8, 2) => $rows::<2, false>($k, $r, $x, $dst),
            (QFormat::Q8, 3) => $rows::<3, false>($k, $r, $x, $dst),
            (QFormat::Q8, _) => $rows::<4, false>($k, $r, $x, $dst),
            (QFormat::Q4, 1) => $rows::<1, true>($k, $r, $x, $dst),
            (QFormat::Q4, 2) => $rows::<2, true>($k, $r, $x, $dst),
            (QFormat::Q4, 3) => $rows::<3, true>($k, $r, $x, $dst),
            (QFormat::Q4, _) => $rows::<4, true>($k, $r, $x, $dst),
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
pub(crate) mod simd128;
