//! `cpu::conv`: the dense conv2d (DaViT's k7 s4 p3 stem and k3 s2 p1 patch embeddings, f32 and f16
//! weights, a case over several im2col chunks) and the depthwise 3x3 with its residual, against an f64
//! convolution.
//!
//! Tolerance (as tests/kernels/conv.rs): each output is K = Cin*kh*kw products plus a bias; any f32
//! summation order satisfies |fl(s) - s| <= gamma_{K+1} (sum |x_i w_i| + |b|), checked per element
//! with (K + 2) u sum|terms| + u |s|. dwconv3x3_residual: 9 products + bias + residual, K = 11.

use florence2_wasm::cpu::conv::{conv2d, dwconv3x3_residual, dwconv3x3_taps, ConvGeom};
use florence2_wasm::cpu::Weight;
use half::f16;

use crate::common::Rng;
use crate::{check_bounds, U};

/// (out (B, Ho, Wo, Cout), bounds) of a dense conv; weight (Cout, Cin, kh, kw).
pub fn conv_ref(
    x: &[f32],
    (b, h, w): (usize, usize, usize),
    wt: &[f32],
    bias: &[f32],
    g: ConvGeom,
) -> (Vec<f32>, Vec<f64>) {
    let cout = bias.len();
    let ho = (h + 2 * g.pad - g.kh) / g.stride + 1;
    let wo = (w + 2 * g.pad - g.kw) / g.stride + 1;
    let k = g.cin * g.kh * g.kw;
    let (mut out, mut bound) = (
        vec![0f32; b * ho * wo * cout],
        vec![0f64; b * ho * wo * cout],
    );
    for bi in 0..b {
        for oy in 0..ho {
            for ox in 0..wo {
                for co in 0..cout {
                    let (mut s, mut abs) = (bias[co] as f64, (bias[co] as f64).abs());
                    for ci in 0..g.cin {
                        for ky in 0..g.kh {
                            for kx in 0..g.kw {
                                let iy = (oy * g.stride + ky) as isize - g.pad as isize;
                                let ix = (ox * g.stride + kx) as isize - g.pad as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                    continue;
                                }
                                let p = x[((bi * h + iy as usize) * w + ix as usize) * g.cin + ci]
                                    as f64
                                    * wt[((co * g.cin + ci) * g.kh + ky) * g.kw + kx] as f64;
                                s += p;
                                abs += p.abs();
                            }
                        }
                    }
                    let o = ((bi * ho + oy) * wo + ox) * cout + co;
                    out[o] = s as f32;
                    bound[o] = (k + 2) as f64 * U * abs + U * s.abs() + 1e-30;
                }
            }
        }
    }
    (out, bound)
}

#[test]
fn conv2d_matches_the_f64_convolution() {
    let stem = ConvGeom {
        cin: 3,
        kh: 7,
        kw: 7,
        stride: 4,
        pad: 3,
    };
    let down = ConvGeom {
        cin: 8,
        kh: 3,
        kw: 3,
        stride: 2,
        pad: 1,
    };
    // (B, H, W), Cout, geometry; the last has more output pixels than one 8 MiB im2col chunk.
    for (seed, ((b, h, w), cout, g)) in [
        ((2, 19, 23), 8, stem),
        ((1, 9, 10), 16, down),
        ((1, 480, 480), 2, stem),
    ]
    .into_iter()
    .enumerate()
    {
        let mut rng = Rng::new(seed as u64 + 20);
        let x = rng.vec(b * h * w * g.cin, 1.0);
        let wt = rng.vec(cout * g.cin * g.kh * g.kw, 0.5);
        let bias = rng.vec(cout, 0.5);
        let wh: Vec<f16> = wt.iter().map(|&v| f16::from_f32(v)).collect();
        let wr: Vec<f32> = wh.iter().map(|v| v.to_f32()).collect();
        for (name, weight, wref) in [
            ("f32", Weight::F32(&wt), &wt),
            ("f16", Weight::F16(&wh), &wr),
        ] {
            let (want, bound) = conv_ref(&x, (b, h, w), wref, &bias, g);
            let mut got = vec![f32::NAN; want.len()];
            let (ho, wo) = conv2d(&x, (b, h, w), weight, &bias, g, &mut got).unwrap();
            assert_eq!(b * ho * wo * cout, want.len());
            check_bounds(
                &format!("conv2d {name} {g:?} on ({b}, {h}, {w})"),
                &got,
                &want,
                &bound,
            );
        }
    }
    let g = ConvGeom {
        cin: 3,
        kh: 7,
        kw: 7,
        stride: 4,
        pad: 3,
    };
    // x of 11 values for (1, 2, 2, 3); a 7x7 kernel over a 1x1 image without padding.
    let w = [0f32; 147];
    let r = conv2d(
        &[0.0; 11],
        (1, 2, 2),
        Weight::F32(&w),
        &[0.0],
        g,
        &mut [0.0; 1],
    );
    assert!(r.is_err());
    let g0 = ConvGeom { pad: 0, ..g };
    let r = conv2d(
        &[0.0; 3],
        (1, 1, 1),
        Weight::F32(&w),
        &[0.0],
        g0,
        &mut [0.0; 1],
    );
    assert!(r.is_err());
}

#[test]
fn depthwise_conv_residual_matches_the_f64_convolution() {
    for (seed, (b, h, w, c)) in [(1, 5, 7, 8), (2, 12, 12, 32), (1, 1, 1, 3)]
        .into_iter()
        .enumerate()
    {
        let mut rng = Rng::new(seed as u64 + 30);
        let x = rng.vec(b * h * w * c, 1.0);
        let wt = rng.vec(c * 9, 0.5);
        let bias = rng.vec(c, 0.5);
        let mut want = vec![0f32; x.len()];
        let mut bound = vec![0f64; x.len()];
        for bi in 0..b {
            for y in 0..h {
                for xx in 0..w {
                    for ch in 0..c {
                        let i = ((bi * h + y) * w + xx) * c + ch;
                        let (mut s, mut abs) = (
                            bias[ch] as f64 + x[i] as f64,
                            (bias[ch] as f64).abs() + (x[i] as f64).abs(),
                        );
                        for ky in 0..3 {
                            for kx in 0..3 {
                                let (iy, ix) = (y as isize + ky - 1, xx as isize + kx - 1);
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                    continue;
                                }
                                let p = wt[ch * 9 + (ky * 3 + kx) as usize] as f64
                                    * x[((bi * h + iy as usize) * w + ix as usize) * c + ch] as f64;
                                s += p;
                                abs += p.abs();
                            }
                        }
                        want[i] = s as f32;
                        bound[i] = 13.0 * U * abs + U * s.abs() + 1e-30;
                    }
                }
            }
        }
        let taps = dwconv3x3_taps(&wt, c).unwrap();
        let mut got = vec![f32::NAN; x.len()];
        dwconv3x3_residual(&x, (b, h, w, c), &taps, &bias, &mut got).unwrap();
        check_bounds(
            &format!("dwconv3x3_residual ({b}, {h}, {w}, {c})"),
            &got,
            &want,
            &bound,
        );
    }
}
