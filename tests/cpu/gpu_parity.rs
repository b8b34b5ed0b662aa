//! The two backends on the same inputs: a few CPU kernels next to their GPU kernels (lavapipe in CI),
//! for a q4 linear on both paths (GEMV and GEMM) with its epilogue, a causal attention over f16 K/V,
//! channel attention, the stem convolution and a LayerNorm.
//!
//! Tolerance: each backend is within its own bound of the same f64 reference (the other modules and
//! tests/kernels/*.rs state them), so the two differ by at most twice that bound.

use florence2_wasm::cpu;
use florence2_wasm::cpu::conv::ConvGeom;
use florence2_wasm::gpu::{DType, Tensor};
use florence2_wasm::ops;
use florence2_wasm::ops::matmul::Act;
use florence2_wasm::quant::{dequantize_rows, quantize_rows, QFormat};

use crate::common::{assert_close, gpu, run_f32, tf32, zf32, Rng};
use crate::{check_bounds, U};

#[test]
fn q4_linear_gemv_and_gemm() {
    let g = gpu();
    for m in [3, 9] {
        let c = crate::linear::Case::new(60 + m as u64, (m, 48, 96), true, Act::Gelu, false);
        let (n, k) = (48, 96);
        let mut bytes = Vec::new();
        quantize_rows(QFormat::Q4, k, &c.w, &mut bytes).unwrap();
        let cpu_out = c.run(cpu::Weight::Quant(QFormat::Q4, &bytes));
        let (_, bound) = c.reference(&dequantize_rows(QFormat::Q4, k, &bytes).unwrap());
        let tw = Tensor::from_f32_quantized(&g, &[n, k], &c.w, QFormat::Q4, "w").unwrap();
        let (tx, tb, to) = (
            tf32(&g, &[m, k], &c.x),
            tf32(&g, &[n], c.bias.as_deref().unwrap()),
            zf32(&g, &[m, n]),
        );
        let gpu_out = run_f32(&g, &to, |r| {
            ops::matmul::linear(
                r,
                &tx,
                &tw,
                ops::matmul::LinearArgs::default()
                    .bias(Some(&tb))
                    .act(Act::Gelu),
                &to,
            )
            .unwrap()
        });
        let twice: Vec<f64> = bound.iter().map(|b| 2.0 * b).collect();
        check_bounds(
            &format!("q4 linear M{m}: CPU vs GPU"),
            &cpu_out,
            &gpu_out,
            &twice,
        );
    }
}

#[test]
fn causal_attention_over_f16_kv() {
    let g = gpu();
    let mut c = crate::attention::Case::new(2, 6, 24, 2, 16);
    c.causal = true;
    c.q_offset = 9;
    c.kv_len = Some(15);
    let (q, k, v, m) = c.data(81);
    let (cpu_out, ..) = c.run(&q, &k, &v, &m, true);
    let hd = c.heads * c.d;
    let tq = tf32(&g, &[c.b, c.tq, hd], &q);
    let tk = Tensor::from_f32_as_f16(&g, &[c.b, c.tk, hd], &k, "k").unwrap();
    let tv = Tensor::from_f32_as_f16(&g, &[c.b, c.tk, hd], &v, "v").unwrap();
    assert_eq!(tk.dtype(), DType::F16);
    let to = zf32(&g, &[c.b, c.tq, hd]);
    let opts = ops::attention::AttnOpts {
        heads: c.heads,
        scale: c.scale(),
        causal: true,
        kv_len: Some(15),
        q_offset: 9,
        mask: None,
        ..Default::default()
    };
    let gpu_out = run_f32(&g, &to, |r| {
        ops::attention::attention(r, &tq, &tk, &tv, &opts, &to).unwrap()
    });
    assert_close(
        "causal attention f16 K/V: CPU vs GPU",
        &cpu_out,
        &gpu_out,
        2.0 * crate::attention::TOL,
    );
}

#[test]
fn channel_attention_stem_conv_and_layer_norm() {
    let g = gpu();
    let (b, n, ch, groups) = (1, 64, 64, 2);
    let qkv = Rng::new(90).vec(b * n * 3 * ch, 1.0);
    let (_, tol) = crate::channel_attn::channel_ref(&qkv, (b, n, ch), groups);
    let mut cpu_out = vec![0f32; b * n * ch];
    cpu::channel_attn::channel_attention(&qkv, (b, n, ch), groups, &mut cpu_out).unwrap();
    let (tqkv, to) = (tf32(&g, &[b, n, 3 * ch], &qkv), zf32(&g, &[b, n, ch]));
    let gpu_out = run_f32(&g, &to, |r| {
        ops::channel_attn::channel_attention(r, &tqkv, groups, &to).unwrap()
    });
    assert_close(
        "channel attention: CPU vs GPU",
        &cpu_out,
        &gpu_out,
        (2.0 * tol) as f32,
    );

    let geom = ConvGeom {
        cin: 3,
        kh: 7,
        kw: 7,
        stride: 4,
        pad: 3,
    };
    let (h, w, cout) = (23, 17, 8);
    let mut rng = Rng::new(91);
    let (x, wt, bias) = (
        rng.vec(h * w * 3, 1.0),
        rng.vec(cout * 147, 0.5),
        rng.vec(cout, 0.5),
    );
    let (_, bound) = crate::conv::conv_ref(&x, (1, h, w), &wt, &bias, geom);
    let mut cpu_out = vec![0f32; bound.len()];
    let (ho, wo) = cpu::conv::conv2d(
        &x,
        (1, h, w),
        cpu::Weight::F32(&wt),
        &bias,
        geom,
        &mut cpu_out,
    )
    .unwrap();
    let (tx, tw, tb) = (
        tf32(&g, &[1, h, w, 3], &x),
        tf32(&g, &[cout, 3, 7, 7], &wt),
        tf32(&g, &[cout], &bias),
    );
    let to = zf32(&g, &[1, ho, wo, cout]);
    let gpu_out = run_f32(&g, &to, |r| {
        ops::conv::conv2d(
            r,
            &tx,
            ops::conv::Conv2dWeight::Checkpoint(&tw),
            &tb,
            ops::conv::Conv2dArgs::new(4, 3),
            &to,
        )
        .unwrap()
    });
    let twice: Vec<f64> = bound.iter().map(|b| 2.0 * b + 4.0 * U).collect();
    check_bounds("stem conv2d: CPU vs GPU", &cpu_out, &gpu_out, &twice);

    let (rows, c) = (7, 768);
    let x: Vec<f32> = rng.vec(rows * c, 1.0).iter().map(|v| v + 3.0).collect();
    let (gm, bt) = (rng.vec(c, 1.0), rng.vec(c, 1.0));
    let mut cpu_out = vec![0f32; x.len()];
    cpu::norm::layer_norm(&x, &gm, &bt, 1e-5, &mut cpu_out).unwrap();
    let (tx, tg, tbt, to) = (
        tf32(&g, &[rows, c], &x),
        tf32(&g, &[c], &gm),
        tf32(&g, &[c], &bt),
        zf32(&g, &[rows, c]),
    );
    let gpu_out = run_f32(&g, &to, |r| {
        ops::norm::layer_norm(r, &tx, &tg, &tbt, 1e-5, &to).unwrap()
    });
    assert_close("layer_norm: CPU vs GPU", &cpu_out, &gpu_out, 2e-5);
}
