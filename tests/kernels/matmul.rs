//! `ops::matmul` against a plain Rust f64 reference.
//!
//! Tolerance: the GPU accumulates K products in f32. The classic worst-case bound for a recursive sum of
//! K products is |err| <= gamma_K * sum_k |x_k w_k|, gamma_K = K u / (1 - K u), u = 2^-24, plus one
//! rounding each for the bias add and the output. We assert every element against its own bound
//! (computed from the same data), with GELU's Lipschitz constant (<= 1.13) and the erf approximation's
//! 1.5e-7 absolute error (times 0.5 |v|) added when the epilogue is on. F16 weights: the reference uses the
//! same f16-rounded weights, so the bound is unchanged. Q8/Q4 weights likewise: the reference multiplies
//! by the dequantized weights (`d * q`, computed on the host from the same bytes), and the kernel's
//! in-register dequantization `d * q` is exact in f32 (|q| <= 127 has 7 significant bits, d is an f16
//! with 11), so only the accumulation order differs.
#![cfg(not(target_arch = "wasm32"))]
use crate::common;

use std::sync::Arc;

use common::{gpu, Rng};
use florence2_wasm::gpu::{readback, DType, Device, DeviceOptions, Recorder, Tensor};
use florence2_wasm::ops::matmul::{self, Act, LinearVariant};
use florence2_wasm::quant;

const U: f64 = 1.0 / (1u64 << 24) as f64;

/// erf in f64: Taylor series for |x| < 2.5 (terms stay below e^6.25, so cancellation costs < 1e-13),
/// the erfc continued fraction beyond (converges fast there).
fn erf64(x: f64) -> f64 {
    let ax = x.abs();
    if ax < 2.5 {
        let mut sum = 0.0;
        let mut term = x; // (-1)^n x^(2n+1) / n!
        let mut n = 0.0;
        loop {
            let add = term / (2.0 * n + 1.0);
            sum += add;
            if add.abs() < 1e-17 * sum.abs().max(1e-300) {
                break;
            }
            n += 1.0;
            term *= -x * x / n;
        }
        return sum * 2.0 / std::f64::consts::PI.sqrt();
    }
    // erfc(x) = exp(-x^2)/sqrt(pi) / (x + (1/2)/(x + (2/2)/(x + (3/2)/(x + ...)))), evaluated backwards.
    let mut f = ax;
    for n in (1..200).rev() {
        f = ax + (n as f64 / 2.0) / f;
    }
    let erfc = (-ax * ax).exp() / std::f64::consts::PI.sqrt() / f;
    x.signum() * (1.0 - erfc)
}

fn gelu64(v: f64) -> f64 {
    0.5 * v * (1.0 + erf64(v / std::f64::consts::SQRT_2))
}

/// Reference linear with per-element error bounds: (values, bounds).
fn linear_ref(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    gelu: bool,
    m: usize,
    n: usize,
    k: usize,
) -> (Vec<f32>, Vec<f64>) {
    let gamma = (k as f64 * U) / (1.0 - k as f64 * U);
    let mut out = vec![0f32; m * n];
    let mut bound = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0f64;
            let mut mag = 0f64;
            for kk in 0..k {
                let p = x[i * k + kk] as f64 * w[j * k + kk] as f64;
                s += p;
                mag += p.abs();
            }
            let mut b = gamma * mag;
            if let Some(bb) = bias {
                s += bb[j] as f64;
            }
            b += 2.0 * U * s.abs() + 1e-30;
            let v = if gelu {
                b = 1.13 * b + 0.5 * 1.5e-7 * s.abs() + U * gelu64(s).abs();
                gelu64(s)
            } else {
                s
            };
            out[i * n + j] = v as f32;
            bound[i * n + j] = b + U * v.abs();
        }
    }
    (out, bound)
}

fn check(name: &str, got: &[f32], want: &[f32], bound: &[f64]) {
    assert_eq!(got.len(), want.len());
    let mut maxd = 0f64;
    let mut worst_ratio = 0f64;
    for (idx, ((&g, &w), &b)) in got.iter().zip(want).zip(bound).enumerate() {
        assert!(g.is_finite(), "{name}: non-finite output at {idx}");
        let d = (g as f64 - w as f64).abs();
        maxd = maxd.max(d);
        worst_ratio = worst_ratio.max(d / b);
        assert!(
            d <= b,
            "{name}: element {idx}: got {g}, want {w}, |diff| {d:e} > bound {b:e}"
        );
    }
    eprintln!("{name}: max |diff| = {maxd:.3e} (worst diff/bound = {worst_ratio:.3})");
}

fn round_f16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()
}

/// Every variant that can run (M, K) with `format` weights on this device (the registry's candidate list,
/// so new variants are tested as soon as they are listed); `None` is the automatic choice.
fn variants(g: &Device, m: usize, k: usize, format: DType) -> Vec<Option<LinearVariant>> {
    let mut v = vec![None];
    for var in LinearVariant::ALL {
        if var.supports(&g.caps, m, k, format) {
            v.push(Some(var));
        } else if !var.supports(&g.caps, 1, 64, format) {
            eprintln!("{var:?} cannot run on this adapter: not tested");
        }
    }
    v
}

#[allow(clippy::too_many_arguments)]
fn run_linear(
    g: &Arc<Device>,
    rng: &mut Rng,
    m: usize,
    n: usize,
    k: usize,
    with_bias: bool,
    act: Act,
    w_dtype: DType,
) {
    for v in variants(g, m, k, w_dtype) {
        run_linear_variant(g, rng, m, n, k, with_bias, act, w_dtype, v);
    }
}

#[allow(clippy::too_many_arguments)]
fn run_linear_variant(
    g: &Arc<Device>,
    rng: &mut Rng,
    m: usize,
    n: usize,
    k: usize,
    with_bias: bool,
    act: Act,
    w_dtype: DType,
    variant: Option<LinearVariant>,
) {
    let x = rng.vec(m * k, 1.0);
    let mut w = rng.vec(n * k, 0.5);
    let bias = rng.vec(n, 1.0);
    let tx = Tensor::from_f32(g, &[m, k], &x, "x").unwrap();
    let tw = match w_dtype {
        DType::F16 => {
            w = round_f16(&w);
            Tensor::from_f32_as_f16(g, &[n, k], &w, "w").unwrap()
        }
        DType::Q8 | DType::Q4 => {
            let fmt = w_dtype.qformat().unwrap();
            let t = Tensor::from_f32_quantized(g, &[n, k], &w, fmt, "w").unwrap();
            let mut bytes = Vec::new();
            quant::quantize_rows(fmt, k, &w, &mut bytes).unwrap();
            w = quant::dequantize_rows(fmt, k, &bytes).unwrap();
            t
        }
        _ => Tensor::from_f32(g, &[n, k], &w, "w").unwrap(),
    };
    let tb = Tensor::from_f32(g, &[n], &bias, "bias").unwrap();
    let to = Tensor::zeros(g, &[m, n], DType::F32, "out").unwrap();
    let mut rec = Recorder::new(g);
    let b = with_bias.then_some(&tb);
    match variant {
        None => matmul::linear(
            &mut rec,
            &tx,
            &tw,
            matmul::LinearArgs::default().bias(b).act(act),
            &to,
        )
        .unwrap(),
        Some(v) => matmul::linear(
            &mut rec,
            &tx,
            &tw,
            matmul::LinearArgs::default().bias(b).act(act).variant(v),
            &to,
        )
        .unwrap(),
    }
    rec.submit().unwrap();
    let got = readback::to_f32_blocking(g, &to).unwrap();
    let (want, bound) = linear_ref(
        &x,
        &w,
        with_bias.then_some(&bias[..]),
        act == Act::Gelu,
        m,
        n,
        k,
    );
    check(
        &format!("linear {variant:?} m={m} n={n} k={k} bias={with_bias} {act:?} {w_dtype:?}"),
        &got,
        &want,
        &bound,
    );
}

#[test]
fn linear_f32_odd_shapes_bias_and_gelu() {
    let g = gpu();
    let mut rng = Rng::new(11);
    // Non-multiples of every tile, degenerate M/N/K, and a decode GEMV.
    for &(m, n, k) in &[
        (1, 1, 1),
        (1, 37, 5),
        (3, 1, 7),
        (70, 67, 1),
        (65, 130, 33),
        (1, 200, 96),
        (5, 9, 3072),
        // K % 8 == 0: the vec4, subgroup and GEMV kernels too. N = 600 spans two workgroup columns of
        // every kernel; M = 17 leaves a partial 8-row block.
        (1, 37, 8),
        (3, 1, 8),
        (4, 70, 64),
        (17, 600, 24),
        (9, 13, 3072),
        // The tiled GEMM: M spans three 64-row (two 128-row) tiles with a ragged last one, N two
        // 64-column tiles, K = 147 (the 7x7x3 conv stem) is no multiple of the 16-wide K slice.
        (130, 129, 147),
        (64, 64, 16),
        // The register-blocked kernels: M = 37 leaves partial 4-, 8- and 16-row blocks, N = 300 spans
        // two 256-column workgroups with a ragged last 4-column group; the padded stem K = 152.
        (37, 300, 152),
    ] {
        run_linear(&g, &mut rng, m, n, k, true, Act::None, DType::F32);
    }
    run_linear(&g, &mut rng, 33, 45, 29, false, Act::None, DType::F32);
    run_linear(&g, &mut rng, 33, 45, 29, true, Act::Gelu, DType::F32);
    run_linear(&g, &mut rng, 2, 45, 64, false, Act::Gelu, DType::F32);
}

#[test]
fn linear_f16_weights() {
    let g = gpu();
    let mut rng = Rng::new(12);
    // Odd K puts rows across u32 word boundaries of the packed f16 pairs.
    for &(m, n, k) in &[
        (1, 1, 1),
        (7, 13, 5),
        (66, 70, 40),
        (1, 130, 768),
        // Decode GEMVs over more output columns than one block-GEMV workgroup covers (32 lanes x 8
        // rows), ragged.
        (3, 300, 64),
        (1, 2061, 64),
        (2, 9, 8),
        (19, 300, 64),
        (130, 70, 147),
    ] {
        run_linear(&g, &mut rng, m, n, k, true, Act::None, DType::F16);
    }
    run_linear(&g, &mut rng, 9, 21, 17, true, Act::Gelu, DType::F16);
    run_linear(&g, &mut rng, 3, 21, 16, true, Act::Gelu, DType::F16);
    run_linear(&g, &mut rng, 12, 21, 16, true, Act::Gelu, DType::F16);
}

/// Block-quantized weights through every kernel variant (GEMM shapes, the decode GEMV with and without
/// subgroups), against the f64 reference on the dequantized weights. K = 32 is one block per row; K = 96
/// an odd number of blocks (scale words half used); K = 768 and 3072 are Florence-2 widths whose scale
/// tail needs padding (q8 row 816 / 3264 bytes).
#[test]
fn linear_quantized_weights() {
    let g = gpu();
    let mut rng = Rng::new(14);
    for dt in [DType::Q8, DType::Q4] {
        for &(m, n, k) in &[
            (1, 1, 32),
            (1, 37, 96),
            (4, 70, 768),
            (3, 9, 3072),
            (1, 300, 96),
            (3, 263, 32),
            // Wide enough for the block GEMV's 32-lane workgroups (>= 2048 columns), ragged.
            (2, 2085, 32),
            (17, 300, 64),
            (66, 70, 96),
        ] {
            run_linear(&g, &mut rng, m, n, k, true, Act::None, dt);
        }
        run_linear(&g, &mut rng, 2, 45, 64, false, Act::Gelu, dt);
        run_linear(&g, &mut rng, 12, 21, 128, true, Act::Gelu, dt);
    }
}

#[test]
fn linear_quantized_refusals() {
    let g = gpu();
    // Rows that are not whole blocks cannot be quantized at all.
    let err = Tensor::zeros(&g, &[4, 48], DType::Q8, "w").unwrap_err();
    assert!(matches!(err, florence2_wasm::Error::Shape { .. }), "{err}");
    let x = Tensor::zeros(&g, &[5, 64], DType::F32, "x").unwrap();
    let w = Tensor::zeros(&g, &[3, 64], DType::Q4, "w").unwrap();
    let out = Tensor::zeros(&g, &[5, 3], DType::F32, "out").unwrap();
    let mut rec = Recorder::new(&g);
    let err = matmul::linear(
        &mut rec,
        &x,
        &w,
        matmul::LinearArgs::default().variant(LinearVariant::Scalar),
        &out,
    )
    .unwrap_err();
    assert!(matches!(err, florence2_wasm::Error::Shape { .. }), "{err}");
}

/// A device whose storage bindings are limited to 64 KiB, so a 100x257 f32 weight (102.8 KB), a
/// 300x257 f16 weight (154 KB) and a 130x256 f32 weight (133 KB) must be split into row chunks.
#[test]
fn linear_weight_larger_than_binding_limit() {
    let g = pollster::block_on(Device::new(DeviceOptions {
        max_storage_binding_size: Some(64 * 1024),
        ..Default::default()
    }))
    .unwrap();
    assert_eq!(g.caps.max_storage_binding, 64 * 1024);
    // The weights really are split (the kernel must place each chunk's columns correctly).
    for (shape, dt) in [([100, 257], DType::F32), ([300, 257], DType::F16)] {
        let w = Tensor::zeros(&g, &shape, dt, "w").unwrap();
        assert!(
            w.row_chunks(&g, 257).unwrap().len() >= 2,
            "{shape:?} {dt:?}"
        );
    }
    let mut rng = Rng::new(13);
    run_linear(&g, &mut rng, 3, 100, 257, true, Act::None, DType::F32);
    run_linear(&g, &mut rng, 1, 300, 257, true, Act::Gelu, DType::F16);
    run_linear(&g, &mut rng, 1, 300, 257, false, Act::None, DType::F32);
    // K % 8 == 0: every variant, with decode and GEMM row counts.
    run_linear(&g, &mut rng, 1, 130, 256, true, Act::None, DType::F32);
    run_linear(&g, &mut rng, 11, 130, 256, true, Act::Gelu, DType::F32);
    run_linear(&g, &mut rng, 3, 300, 256, true, Act::None, DType::F16);
    // Quantized rows split too (q8: 300 rows of 272 bytes = 81.6 KB).
    let w = Tensor::zeros(&g, &[300, 256], DType::Q8, "w").unwrap();
    assert!(w.row_chunks(&g, 256).unwrap().len() >= 2);
    run_linear(&g, &mut rng, 1, 300, 256, true, Act::None, DType::Q8);
    run_linear(&g, &mut rng, 9, 300, 256, true, Act::None, DType::Q8);
}

/// The residual epilogue (out = act(x w^T + b) + residual) through every variant that can run the shape,
/// for every weight format: the reference adds the residual in f64 to the f64 linear, so the bound gains
/// one rounding of the output (u |out|) on top of the linear's own (the kernel adds the f32 residual to
/// the rounded f32 linear result, exactly what the separate elementwise add did).
#[test]
fn linear_residual_every_variant_and_format() {
    let g = gpu();
    let mut rng = Rng::new(15);
    let mut runs = 0;
    for (dt, shapes) in [
        (
            DType::F32,
            &[(37, 300, 64), (3, 70, 32), (130, 129, 147)][..],
        ),
        (DType::F16, &[(37, 300, 64), (2, 9, 17)][..]),
        (DType::Q8, &[(21, 70, 96)][..]),
        (DType::Q4, &[(4, 37, 64)][..]),
    ] {
        for &(m, n, k) in shapes {
            for act in [Act::None, Act::Gelu] {
                for v in variants(&g, m, k, dt) {
                    run_residual(&g, &mut rng, m, n, k, act, dt, v);
                    runs += 1;
                }
            }
        }
    }
    eprintln!("{runs} residual runs");
}

#[allow(clippy::too_many_arguments)]
fn run_residual(
    g: &Arc<Device>,
    rng: &mut Rng,
    m: usize,
    n: usize,
    k: usize,
    act: Act,
    w_dtype: DType,
    variant: Option<LinearVariant>,
) {
    let x = rng.vec(m * k, 1.0);
    let mut w = rng.vec(n * k, 0.5);
    let bias = rng.vec(n, 1.0);
    let res = rng.vec(m * n, 2.0);
    let tw = match w_dtype {
        DType::F16 => {
            w = round_f16(&w);
            Tensor::from_f32_as_f16(g, &[n, k], &w, "w").unwrap()
        }
        DType::Q8 | DType::Q4 => {
            let fmt = w_dtype.qformat().unwrap();
            let t = Tensor::from_f32_quantized(g, &[n, k], &w, fmt, "w").unwrap();
            let mut bytes = Vec::new();
            quant::quantize_rows(fmt, k, &w, &mut bytes).unwrap();
            w = quant::dequantize_rows(fmt, k, &bytes).unwrap();
            t
        }
        _ => Tensor::from_f32(g, &[n, k], &w, "w").unwrap(),
    };
    let tx = Tensor::from_f32(g, &[m, k], &x, "x").unwrap();
    let tb = Tensor::from_f32(g, &[n], &bias, "bias").unwrap();
    let tr = Tensor::from_f32(g, &[m, n], &res, "res").unwrap();
    let to = Tensor::zeros(g, &[m, n], DType::F32, "out").unwrap();
    let mut rec = Recorder::new(g);
    match variant {
        None => matmul::linear(
            &mut rec,
            &tx,
            &tw,
            matmul::LinearArgs::default()
                .bias(Some(&tb))
                .act(act)
                .residual(Some(&tr)),
            &to,
        )
        .unwrap(),
        Some(v) => matmul::linear(
            &mut rec,
            &tx,
            &tw,
            matmul::LinearArgs::default()
                .bias(Some(&tb))
                .act(act)
                .residual(Some(&tr))
                .variant(v),
            &to,
        )
        .unwrap(),
    }
    rec.submit().unwrap();
    let got = readback::to_f32_blocking(g, &to).unwrap();
    let (lin, lin_bound) = linear_ref(&x, &w, Some(&bias), act == Act::Gelu, m, n, k);
    let want: Vec<f32> = lin.iter().zip(&res).map(|(&l, &r)| l + r).collect();
    // |linear_f32 - linear_exact| <= lin_bound (which includes the rounding of linear to f32); the add
    // rounds once more: u |out|. The reference's own f32 sum l + r differs from the exact one by at most
    // u |l + r| as well.
    let bound: Vec<f64> = lin_bound
        .iter()
        .zip(&want)
        .map(|(&b, &o)| b + 2.0 * U * (o as f64).abs() + 1e-30)
        .collect();
    check(
        &format!("linear+residual {variant:?} m={m} n={n} k={k} {act:?} {w_dtype:?}"),
        &got,
        &want,
        &bound,
    );
}

#[test]
fn linear_residual_refusals() {
    let g = gpu();
    let x = Tensor::zeros(&g, &[5, 16], DType::F32, "x").unwrap();
    let w = Tensor::zeros(&g, &[3, 16], DType::F32, "w").unwrap();
    let out = Tensor::zeros(&g, &[5, 3], DType::F32, "out").unwrap();
    let mut rec = Recorder::new(&g);
    // In place (residual = out): two bindings of one buffer, one writable.
    let err = matmul::linear(
        &mut rec,
        &x,
        &w,
        matmul::LinearArgs::default().residual(Some(&out)),
        &out,
    )
    .unwrap_err();
    assert!(
        matches!(err, florence2_wasm::Error::Shape { op: "linear", .. }),
        "{err}"
    );
    // A residual of another shape.
    let r = Tensor::zeros(&g, &[5, 4], DType::F32, "r").unwrap();
    let err = matmul::linear(
        &mut rec,
        &x,
        &w,
        matmul::LinearArgs::default().residual(Some(&r)),
        &out,
    )
    .unwrap_err();
    assert!(matches!(err, florence2_wasm::Error::Shape { .. }), "{err}");
    // An f16 residual.
    let r = Tensor::zeros(&g, &[5, 3], DType::F16, "r").unwrap();
    let err = matmul::linear(
        &mut rec,
        &x,
        &w,
        matmul::LinearArgs::default().residual(Some(&r)),
        &out,
    )
    .unwrap_err();
    assert!(matches!(err, florence2_wasm::Error::Shape { .. }), "{err}");
}

#[test]
fn linear_rejects_bad_shapes() {
    let g = gpu();
    let x = Tensor::zeros(&g, &[2, 3], DType::F32, "x").unwrap();
    let w = Tensor::zeros(&g, &[4, 5], DType::F32, "w").unwrap();
    let out = Tensor::zeros(&g, &[2, 4], DType::F32, "out").unwrap();
    let mut rec = Recorder::new(&g);
    let err = matmul::linear(&mut rec, &x, &w, matmul::LinearArgs::default(), &out).unwrap_err();
    assert!(
        matches!(err, florence2_wasm::Error::Shape { op: "linear", .. }),
        "{err}"
    );
    let w = Tensor::zeros(&g, &[4, 3], DType::F32, "w").unwrap();
    let bias = Tensor::zeros(&g, &[3], DType::F32, "b").unwrap();
    let err = matmul::linear(
        &mut rec,
        &x,
        &w,
        matmul::LinearArgs::default().bias(Some(&bias)),
        &out,
    )
    .unwrap_err();
    assert!(matches!(err, florence2_wasm::Error::Shape { .. }), "{err}");
}

#[test]
fn linear_variant_choice_and_refusals() {
    let g = gpu();
    let c = &g.caps;
    assert_eq!(
        matmul::choose_linear_variant(c, 100, 12),
        LinearVariant::Scalar
    );
    let sg = c.subgroups && c.subgroup_min_size >= 8;
    let gemv = if sg {
        LinearVariant::GemvSubgroup
    } else {
        LinearVariant::Gemv
    };
    assert_eq!(matmul::choose_linear_variant(c, 1, 768), gemv);
    assert_eq!(matmul::choose_linear_variant(c, 4, 768), gemv);
    assert_eq!(matmul::choose_linear_variant(c, 4, 16), LinearVariant::Gemv);
    // Packed weights at decode sizes: the block GEMV on CPU adapters with subgroups (lavapipe); f32,
    // GPUs and adapters without subgroups keep the GEMVs above; K % 32 != 0 cannot take it.
    for dt in [DType::F16, DType::Q8, DType::Q4] {
        let want = if sg && c.is_cpu {
            LinearVariant::GemvBlockSubgroup
        } else {
            gemv
        };
        assert_eq!(matmul::choose_linear_variant_for(c, 1, 768, dt), want);
        assert_eq!(matmul::choose_linear_variant_for(c, 3, 3072, dt), want);
        assert_eq!(
            matmul::choose_linear_variant_for(c, 5, 768, dt),
            matmul::choose_linear_variant(c, 5, 768)
        );
    }
    assert_eq!(
        matmul::choose_linear_variant_for(c, 1, 768, DType::F32),
        gemv
    );
    assert_eq!(
        matmul::choose_linear_variant_for(c, 2, 40, DType::F16),
        LinearVariant::Gemv
    );
    let mut gpu_caps = c.clone();
    gpu_caps.is_cpu = false;
    assert_eq!(
        matmul::choose_linear_variant_for(&gpu_caps, 1, 768, DType::Q4),
        gemv
    );
    // Without subgroups: reg16x8 on CPU adapters (SwiftShader), reg8x8 on GPUs.
    let no_sg_gemm = |cpu: bool| {
        if cpu {
            LinearVariant::Reg16x8
        } else {
            LinearVariant::Reg8x8
        }
    };
    let big = matmul::choose_linear_variant(c, 585, 768);
    if sg {
        assert_eq!(big, LinearVariant::SubgroupC4);
    } else {
        assert_eq!(big, no_sg_gemm(c.is_cpu));
    }
    let mut nosg = c.clone();
    nosg.subgroups = false;
    for cpu in [true, false] {
        nosg.is_cpu = cpu;
        assert_eq!(
            matmul::choose_linear_variant(&nosg, 585, 768),
            no_sg_gemm(cpu)
        );
    }
    assert_eq!(
        matmul::choose_linear_variant(&nosg, 1, 768),
        LinearVariant::Gemv
    );
    // Forced variants refuse shapes they cannot run.
    let x = Tensor::zeros(&g, &[5, 12], DType::F32, "x").unwrap();
    let w = Tensor::zeros(&g, &[3, 12], DType::F32, "w").unwrap();
    let out = Tensor::zeros(&g, &[5, 3], DType::F32, "out").unwrap();
    let mut rec = Recorder::new(&g);
    for v in [LinearVariant::Reg8x8, LinearVariant::Gemv] {
        let err = matmul::linear(
            &mut rec,
            &x,
            &w,
            matmul::LinearArgs::default().variant(v),
            &out,
        )
        .unwrap_err();
        assert!(matches!(err, florence2_wasm::Error::Shape { .. }), "{err}");
    }
}

fn bmm_ref(a: &[f32], b: &[f32], bt: usize, m: usize, k: usize, n: usize) -> (Vec<f32>, Vec<f64>) {
    let gamma = (k as f64 * U) / (1.0 - k as f64 * U);
    let mut out = vec![0f32; bt * m * n];
    let mut bound = vec![0f64; bt * m * n];
    for z in 0..bt {
        for i in 0..m {
            for j in 0..n {
                let mut s = 0f64;
                let mut mag = 0f64;
                for kk in 0..k {
                    let p = a[(z * m + i) * k + kk] as f64 * b[(z * k + kk) * n + j] as f64;
                    s += p;
                    mag += p.abs();
                }
                out[(z * m + i) * n + j] = s as f32;
                bound[(z * m + i) * n + j] = gamma * mag + U * s.abs() + 1e-30;
            }
        }
    }
    (out, bound)
}

#[test]
fn matmul_batched_odd_shapes() {
    let g = gpu();
    let mut rng = Rng::new(21);
    for &(bt, m, k, n) in &[
        (1, 1, 1, 1),
        (3, 5, 7, 9),
        (2, 70, 33, 65),
        (4, 1, 64, 1),
        (1, 3, 3072, 5),
    ] {
        let a = rng.vec(bt * m * k, 1.0);
        let b = rng.vec(bt * k * n, 1.0);
        let ta = Tensor::from_f32(&g, &[bt, m, k], &a, "a").unwrap();
        let tb = Tensor::from_f32(&g, &[bt, k, n], &b, "b").unwrap();
        let to = Tensor::zeros(&g, &[bt, m, n], DType::F32, "out").unwrap();
        let mut rec = Recorder::new(&g);
        matmul::matmul(&mut rec, &ta, &tb, &to).unwrap();
        rec.submit().unwrap();
        let got = readback::to_f32_blocking(&g, &to).unwrap();
        let (want, bound) = bmm_ref(&a, &b, bt, m, k, n);
        check(
            &format!("matmul b={bt} m={m} k={k} n={n}"),
            &got,
            &want,
            &bound,
        );
    }
}

#[test]
fn matmul_rejects_bad_shapes() {
    let g = gpu();
    let a = Tensor::zeros(&g, &[2, 3, 4], DType::F32, "a").unwrap();
    let b = Tensor::zeros(&g, &[2, 5, 6], DType::F32, "b").unwrap();
    let out = Tensor::zeros(&g, &[2, 3, 6], DType::F32, "out").unwrap();
    let mut rec = Recorder::new(&g);
    let err = matmul::matmul(&mut rec, &a, &b, &out).unwrap_err();
    assert!(
        matches!(err, florence2_wasm::Error::Shape { op: "matmul", .. }),
        "{err}"
    );
}

#[test]
fn reference_erf_is_accurate() {
    // Known values (Abramowitz & Stegun table 7.1 / high-precision references).
    for (x, want) in [
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (2.0, 0.995_322_265_018_952_7),
        (3.0, 0.999_977_909_503_001_4),
        (-4.0, -0.999_999_984_582_742_1),
    ] {
        assert!((erf64(x) - want).abs() < 1e-13, "erf({x}) = {}", erf64(x));
    }
}

/// `LinearArgs::per_row`: a row's result does not depend on M. Every variant that runs one row (the
/// decode GEMVs too, whose M > 4 goes in row groups along grid z), every weight format, with bias and
/// residual: M = 1..=9 rows in one call equal, bit for bit, each row run alone (the batched decoder's
/// answers are bit-identical to unbatched ones because of this). Any tolerance would hide the bug this
/// test exists for, hence exact equality.
#[test]
fn linear_per_row_results_do_not_depend_on_m() {
    let g = gpu();
    let (n, k) = (75, 64);
    let mut rng = Rng::new(4242);
    for format in [DType::F32, DType::F16, DType::Q8, DType::Q4] {
        let w = rng.vec(n * k, 0.5);
        let tw = match format.qformat() {
            Some(q) => Tensor::from_f32_quantized(&g, &[n, k], &w, q, "w").unwrap(),
            None if format == DType::F16 => Tensor::from_f32_as_f16(&g, &[n, k], &w, "w").unwrap(),
            None => Tensor::from_f32(&g, &[n, k], &w, "w").unwrap(),
        };
        let tb = Tensor::from_f32(&g, &[n], &rng.vec(n, 1.0), "bias").unwrap();
        for v in variants(&g, 1, k, format) {
            for m in 1..=9usize {
                let x = rng.vec(m * k, 1.0);
                let res = rng.vec(m * n, 1.0);
                let run = |x: &[f32], res: &[f32], rows: usize| {
                    let tx = Tensor::from_f32(&g, &[rows, k], x, "x").unwrap();
                    let tr = Tensor::from_f32(&g, &[rows, n], res, "res").unwrap();
                    let to = Tensor::zeros(&g, &[rows, n], DType::F32, "out").unwrap();
                    let mut args = matmul::LinearArgs::default()
                        .bias(Some(&tb))
                        .act(Act::Gelu)
                        .residual(Some(&tr))
                        .per_row();
                    if let Some(v) = v {
                        args = args.variant(v);
                    }
                    let mut rec = Recorder::new(&g);
                    matmul::linear(&mut rec, &tx, &tw, args, &to).unwrap();
                    rec.submit().unwrap();
                    readback::to_f32_blocking(&g, &to).unwrap()
                };
                let all = run(&x, &res, m);
                for r in 0..m {
                    let one = run(&x[r * k..(r + 1) * k], &res[r * n..(r + 1) * n], 1);
                    let got = &all[r * n..(r + 1) * n];
                    let same = got
                        .iter()
                        .zip(&one)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{v:?} {format:?}: row {r} of M = {m} differs from the row alone"
                    );
                }
            }
        }
    }
}
