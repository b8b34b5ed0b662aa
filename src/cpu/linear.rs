//! `nn.Linear` on the CPU: out (M, N) = act(x (M, K) @ w (N, K)^T + bias (N)) + residual (M, N), the
//! definition of [`crate::ops::matmul::linear`] with a residual (bias, then exact GELU, then the
//! residual, in f32), for weights in every resident format ([`Weight`]).
//!
//! Two shapes of work:
//! - M <= [`GEMV_MAX_ROWS`] (a decode step, up to 4 beams): a fused GEMV, threads over N. Each weight
//!   row is read once, a 32-weight block at a time, dequantized into registers (`d * q`) and dotted with
//!   every x row: the time follows the weight bytes, so q4 reads 7x fewer bytes than f32. q8/q4 rows
//!   can instead be dotted in integers with x quantized to int8 once per call ([`QuantDot::Int8`],
//!   about twice as fast; by default for q4 rows, [`QuantDot::Auto`]); [`QuantDot::Exact`] dots the
//!   dequantized weights in f32, the GPU's results ([`linear_rows`] with a [`QuantDot`],
//!   [`qdot_int8::set_quant_dot`], `FLORENCE2_CPU_QUANT_DOT` or the CLI's `--cpu-dot`).
//! - Otherwise the GEMM ([`crate::cpu::gemm`]): f32 weights are its operand as they are; f16/q8/q4
//!   weights are dequantized one panel of rows at a time (about [`PANEL_BYTES`] of f32, in parallel) and
//!   multiplied before the next panel is made, so the dequantization costs one pass over the weight per
//!   call, never a whole f32 copy of the matrix.

use half::f16;

use crate::cpu::activation::Act;
use crate::cpu::gemm::{sgemm_nt, MatRef};
use crate::cpu::qdot_int8::{self, QuantDot, QuantX};
use crate::cpu::{activation, check_len, par, qdot, widen, Weight};
use crate::error::{Error, Result};
use crate::quant::{QFormat, QBLOCK};

/// Largest M the GEMV path takes (as the GPU's decode GEMV).
pub const GEMV_MAX_ROWS: usize = 4;

/// Bytes of f32 one dequantized weight panel holds.
pub const PANEL_BYTES: usize = 1 << 20;

/// A Linear's parameters: weight (n, k) and optional bias (n).
#[derive(Clone, Copy, Debug)]
pub struct LinearRef<'a> {
    pub w: Weight<'a>,
    pub n: usize,
    pub k: usize,
    pub bias: Option<&'a [f32]>,
}

/// out (M, N) = act(x (M, K) @ w^T + bias); M = x.len() / K.
pub fn linear(l: &LinearRef, x: &[f32], act: Act, out: &mut [f32]) -> Result<()> {
    linear_rows(l, x, act, None, out, (false, qdot_int8::quant_dot()))
}

/// out (M, N) = act(x (M, K) @ w^T + bias) + residual (M, N). With `per_row` every M takes the GEMV
/// path (in groups of [`GEMV_MAX_ROWS`] x rows per weight row), so that each row's result equals a
/// one-row call's whatever M is (the batched decoder's bit-identity). `dot` is the GEMV's dot for
/// quantized weights: [`QuantDot::Int8`] quantizes the x rows to int8 once per call and dots them in
/// integers ([`qdot_int8`]), [`QuantDot::Exact`] widens the weights to f32, [`QuantDot::Auto`] takes
/// int8 for q4 weights and exact for q8; f32/f16 weights and the GEMM
/// path ignore it. The CPU backend passes the process's choice ([`qdot_int8::quant_dot`]).
pub fn linear_rows(
    l: &LinearRef,
    x: &[f32],
    act: Act,
    residual: Option<&[f32]>,
    out: &mut [f32],
    (per_row, dot): (bool, QuantDot),
) -> Result<()> {
    const OP: &str = "cpu linear";
    let (n, k) = (l.n, l.k);
    l.w.check(OP, n, k)?;
    if k == 0 || !x.len().is_multiple_of(k) {
        return Err(Error::shape(
            OP,
            format!("x of {} values is not rows of K = {k}", x.len()),
        ));
    }
    let m = x.len() / k;
    check_len(OP, "out", out, m * n)?;
    if let Some(b) = l.bias {
        check_len(OP, "bias", b, n)?;
    }
    if let Some(r) = residual {
        check_len(OP, "residual", r, m * n)?;
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if m <= GEMV_MAX_ROWS || per_row {
        gemv(l, x, m, out, dot);
    } else {
        gemm_panels(l, x, m, out)?;
    }
    epilogue(out, n, l.bias, act, residual);
    Ok(())
}

/// The GEMM path: out = x @ w^T, w as f32 panels.
fn gemm_panels(l: &LinearRef, x: &[f32], m: usize, out: &mut [f32]) -> Result<()> {
    let (n, k) = (l.n, l.k);
    let xm = MatRef::new(x, m, k);
    if let Weight::F32(w) = l.w {
        return sgemm_nt(xm, MatRef::new(w, n, k), out, n, 0);
    }
    let nc = (PANEL_BYTES / (4 * k)).clamp(16, n.max(16)).min(n);
    let mut panel = vec![0f32; nc * k];
    for j0 in (0..n).step_by(nc) {
        let rows = nc.min(n - j0);
        let p = &mut panel[..rows * k]; // (rows, K)
        let task = par::task_len(rows, 4);
        par::chunks_mut(p, task * k, |t, pc| {
            for (r, dst) in pc.chunks_exact_mut(k).enumerate() {
                l.w.row_into(k, j0 + t * task + r, dst);
            }
        });
        sgemm_nt(xm, MatRef::new(p, rows, k), out, n, j0)?;
    }
    Ok(())
}

/// The GEMV path (M <= 4, or any M row by row): dots of every weight row with the M x rows (in groups
/// of [`GEMV_MAX_ROWS`], the weight row still in cache for the next group), threads over N; the (N, M)
/// results then transposed into out (M, N). With int8 dots for quantized weights, x is
/// quantized once here and every row dotted with it by [`QuantX::row_dots`].
fn gemv(l: &LinearRef, x: &[f32], m: usize, out: &mut [f32], dot: QuantDot) {
    let (n, k) = (l.n, l.k);
    let mut t = vec![0f32; n * m]; // (N, M)
    let task = par::task_len(n, 16);
    let group = GEMV_MAX_ROWS * k;
    let int8 = match l.w {
        Weight::Quant(fmt, v) if dot.for_format(fmt) == QuantDot::Int8 => {
            Some((fmt, v, QuantX::new(x, k)))
        }
        _ => None,
    };
    par::chunks_mut(&mut t, task * m, |ti, tc| {
        let mut scratch = vec![0f32; k];
        for (r, dst) in tc.chunks_exact_mut(m).enumerate() {
            let row = ti * task + r;
            if let Some((fmt, v, qx)) = &int8 {
                let rb = fmt.row_bytes(k);
                for (g, dg) in dst.chunks_mut(GEMV_MAX_ROWS).enumerate() {
                    qx.row_dots(*fmt, &v[row * rb..(row + 1) * rb], g * GEMV_MAX_ROWS, dg);
                }
                continue;
            }
            for (xg, dg) in x.chunks(group).zip(dst.chunks_mut(GEMV_MAX_ROWS)) {
                row_dots(&l.w, k, row, xg, dg, &mut scratch);
            }
        }
    });
    for (j, d) in t.chunks_exact(m).enumerate() {
        for (i, &v) in d.iter().enumerate() {
            out[i * n + j] = v;
        }
    }
}

/// dst[i] = w[row, :] . x[i, :] for the dst.len() rows of x: f32/f16 rows go to [`dense_dots`] (32
/// lane-wise partial sums; f16 rows widened first, or in registers by F16C); q8/q4 rows to
/// [`qdot::quant_row_dots`] (the row's scales widened once, quants widened in SIMD registers). On
/// x86_64 CPUs with AVX2 the f32/f16 code runs compiled for it.
fn row_dots(w: &Weight, k: usize, row: usize, x: &[f32], dst: &mut [f32], scratch: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c") {
        // SAFETY: the features `row_dots_avx2` is compiled for were detected just above.
        unsafe { row_dots_avx2(w, k, row, x, dst, scratch) };
        return;
    }
    row_dots_body(w, k, row, x, dst, scratch);
}

/// [`row_dots`] compiled for AVX2, chosen at run time. f32 and f16 rows are dotted with every x row
/// in registers ([`dots_avx2`]; f16 widened by F16C 32 halves at a time): the same lanes and sums as
/// [`dense_dots`] on the (widened) row. Quantized rows take [`row_dots_body`], compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn row_dots_avx2(
    w: &Weight,
    k: usize,
    row: usize,
    x: &[f32],
    dst: &mut [f32],
    scratch: &mut [f32],
) {
    use std::arch::x86_64::*;
    let body = k / DL * DL;
    match w {
        Weight::F32(v) => {
            let r = &v[row * k..(row + 1) * k];
            // SAFETY: `dots_avx2` asks for groups c .. c + 8 with c + 8 <= body <= k.
            let load = |c: usize| unsafe { _mm256_loadu_ps(r.as_ptr().add(c)) };
            // SAFETY: AVX2 is enabled here (this function's target features).
            unsafe { dots_avx2(k, x, dst, load, &r[body..]) };
        }
        Weight::F16(v) => {
            let h = &v[row * k..(row + 1) * k];
            let mut tail = [0f32; DL];
            for (o, hv) in tail.iter_mut().zip(&h[body..]) {
                *o = hv.to_f32();
            }
            // SAFETY: `dots_avx2` asks for groups c .. c + 8 with c + 8 <= body <= k.
            let load = |c: usize| unsafe {
                _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr().add(c).cast::<__m128i>()))
            };
            // SAFETY: AVX2 and F16C are enabled here (this function's target features).
            unsafe { dots_avx2(k, x, dst, load, &tail[..k - body]) };
        }
        Weight::Quant(..) => row_dots_body(w, k, row, x, dst, scratch),
    }
}

/// dst[i] = row . x[i, :] for up to [`GEMV_MAX_ROWS`] rows of x (K = `k` each), the row's 8-weight
/// group at c (c + 8 <= the whole groups of [`DL`]) given by `load(c)` and its f32 values past them in
/// `tail`: 4 x 8 lane-wise partial sums per x row in registers, each weight group loaded once for
/// every x row; products and sums unfused, in [`dense_dots`]' order, folded by [`fold_lanes`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn dots_avx2(
    k: usize,
    x: &[f32],
    dst: &mut [f32],
    load: impl Fn(usize) -> std::arch::x86_64::__m256,
    tail: &[f32],
) {
    use std::arch::x86_64::*;
    let m = dst.len().min(GEMV_MAX_ROWS);
    assert!(x.len() >= m * k);
    let body = k / DL * DL;
    let mut acc = [[_mm256_setzero_ps(); 4]; GEMV_MAX_ROWS];
    for c in (0..body).step_by(DL) {
        let wv: [__m256; 4] = std::array::from_fn(|g| load(c + 8 * g));
        for (i, a) in acc.iter_mut().enumerate().take(m) {
            for g in 0..4 {
                // SAFETY: x holds m rows of k values (asserted above) and c + 8 g + 8 <= k.
                let xv = unsafe { _mm256_loadu_ps(x.as_ptr().add(i * k + c + 8 * g)) };
                a[g] = _mm256_add_ps(a[g], _mm256_mul_ps(wv[g], xv));
            }
        }
    }
    for (i, (d, a)) in dst.iter_mut().zip(&acc).enumerate().take(m) {
        let mut lanes = [0f32; DL];
        for (g, &ag) in a.iter().enumerate() {
            // SAFETY: writes the 8 floats of lanes[8 g .. 8 g + 8].
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * g), ag) };
        }
        *d = fold_lanes(&lanes, tail, &x[i * k + body..(i + 1) * k]);
    }
}

/// The body of [`row_dots`]; f16 rows are widened whole first ([`widen::f16_to_f32`]), then dotted as
/// f32.
#[inline(always)]
fn row_dots_body(
    w: &Weight,
    k: usize,
    row: usize,
    x: &[f32],
    dst: &mut [f32],
    scratch: &mut [f32],
) {
    match w {
        Weight::F32(v) => dense_dots(&v[row * k..(row + 1) * k], x, k, dst),
        Weight::F16(v) => {
            let r = &mut scratch[..k];
            widen::f16_to_f32(&v[row * k..(row + 1) * k], r);
            dense_dots(r, x, k, dst);
        }
        Weight::Quant(fmt, v) => {
            let (r, scales) = quant_row(*fmt, v, k, row, scratch);
            qdot::quant_row_dots(*fmt, k, r, scales, x, dst);
        }
    }
}

/// Row `row` of quantized weights `v` (rows of K): its bytes, and its K / 32 block scales widened to f32
/// into `scratch`.
#[inline(always)]
fn quant_row<'a, 's>(
    fmt: QFormat,
    v: &'a [u8],
    k: usize,
    row: usize,
    scratch: &'s mut [f32],
) -> (&'a [u8], &'s [f32]) {
    let blocks = k / QBLOCK;
    let rb = fmt.row_bytes(k);
    let r = &v[row * rb..(row + 1) * rb];
    let scales = &mut scratch[..blocks];
    let sb = &r[fmt.quant_bytes(k)..fmt.quant_bytes(k) + 2 * blocks];
    for (d, h) in scales.iter_mut().zip(sb.chunks_exact(2)) {
        *d = f16::from_bits(u16::from_le_bytes([h[0], h[1]])).to_f32();
    }
    (r, scales)
}

/// dst[i] = w . x[i, :] for an f32 row w (K) and the dst.len() rows of x, each in 32 lane-wise partial
/// sums (four independent 8-wide chains, so the adds' latency overlaps), folded pairwise at the end,
/// the tail past whole groups of 32 added last. Rows of x go in pairs, each weight load serving two;
/// a row's sum does not depend on how many rows there are.
#[inline(always)]
fn dense_dots(w: &[f32], x: &[f32], k: usize, dst: &mut [f32]) {
    let body = k / DL * DL;
    for (p, d) in dst.chunks_mut(2).enumerate() {
        let x0 = &x[2 * p * k..(2 * p + 1) * k];
        if let [d0, d1] = d {
            let x1 = &x[(2 * p + 1) * k..(2 * p + 2) * k];
            let (mut a0, mut a1) = ([0f32; DL], [0f32; DL]);
            let chunks = w
                .chunks_exact(DL)
                .zip(x0.chunks_exact(DL).zip(x1.chunks_exact(DL)));
            for (wc, (c0, c1)) in chunks {
                for l in 0..DL {
                    a0[l] += wc[l] * c0[l];
                    a1[l] += wc[l] * c1[l];
                }
            }
            *d0 = fold_lanes(&a0, &w[body..], &x0[body..]);
            *d1 = fold_lanes(&a1, &w[body..], &x1[body..]);
        } else {
            let mut a0 = [0f32; DL];
            for (wc, c0) in w.chunks_exact(DL).zip(x0.chunks_exact(DL)) {
                for l in 0..DL {
                    a0[l] += wc[l] * c0[l];
                }
            }
            d[0] = fold_lanes(&a0, &w[body..], &x0[body..]);
        }
    }
}

/// Lanes of [`dense_dots`]' partial sums.
const DL: usize = 32;

/// The DL partial sums folded pairwise, plus w . x over the tail past whole groups of DL (`w`, `x`:
/// the tails).
#[inline(always)]
fn fold_lanes(acc: &[f32; DL], w: &[f32], x: &[f32]) -> f32 {
    let mut s = crate::cpu::sum32(acc);
    for (wv, xv) in w.iter().zip(x) {
        s += wv * xv;
    }
    s
}

/// out = act(out + bias) + residual, row by row (the GPU epilogue's order), in parallel.
fn epilogue(out: &mut [f32], n: usize, bias: Option<&[f32]>, act: Act, residual: Option<&[f32]>) {
    if bias.is_none() && act == Act::None && residual.is_none() {
        return;
    }
    let rows = par::task_len(out.len() / n, 8);
    par::chunks_mut(out, rows * n, |t, oc| {
        for (r, row) in oc.chunks_exact_mut(n).enumerate() {
            if let Some(b) = bias {
                row.iter_mut().zip(b).for_each(|(v, &bb)| *v += bb);
            }
            if act == Act::Gelu {
                row.iter_mut().for_each(|v| *v = activation::gelu_f32(*v));
            }
            if let Some(res) = residual {
                let i = t * rows + r;
                let rr = &res[i * n..(i + 1) * n];
                row.iter_mut().zip(rr).for_each(|(v, &x)| *v += x);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// The run-time path (AVX2 where the CPU has it) gives the portable loops' bits: f32 and f16 rows,
    /// 1 to 4 x rows, K with and without a tail past whole groups of 32.
    #[test]
    fn row_dots_equal_the_portable_path_bit_for_bit() {
        for k in [32, 100, 768] {
            let (n, rows) = (3, 4);
            let w = values(n * k, k as u64);
            let wh: Vec<f16> = w.iter().map(|&v| f16::from_f32(v)).collect();
            let x = values(rows * k, 7 + k as u64);
            for weight in [Weight::F32(&w), Weight::F16(&wh)] {
                for m in 1..=rows {
                    for row in 0..n {
                        let (mut got, mut want) = (vec![0f32; m], vec![0f32; m]);
                        let mut scratch = vec![0f32; k];
                        row_dots(&weight, k, row, &x[..m * k], &mut got, &mut scratch);
                        row_dots_body(&weight, k, row, &x[..m * k], &mut want, &mut scratch);
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&got), bits(&want), "k {k}, m {m}, row {row}");
                    }
                }
            }
        }
    }
}
