//! `cpu::linear` for every weight format and both paths (the GEMV at M <= 4, the panel GEMM above),
//! with every epilogue, against an f64 reference on the weights the format stands for.
//!
//! Tolerance (as tests/kernels/matmul.rs): per element gamma_K sum_k |x_k w_k| plus one rounding each
//! for the bias add and the output; with GELU, its Lipschitz constant (<= 1.13) on that, the erf
//! polynomial's 1.5e-7 absolute error times 0.5 |v|, and one rounding of the result; with a residual,
//! one more rounding of the sum. f16 weights: the reference uses the same f16 values (widening is
//! exact). q8/q4 weights: the reference multiplies by `dequantize_rows` of the same bytes, and the
//! kernel's per-block `d * q` is exact in f32, so only the summation order differs.

use florence2_wasm::cpu::linear::{linear_rows, LinearRef, PANEL_BYTES};
use florence2_wasm::cpu::qdot_int8::QuantDot;
use florence2_wasm::cpu::Weight;
use florence2_wasm::ops::matmul::Act;
use florence2_wasm::quant::{dequantize_rows, quantize_rows, QFormat};
use half::f16;

use crate::common::cpu::erf_f64;
use crate::common::Rng;
use crate::{check_bounds, U};

fn gelu64(v: f64) -> f64 {
    0.5 * v * (1.0 + erf_f64(v / std::f64::consts::SQRT_2))
}

/// Inputs and reference of one linear call.
pub struct Case {
    pub x: Vec<f32>,
    pub w: Vec<f32>,
    pub bias: Option<Vec<f32>>,
    pub residual: Option<Vec<f32>>,
    pub act: Act,
    pub mnk: (usize, usize, usize),
}

impl Case {
    pub fn new(
        seed: u64,
        (m, n, k): (usize, usize, usize),
        bias: bool,
        act: Act,
        residual: bool,
    ) -> Self {
        let mut rng = Rng::new(seed);
        Case {
            x: rng.vec(m * k, 1.0),
            w: rng.vec(n * k, 0.5),
            bias: bias.then(|| rng.vec(n, 0.5)),
            residual: residual.then(|| rng.vec(m * n, 1.0)),
            act,
            mnk: (m, n, k),
        }
    }

    /// (values, bounds) with weights `wf` (the values the stored format stands for).
    pub fn reference(&self, wf: &[f32]) -> (Vec<f32>, Vec<f64>) {
        let (m, n, k) = self.mnk;
        let gamma = k as f64 * U / (1.0 - k as f64 * U);
        let (mut out, mut bound) = (vec![0f32; m * n], vec![0f64; m * n]);
        for i in 0..m {
            for j in 0..n {
                let (mut s, mut mag) = (0f64, 0f64);
                for kk in 0..k {
                    let p = self.x[i * k + kk] as f64 * wf[j * k + kk] as f64;
                    s += p;
                    mag += p.abs();
                }
                let mut b = gamma * mag;
                if let Some(bb) = &self.bias {
                    s += bb[j] as f64;
                }
                b += 2.0 * U * s.abs() + 1e-30;
                let mut v = s;
                if self.act == Act::Gelu {
                    v = gelu64(s);
                    b = 1.13 * b + 0.5 * 1.5e-7 * s.abs() + U * v.abs();
                }
                if let Some(r) = &self.residual {
                    v += r[i * n + j] as f64;
                }
                out[i * n + j] = v as f32;
                bound[i * n + j] = b + U * v.abs();
            }
        }
        (out, bound)
    }

    pub fn run(&self, w: Weight) -> Vec<f32> {
        let (m, n, k) = self.mnk;
        let l = LinearRef {
            w,
            n,
            k,
            bias: self.bias.as_deref(),
        };
        let mut out = vec![f32::NAN; m * n];
        linear_rows(
            &l,
            &self.x,
            self.act,
            self.residual.as_deref(),
            &mut out,
            (false, QuantDot::Exact),
        )
        .unwrap();
        out
    }
}

/// Run `c` with its weights stored as `fmt` (None: f32, Some(None): f16, Some(Some(q)): q8/q4) and check it.
fn check_format(name: &str, c: &Case, fmt: &str) {
    let (_, n, k) = c.mnk;
    let got_want = match fmt {
        "f32" => (c.run(Weight::F32(&c.w)), c.w.clone()),
        "f16" => {
            let h: Vec<f16> = c.w.iter().map(|&v| f16::from_f32(v)).collect();
            let wf = h.iter().map(|v| v.to_f32()).collect();
            (c.run(Weight::F16(&h)), wf)
        }
        _ => {
            let q = if fmt == "q8" {
                QFormat::Q8
            } else {
                QFormat::Q4
            };
            let mut bytes = Vec::new();
            quantize_rows(q, k, &c.w, &mut bytes).unwrap();
            assert_eq!(bytes.len(), n * q.row_bytes(k));
            (
                c.run(Weight::Quant(q, &bytes)),
                dequantize_rows(q, k, &bytes).unwrap(),
            )
        }
    };
    let (want, bound) = c.reference(&got_want.1);
    check_bounds(&format!("{name} {fmt}"), &got_want.0, &want, &bound);
}

#[test]
fn every_format_path_and_epilogue() {
    let epilogues = [
        (false, Act::None, false),
        (true, Act::None, false),
        (true, Act::Gelu, false),
        (true, Act::None, true),
        (false, Act::Gelu, true),
    ];
    let mut seed = 100;
    for m in [1, 3, 4, 5, 37] {
        for (n, k) in [(40, 64), (33, 96)] {
            for &(bias, act, res) in &epilogues {
                seed += 1;
                let c = Case::new(seed, (m, n, k), bias, act, res);
                let name = format!("linear M{m} N{n} K{k} bias {bias} {act:?} residual {res}");
                for fmt in ["f32", "f16", "q8", "q4"] {
                    check_format(&name, &c, fmt);
                }
            }
        }
    }
}

#[test]
fn k_not_whole_blocks_and_several_panels() {
    // K = 147 (the 7x7 RGB stem): the GEMV's partial block, f32 and f16 only.
    for m in [2, 9] {
        let c = Case::new(7 + m as u64, (m, 21, 147), true, Act::Gelu, false);
        check_format(&format!("linear M{m} K147"), &c, "f32");
        check_format(&format!("linear M{m} K147"), &c, "f16");
    }
    // More weight rows than one dequantized panel holds.
    let k = 1024;
    let n = PANEL_BYTES / (4 * k) + 44;
    let c = Case::new(5, (6, n, k), true, Act::None, true);
    for fmt in ["f16", "q4"] {
        check_format(&format!("linear M6 N{n} K{k} (panels)"), &c, fmt);
    }
}

#[test]
fn bad_shapes_are_refused() {
    let x = [0f32; 12];
    let w = [0f32; 8];
    let mut out = [0f32; 6];
    let l = |w, n, k, bias| LinearRef { w, n, k, bias };
    for (lr, res, what) in [
        (l(Weight::F32(&w), 2, 4, None), None, "ok"),
        (l(Weight::F32(&w[..7]), 2, 4, None), None, "weight"),
        (l(Weight::F32(&w), 2, 4, Some(&x[..3])), None, "bias"),
        (l(Weight::F32(&w), 2, 4, None), Some(&x[..5]), "residual"),
        (l(Weight::F32(&w), 4, 2, None), None, "out"),
        (
            l(Weight::Quant(QFormat::Q8, &[0u8; 8]), 2, 4, None),
            None,
            "q8 K",
        ),
    ] {
        let r = linear_rows(&lr, &x, Act::None, res, &mut out, (false, QuantDot::Exact));
        if what == "ok" {
            // x (3, 4) @ w (2, 4)^T -> (3, 2)
            r.unwrap();
        } else {
            assert!(
                matches!(r, Err(florence2_wasm::Error::Shape { .. })),
                "{what}: {r:?}"
            );
        }
    }
}

/// The decode GEMV's quantized row dots: the dispatched SIMD path (AVX2 on this CPU when it has it)
/// equals the scalar reference path bit for bit (both compute the same products and sums in the same
/// order), for both formats, every M, several K and scales spanning the f16 range.
#[test]
fn quant_row_dots_simd_equals_portable() {
    use florence2_wasm::cpu::qdot::{portable, quant_row_dots};
    let mut rng = Rng::new(91);
    for fmt in [QFormat::Q8, QFormat::Q4] {
        for k in [32, 96, 768, 3072] {
            for m in 1..=4 {
                let w = rng.vec(k, 3.0);
                let mut bytes = Vec::new();
                quantize_rows(fmt, k, &w, &mut bytes).unwrap();
                let scales: Vec<f32> = (0..k / 32)
                    .map(|b| (rng.uniform().abs() + 0.01) * 4f32.powi(b as i32 % 7 - 3))
                    .collect();
                let x = rng.vec(m * k, 2.0);
                let (mut got, mut want) = (vec![0f32; m], vec![0f32; m]);
                quant_row_dots(fmt, k, &bytes, &scales, &x, &mut got);
                portable(fmt, k, &bytes, &scales, &x, &mut want);
                let (gb, wb): (Vec<u32>, Vec<u32>) = (
                    got.iter().map(|v| v.to_bits()).collect(),
                    want.iter().map(|v| v.to_bits()).collect(),
                );
                assert_eq!(gb, wb, "{fmt:?} k={k} m={m}: {got:?} vs {want:?}");
                assert!(want.iter().all(|v| v.is_finite() && *v != 0.0));
            }
        }
    }
}

/// The bits of x (M, K) @ w (N, K)^T through `linear_rows` (no bias, no activation).
fn gemv_bits(w: Weight, (n, k): (usize, usize), x: &[f32], per_row: bool) -> Vec<u32> {
    let l = LinearRef {
        w,
        n,
        k,
        bias: None,
    };
    let mut out = vec![0f32; x.len() / k * n];
    linear_rows(&l, x, Act::None, None, &mut out, (per_row, QuantDot::Exact)).unwrap();
    out.iter().map(|v| v.to_bits()).collect()
}

/// The decode GEMV on f16 weights (widened in registers by F16C where the CPU has it) equals the GEMV
/// on the same weights widened to f32 beforehand, bit for bit: both take the same products in the same
/// lanes and fold them the same way. Every M of the GEMV path, K with and without a tail.
#[test]
fn f16_gemv_equals_f32_gemv_on_the_widened_weights() {
    let mut rng = Rng::new(77);
    for k in [32, 100, 768] {
        let n = 37;
        let wh: Vec<f16> = rng.vec(n * k, 1.0).into_iter().map(f16::from_f32).collect();
        let wf: Vec<f32> = wh.iter().map(|h| h.to_f32()).collect();
        for m in 1..=4 {
            let x = rng.vec(m * k, 1.0);
            let run = |w| gemv_bits(w, (n, k), &x, false);
            assert_eq!(run(Weight::F16(&wh)), run(Weight::F32(&wf)), "k={k} m={m}");
        }
    }
}

/// The decode GEMV on q8/q4 weights equals the GEMV on the same weights dequantized to f32, bit for
/// bit: a quantized row's products go into the dense dots' 32 lanes in K order and are folded the same
/// way (the dequantized weight `d * q` is exact in f32). Every M of the GEMV path, K of 1 to 96 blocks.
#[test]
fn quantized_gemv_equals_f32_gemv_on_the_dequantized_weights() {
    let mut rng = Rng::new(78);
    for fmt in [QFormat::Q8, QFormat::Q4] {
        for k in [32, 768, 3072] {
            let n = 19;
            let mut bytes = Vec::new();
            quantize_rows(fmt, k, &rng.vec(n * k, 2.0), &mut bytes).unwrap();
            let wf = dequantize_rows(fmt, k, &bytes).unwrap();
            for m in 1..=4 {
                let x = rng.vec(m * k, 1.0);
                let run = |w| gemv_bits(w, (n, k), &x, true);
                let quant = run(Weight::Quant(fmt, &bytes));
                assert_eq!(quant, run(Weight::F32(&wf)), "{fmt:?} k={k} m={m}");
            }
        }
    }
}

/// `linear_rows(.., (per_row = true, Exact))`: every M takes the GEMV path, so each row equals, bit for bit, the
/// row run alone (what the batched decoder relies on), in every weight format; and it stays within the
/// reference bound.
#[test]
fn per_row_results_do_not_depend_on_m() {
    use florence2_wasm::cpu::linear::linear_rows;
    for m in [1, 5, 9] {
        let c = Case::new(900 + m as u64, (m, 40, 96), true, Act::Gelu, true);
        let (_, n, k) = c.mnk;
        let h: Vec<f16> = c.w.iter().map(|&v| f16::from_f32(v)).collect();
        let mut q8 = Vec::new();
        quantize_rows(QFormat::Q8, k, &c.w, &mut q8).unwrap();
        let mut q4 = Vec::new();
        quantize_rows(QFormat::Q4, k, &c.w, &mut q4).unwrap();
        for w in [
            Weight::F32(&c.w),
            Weight::F16(&h),
            Weight::Quant(QFormat::Q8, &q8),
            Weight::Quant(QFormat::Q4, &q4),
        ] {
            let l = LinearRef {
                w,
                n,
                k,
                bias: c.bias.as_deref(),
            };
            let res = c.residual.as_deref().unwrap();
            let mut all = vec![f32::NAN; m * n];
            linear_rows(
                &l,
                &c.x,
                c.act,
                Some(res),
                &mut all,
                (true, QuantDot::Exact),
            )
            .unwrap();
            for r in 0..m {
                let mut one = vec![f32::NAN; n];
                let (x, rr) = (&c.x[r * k..(r + 1) * k], &res[r * n..(r + 1) * n]);
                linear_rows(&l, x, c.act, Some(rr), &mut one, (true, QuantDot::Exact)).unwrap();
                let same = all[r * n..(r + 1) * n]
                    .iter()
                    .zip(&one)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "row {r} of M = {m} differs from the row alone");
            }
            if let Weight::F32(_) = w {
                let (want, bound) = c.reference(&c.w);
                check_bounds(&format!("per-row M{m}"), &all, &want, &bound);
            }
        }
    }
}

// ---- The int8 path of the quantized GEMV (`QuantDot::Int8`, src/cpu/qdot_int8.rs) ----

/// Weight rows of `fmt` (N, K) as raw bytes: random quants over the whole byte range (q8 -128 included,
/// which the quantizer never writes but a file may hold) and f16 scales spanning 2^-6 .. 2^3.
fn random_quant_rows(rng: &mut Rng, fmt: QFormat, n: usize, k: usize) -> Vec<u8> {
    let rb = fmt.row_bytes(k);
    let mut bytes = vec![0u8; n * rb];
    for row in bytes.chunks_exact_mut(rb) {
        for q in &mut row[..fmt.quant_bytes(k)] {
            *q = rng.next_u64() as u8;
        }
        for b in 0..k / 32 {
            let d = (rng.uniform().abs() + 0.01) * 2f32.powi((b % 10) as i32 - 6);
            let s = fmt.quant_bytes(k) + 2 * b;
            row[s..s + 2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        }
    }
    bytes
}

/// x (M, K) with the blocks an int8 GEMV meets: uniform ones, one large outlier in a block of small
/// values, an all-zero block, and tiny values.
fn int8_test_x(rng: &mut Rng, m: usize, k: usize) -> Vec<f32> {
    let mut x = rng.vec(m * k, 1.0);
    for (i, blk) in x.chunks_exact_mut(32).enumerate() {
        match i % 5 {
            1 => {
                blk.iter_mut().for_each(|v| *v *= 0.01);
                blk[i % 32] = 9.0;
            }
            2 => blk.fill(0.0),
            3 => blk.iter_mut().for_each(|v| *v *= 1e-20),
            _ => {}
        }
    }
    x
}

/// x quantized per 32-block: the largest |x| maps to ±127, every value to within half a step (plus
/// the division's rounding, < 127 u of a step: 0.501 covers it), an all-zero block to d = 0, and a block
/// holding a non-finite value to d = NaN; q4's offset sums are -8 times each 4 quants' sum.
#[test]
fn int8_x_quantization_is_within_half_a_step() {
    use florence2_wasm::cpu::qdot_int8::QuantX;
    let mut rng = Rng::new(300);
    let k = 256;
    let x = int8_test_x(&mut rng, 3, k);
    let qx = QuantX::new(&x, k);
    for (b, (xb, qb)) in x.chunks_exact(32).zip(qx.q.chunks_exact(32)).enumerate() {
        let d = qx.d[b];
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(d, amax / 127.0, "block {b}");
        if amax == 0.0 {
            assert!(qb.iter().all(|&q| q == 0), "block {b}");
            continue;
        }
        assert_eq!(
            qb.iter().map(|q| q.unsigned_abs()).max(),
            Some(127),
            "block {b}"
        );
        for (&v, &q) in xb.iter().zip(qb) {
            let err = (v as f64 - d as f64 * q as f64).abs();
            assert!(err <= 0.501 * d as f64, "block {b}: {v} -> {q} * {d}");
        }
    }
    // q4's offset sums: -8 times each 4 consecutive quants' sum.
    for (g, (&o, qg)) in qx.s.iter().zip(qx.q.chunks_exact(4)).enumerate() {
        let sum: i32 = qg.iter().map(|&q| i32::from(q)).sum();
        assert_eq!(o, -8 * sum, "group {g}");
    }
    assert_eq!(qx.s.len(), 3 * k / 4);
    let mut bad = x.clone();
    bad[40] = f32::INFINITY;
    assert!(QuantX::new(&bad, k).d[1].is_nan());
}

/// Every int8 kernel this CPU runs (AVX-512 VNNI, AVX-VNNI, AVX2 `maddubs` on x86_64) gives the
/// portable kernel's bits: the integer lane sums are exact (q4's as nibble dots plus x's offset sums)
/// and the f32 combination has the same order; with x's offset sums made per call or kept in QuantX.
/// Both formats, every M, K of 1 to 96 blocks (chains partly filled), random bytes (q8's -128
/// included) and scales over 2^-6 .. 2^3.
#[test]
fn int8_kernels_equal_the_portable_kernel_bit_for_bit() {
    use florence2_wasm::cpu::qdot_int8::{int8_row_dots_with, Int8Kernel, QuantX};
    let kernels = Int8Kernel::available();
    println!("int8 kernels on this CPU: {kernels:?}");
    let mut rng = Rng::new(301);
    for fmt in [QFormat::Q8, QFormat::Q4] {
        for k in [32, 96, 160, 768, 3072] {
            let n = 5;
            let bytes = random_quant_rows(&mut rng, fmt, n, k);
            for m in 1..=4 {
                let x = int8_test_x(&mut rng, m, k);
                let qx = QuantX::new(&x, k);
                for row in 0..n {
                    let r = &bytes[row * fmt.row_bytes(k)..(row + 1) * fmt.row_bytes(k)];
                    let mut want = vec![0f32; m];
                    let xr = (&qx.q[..], &qx.d[..]);
                    int8_row_dots_with(Int8Kernel::Portable, fmt, k, r, xr, &mut want);
                    assert!(want.iter().all(|v| v.is_finite()));
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    for &kern in &kernels {
                        let mut got = vec![f32::NAN; m];
                        int8_row_dots_with(kern, fmt, k, r, xr, &mut got);
                        assert_eq!(bits(&got), bits(&want), "{kern:?} {fmt:?} k={k} m={m}");
                        // The GEMV's path: the offset sums QuantX made once.
                        let mut kept = vec![f32::NAN; m];
                        qx.row_dots_with(kern, fmt, r, 0, &mut kept);
                        assert_eq!(bits(&kept), bits(&want), "{kern:?} {fmt:?} k={k} m={m}");
                    }
                }
            }
        }
    }
}

/// out (M, N) = x @ w^T through `linear_rows` with `QuantDot::Int8` (no bias, no activation).
fn int8_gemv(
    fmt: QFormat,
    bytes: &[u8],
    (n, k): (usize, usize),
    x: &[f32],
    per_row: bool,
) -> Vec<f32> {
    let l = LinearRef {
        w: Weight::Quant(fmt, bytes),
        n,
        k,
        bias: None,
    };
    let mut out = vec![f32::NAN; x.len() / k * n];
    linear_rows(&l, x, Act::None, None, &mut out, (per_row, QuantDot::Int8)).unwrap();
    out
}

/// The int8 GEMV against the exact f64 dot of x with the dequantized weights, within its derived bound
/// (src/cpu/qdot_int8.rs): with s_b = d_x,b * 0.501 (half an x step plus the division's rounding),
///     |got - ref| <= sum_b s_b sum_{k in b} |w_k|  +  gamma_K sum_k |w_k| (|x_k| + s_b)  +  u |ref|:
/// rounding x moves each product by at most |w_k| s_b; the integer block sums are exact; the f32
/// combination (d_w * d_x, its product with the sum, K / 4 adds and the fold) rounds each of at most K
/// terms of magnitude <= |w_k| (|x_k| + s_b) fewer than K times; the output is rounded once. The bound is
/// checked to be tight enough to mean something: at most 1.5% of sum |w x| on these inputs (x's
/// quantization alone is ~0.4% of it on uniform blocks), and the worst element uses > 1% of its bound
/// (the bound adds the blocks' worst cases, the errors add like a random walk: 3% at K = 768 here; a
/// path that did not quantize x would use < 0.01%).
#[test]
fn int8_gemv_is_within_its_bound_of_the_f64_dot() {
    let mut rng = Rng::new(302);
    let gamma = |k: usize| k as f64 * U / (1.0 - k as f64 * U);
    for fmt in [QFormat::Q8, QFormat::Q4] {
        for (k, m, per_row) in [
            (32, 1, false),
            (768, 1, false),
            (768, 4, false),
            (3072, 3, false),
            (768, 6, true),
        ] {
            let n = 23;
            let mut bytes = Vec::new();
            quantize_rows(fmt, k, &rng.vec(n * k, 1.0), &mut bytes).unwrap();
            let wf = dequantize_rows(fmt, k, &bytes).unwrap();
            let x = rng.vec(m * k, 1.0);
            let got = int8_gemv(fmt, &bytes, (n, k), &x, per_row);
            let (mut want, mut bound) = (vec![0f32; m * n], vec![0f64; m * n]);
            let mut used = 0f64;
            for i in 0..m {
                let xr = &x[i * k..(i + 1) * k];
                for j in 0..n {
                    let wr = &wf[j * k..(j + 1) * k];
                    let (mut s, mut quant, mut mag, mut wx) = (0f64, 0f64, 0f64, 0f64);
                    for (xb, wb) in xr.chunks_exact(32).zip(wr.chunks_exact(32)) {
                        let amax = xb.iter().fold(0f64, |a, v| a.max(v.abs() as f64));
                        let step = 0.501 * amax / 127.0;
                        for (&xv, &wv) in xb.iter().zip(wb) {
                            let (xv, wv) = (xv as f64, wv as f64);
                            s += xv * wv;
                            quant += wv.abs() * step;
                            mag += wv.abs() * (xv.abs() + step);
                            wx += (wv * xv).abs();
                        }
                    }
                    let b = quant + gamma(k) * mag + U * s.abs() + 1e-30;
                    assert!(
                        b <= 0.015 * wx,
                        "{fmt:?} k={k}: bound {b:e} of sum|wx| {wx:e}"
                    );
                    want[i * n + j] = s as f32;
                    bound[i * n + j] = b;
                    used = used.max((got[i * n + j] as f64 - s).abs() / b);
                }
            }
            let name = format!("int8 {fmt:?} M{m} K{k} per_row {per_row}");
            check_bounds(&name, &got, &want, &bound);
            assert!(
                used > 0.01,
                "{name}: worst error uses only {used} of the bound"
            );
        }
    }
}

/// The int8 GEMV per row: each row of an M-row call equals, bit for bit, the row run alone (x is
/// quantized per row and block, the dots do not depend on M: the batched decoder's bit-identity),
/// at M within one group of 4 and across groups; a non-finite x makes its row's results NaN only.
#[test]
fn int8_gemv_rows_do_not_depend_on_m() {
    let mut rng = Rng::new(303);
    let (n, k) = (29, 96);
    for fmt in [QFormat::Q8, QFormat::Q4] {
        let mut bytes = Vec::new();
        quantize_rows(fmt, k, &rng.vec(n * k, 1.0), &mut bytes).unwrap();
        for (m, per_row) in [(3, false), (4, false), (9, true)] {
            let mut x = int8_test_x(&mut rng, m, k);
            x[k + 5] = f32::NAN;
            let all = int8_gemv(fmt, &bytes, (n, k), &x, per_row);
            for r in 0..m {
                let one = int8_gemv(fmt, &bytes, (n, k), &x[r * k..(r + 1) * k], per_row);
                let row = &all[r * n..(r + 1) * n];
                if r == 1 {
                    assert!(row.iter().chain(&one).all(|v| v.is_nan()), "{fmt:?} M{m}");
                    continue;
                }
                assert!(row.iter().all(|v| v.is_finite()), "{fmt:?} M{m} row {r}");
                let same = row
                    .iter()
                    .zip(&one)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{fmt:?}: row {r} of M = {m} differs from the row alone"
                );
            }
        }
    }
}

/// `with_quant_dot` sets the choice for its own thread only, nests, and gives the previous one back
/// when it returns or panics; `QuantDot` parses `auto`, `int8` and `exact` in any case and names what
/// else it got; `auto` is int8 for q4 rows and exact for q8 rows.
#[test]
fn quant_dot_is_scoped_to_its_thread_and_parses_its_names() {
    use florence2_wasm::cpu::qdot_int8::{quant_dot, with_quant_dot, QuantDot};
    let outside = quant_dot();
    for d in [QuantDot::Exact, QuantDot::Int8, QuantDot::Auto] {
        let other = if d == QuantDot::Exact {
            QuantDot::Int8
        } else {
            QuantDot::Exact
        };
        with_quant_dot(d, || {
            assert_eq!(quant_dot(), d);
            // Another thread sees the process's choice.
            assert_eq!(std::thread::spawn(quant_dot).join().unwrap(), outside);
            with_quant_dot(other, || assert_eq!(quant_dot(), other));
            assert_eq!(quant_dot(), d);
            let unwound = std::panic::catch_unwind(|| with_quant_dot(other, || panic!("inside")));
            assert!(unwound.is_err());
            assert_eq!(quant_dot(), d);
        });
        assert_eq!(quant_dot(), outside);
    }
    assert_eq!(" INT8 ".parse::<QuantDot>().unwrap(), QuantDot::Int8);
    assert_eq!("auto".parse::<QuantDot>().unwrap(), QuantDot::Auto);
    assert_eq!("Exact".parse::<QuantDot>().unwrap(), QuantDot::Exact);
    assert_eq!(QuantDot::Auto.for_format(QFormat::Q4), QuantDot::Int8);
    assert_eq!(QuantDot::Auto.for_format(QFormat::Q8), QuantDot::Exact);
    assert_eq!(QuantDot::Int8.for_format(QFormat::Q8), QuantDot::Int8);
    assert_eq!(QuantDot::Exact.for_format(QFormat::Q4), QuantDot::Exact);
    let e = "fast".parse::<QuantDot>().unwrap_err().to_string();
    assert!(e.contains("'fast'") && e.contains("int8 or exact"), "{e}");
}
