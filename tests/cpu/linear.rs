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
            false,
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
        let r = linear_rows(&lr, &x, Act::None, res, &mut out, false);
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
    linear_rows(&l, x, Act::None, None, &mut out, per_row).unwrap();
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

/// `linear_rows(.., per_row = true)`: every M takes the GEMV path, so each row equals, bit for bit, the
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
            linear_rows(&l, &c.x, c.act, Some(res), &mut all, true).unwrap();
            for r in 0..m {
                let mut one = vec![f32::NAN; n];
                let (x, rr) = (&c.x[r * k..(r + 1) * k], &res[r * n..(r + 1) * n]);
                linear_rows(&l, x, c.act, Some(rr), &mut one, true).unwrap();
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
