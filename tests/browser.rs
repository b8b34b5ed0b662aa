//! Browser tests: run with `wasm-pack test --headless --chrome -- --test browser` (scripts/test.sh).
//! They run the kernels on the browser's WebGPU (SwiftShader in headless Chromium), proving that every
//! shader validates and runs under the browser's limits (256 invocations per workgroup, 10 storage buffers
//! per stage, no shader-f16, no subgroups through wgpu's WebGPU backend), and compare against the same CPU
//! references the native tests use. Natively this file compiles to nothing.
#![cfg(target_arch = "wasm32")]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use florence2_wasm::gpu::{readback, DType, Device, DeviceOptions, Recorder, Tensor};
use florence2_wasm::ops;
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

async fn gpu() -> Arc<Device> {
    Device::new(DeviceOptions::default())
        .await
        .expect("WebGPU adapter (Chromium needs --enable-unsafe-webgpu)")
}

fn rand_vec(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            ((s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[wasm_bindgen_test]
async fn browser_adapter_reports_limits() {
    let g = gpu().await;
    web_sys::console::log_1(&g.describe().into());
    assert!(g.caps.max_invocations >= 256);
    assert!(
        !g.caps.subgroups,
        "wgpu's WebGPU backend exposes no subgroups"
    );
}

#[wasm_bindgen_test]
async fn browser_add() {
    let g = gpu().await;
    let n = 1000;
    let a = rand_vec(1, n);
    let b = rand_vec(2, n);
    let ta = Tensor::from_f32(&g, &[n], &a, "a").unwrap();
    let tb = Tensor::from_f32(&g, &[n], &b, "b").unwrap();
    let to = Tensor::zeros(&g, &[n], DType::F32, "o").unwrap();
    let mut rec = Recorder::new(&g);
    ops::elementwise::add(&mut rec, &ta, &tb, &to).unwrap();
    rec.submit().unwrap();
    let got = readback::to_f32(&g, &to).await.unwrap();
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert_eq!(max_diff(&got, &want), 0.0);
}

/// `Device::finished()` (what every stage's timing awaits before it reads the clock: `Stopwatch::ms_after_gpu`)
/// resolves only once the queue has finished the work submitted before it. The queue's own
/// `onSubmittedWorkDone` callback, registered first, has run by then (WebGPU resolves them in order); a
/// `finished()` that returned at once (timing the submission, not the GPU's work) would beat it, since
/// the queue answers no sooner than a later task.
#[wasm_bindgen_test]
async fn browser_finished_waits_for_the_submitted_work() {
    let g = gpu().await;
    let n = 1 << 20;
    let a = rand_vec(3, n);
    let ta = Tensor::from_f32(&g, &[n], &a, "a").unwrap();
    let to = Tensor::zeros(&g, &[n], DType::F32, "o").unwrap();
    let mut rec = Recorder::new(&g);
    for _ in 0..8 {
        ops::elementwise::add(&mut rec, &ta, &ta, &to).unwrap();
    }
    rec.submit().unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let flag = done.clone();
    g.wgpu()
        .unwrap()
        .queue
        .on_submitted_work_done(move || flag.store(true, Ordering::SeqCst));
    assert!(
        !done.load(Ordering::SeqCst),
        "the queue answered synchronously"
    );
    g.finished().await.unwrap();
    assert!(
        done.load(Ordering::SeqCst),
        "finished() resolved before the submitted work was done"
    );
}

// ---- DaViT kernels (vision) --------------------------------------------------------------------------
// The native tests (tests/kernels/: conv, window, channel_attn, window_attn, pos_embed) hold the rigorous per-output
// rounding bounds; here the point is that every vision shader (scalar and vec4 entries) validates and runs
// under the browser's limits, against f64 references with a tolerance of 1e-5: every output here is a
// short sum (<= 147 terms) of products of values in [-1, 1] scaled to O(1) results, whose f32 rounding
// error is below 147 * 2^-24 * 147^0.5 ~ 1e-4 in the worst case and ~1e-6 in practice.

async fn run_vec(g: &Arc<Device>, t: &Tensor) -> Vec<f32> {
    readback::to_f32(g, t).await.unwrap()
}

#[wasm_bindgen_test]
async fn browser_conv2d_and_dwconv() {
    let g = gpu().await;
    // conv2d 7x7 s4 p3, 3 -> 8 channels, 13x10 image.
    let (h, w, cin, cout, k, s, p) = (13usize, 10usize, 3usize, 8usize, 7usize, 4usize, 3usize);
    let x = rand_vec(11, h * w * cin);
    let wt: Vec<f32> = rand_vec(12, cout * cin * k * k)
        .iter()
        .map(|v| v * 0.1)
        .collect();
    let b = rand_vec(13, cout);
    let (ho, wo) = ((h + 2 * p - k) / s + 1, (w + 2 * p - k) / s + 1);
    let mut want = vec![0f32; ho * wo * cout];
    for oy in 0..ho {
        for ox in 0..wo {
            for co in 0..cout {
                let mut acc = b[co] as f64;
                for ci in 0..cin {
                    for ky in 0..k {
                        for kx in 0..k {
                            let iy = (oy * s + ky) as isize - p as isize;
                            let ix = (ox * s + kx) as isize - p as isize;
                            if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                continue;
                            }
                            acc += x[((iy as usize) * w + ix as usize) * cin + ci] as f64
                                * wt[((co * cin + ci) * k + ky) * k + kx] as f64;
                        }
                    }
                }
                want[(oy * wo + ox) * cout + co] = acc as f32;
            }
        }
    }
    let tx = Tensor::from_f32(&g, &[1, h, w, cin], &x, "x").unwrap();
    let tw = Tensor::from_f32(&g, &[cout, cin, k, k], &wt, "w").unwrap();
    let tb = Tensor::from_f32(&g, &[cout], &b, "b").unwrap();
    let to = Tensor::zeros(&g, &[1, ho, wo, cout], DType::F32, "o").unwrap();
    // dwconv3x3_residual on the conv output (vec4 path, C = 8) and on the input (scalar path, C = 3).
    let dw8 = rand_vec(14, cout * 9);
    let dw3 = rand_vec(15, cin * 9);
    let t8 = Tensor::from_f32(&g, &[cout, 1, 3, 3], &dw8, "dw8").unwrap();
    let t3 = Tensor::from_f32(&g, &[cin, 1, 3, 3], &dw3, "dw3").unwrap();
    let tb3 = Tensor::from_f32(&g, &[cin], &b[..cin], "b3").unwrap();
    let o8 = Tensor::zeros(&g, &[1, ho, wo, cout], DType::F32, "o8").unwrap();
    let o3 = Tensor::zeros(&g, &[1, h, w, cin], DType::F32, "o3").unwrap();
    let mut rec = Recorder::new(&g);
    ops::conv::conv2d(
        &mut rec,
        &tx,
        ops::conv::Conv2dWeight::Checkpoint(&tw),
        &tb,
        ops::conv::Conv2dArgs::new(s, p),
        &to,
    )
    .unwrap();
    ops::conv::dwconv3x3_residual(&mut rec, &to, &t8, &tb, &o8).unwrap();
    ops::conv::dwconv3x3_residual(&mut rec, &tx, &t3, &tb3, &o3).unwrap();
    rec.submit().unwrap();
    let got = run_vec(&g, &to).await;
    assert!(
        max_diff(&got, &want) <= 1e-5,
        "conv2d {}",
        max_diff(&got, &want)
    );
    let dw_ref = |inp: &[f32], hh: usize, ww: usize, c: usize, wts: &[f32], bias: &[f32]| {
        let mut out = vec![0f32; inp.len()];
        for y in 0..hh {
            for xx in 0..ww {
                for ch in 0..c {
                    let mut acc = inp[(y * ww + xx) * c + ch] as f64 + bias[ch] as f64;
                    for ky in 0..3 {
                        for kx in 0..3 {
                            let (iy, ix) = (y as isize + ky - 1, xx as isize + kx - 1);
                            if iy < 0 || ix < 0 || iy >= hh as isize || ix >= ww as isize {
                                continue;
                            }
                            acc += inp[((iy as usize) * ww + ix as usize) * c + ch] as f64
                                * wts[ch * 9 + (ky * 3 + kx) as usize] as f64;
                        }
                    }
                    out[(y * ww + xx) * c + ch] = acc as f32;
                }
            }
        }
        out
    };
    let got8 = run_vec(&g, &o8).await;
    let want8 = dw_ref(&got, ho, wo, cout, &dw8, &b);
    assert!(
        max_diff(&got8, &want8) <= 1e-5,
        "dwconv vec4 {}",
        max_diff(&got8, &want8)
    );
    let got3 = run_vec(&g, &o3).await;
    let want3 = dw_ref(&x, h, w, cin, &dw3, &b[..cin]);
    assert!(
        max_diff(&got3, &want3) <= 1e-5,
        "dwconv {}",
        max_diff(&got3, &want3)
    );
}

#[wasm_bindgen_test]
async fn browser_window_ops_and_window_attention() {
    let g = gpu().await;
    // 5x7 image, ws 3 (padding on both axes), C = 8 (vec4) and C = 3 (scalar): round trips are exact.
    for (c, seed) in [(8usize, 21u64), (3, 22)] {
        let (h, w, ws) = (5usize, 7usize, 3usize);
        let x = rand_vec(seed, h * w * c);
        let nw = h.div_ceil(ws) * w.div_ceil(ws);
        let tx = Tensor::from_f32(&g, &[1, h, w, c], &x, "x").unwrap();
        let tp = Tensor::zeros(&g, &[nw, ws * ws, c], DType::F32, "win").unwrap();
        let tr = Tensor::zeros(&g, &[1, h, w, c], DType::F32, "back").unwrap();
        let mut rec = Recorder::new(&g);
        ops::window::window_partition(&mut rec, &tx, ws, &tp).unwrap();
        ops::window::window_reverse(&mut rec, &tp, ws, h, w, &tr).unwrap();
        rec.submit().unwrap();
        let win = run_vec(&g, &tp).await;
        // Window 0, token (1, 2) is pixel (1, 2); the last window's last token is padding (zero).
        assert_eq!(win[(5) * c], x[(w + 2) * c]);
        assert_eq!(win[(nw * ws * ws - 1) * c], 0.0);
        assert_eq!(max_diff(&run_vec(&g, &tr).await, &x), 0.0);
    }
    // Fused window attention: 2 windows x 9 tokens, 2 heads of 8.
    let (nw, t, c, heads) = (2usize, 9usize, 16usize, 2usize);
    let qkv = rand_vec(23, nw * t * 3 * c);
    let d = c / heads;
    let scale = (d as f64).powf(-0.5);
    let at = |wi: usize, tok: usize, col: usize| qkv[(wi * t + tok) * 3 * c + col] as f64;
    let mut want = vec![0f32; nw * t * c];
    for wi in 0..nw {
        for hh in 0..heads {
            for i in 0..t {
                let sc: Vec<f64> = (0..t)
                    .map(|j| {
                        (0..d)
                            .map(|e| at(wi, i, hh * d + e) * at(wi, j, c + hh * d + e))
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let mx = sc.iter().cloned().fold(f64::MIN, f64::max);
                let ex: Vec<f64> = sc.iter().map(|v| (v - mx).exp()).collect();
                let sum: f64 = ex.iter().sum();
                for e in 0..d {
                    let o: f64 = (0..t)
                        .map(|j| ex[j] / sum * at(wi, j, 2 * c + hh * d + e))
                        .sum();
                    want[(wi * t + i) * c + hh * d + e] = o as f32;
                }
            }
        }
    }
    let tq = Tensor::from_f32(&g, &[nw, t, 3 * c], &qkv, "qkv").unwrap();
    let to = Tensor::zeros(&g, &[nw, t, c], DType::F32, "o").unwrap();
    let mut rec = Recorder::new(&g);
    ops::window_attn::window_attention(&mut rec, &tq, heads, scale as f32, &to).unwrap();
    rec.submit().unwrap();
    let got = run_vec(&g, &to).await;
    assert!(
        max_diff(&got, &want) <= 1e-5,
        "window_attention {}",
        max_diff(&got, &want)
    );
}

/// f64 attention over accessors: out[b][i][h*d + e] = sum_j softmax_j(scale * q.k + mask) v, key j
/// visible to row i iff `visible(i, j)` and the masked score is finite; a row with no key gives zeros.
#[allow(clippy::too_many_arguments)]
fn attention_ref(
    (b, tq, tk, heads, d): (usize, usize, usize, usize, usize),
    scale: f64,
    q: impl Fn(usize, usize, usize) -> f64,
    k: impl Fn(usize, usize, usize) -> f64,
    v: impl Fn(usize, usize, usize) -> f64,
    visible: impl Fn(usize, usize) -> bool,
    mask: Option<&[f32]>,
) -> Vec<f32> {
    let mut out = vec![0f32; b * tq * heads * d];
    for bi in 0..b {
        for h in 0..heads {
            for i in 0..tq {
                let sc: Vec<Option<f64>> = (0..tk)
                    .map(|j| {
                        if !visible(i, j) {
                            return None;
                        }
                        let mut s: f64 = (0..d)
                            .map(|e| q(bi, i, h * d + e) * k(bi, j, h * d + e))
                            .sum::<f64>()
                            * scale;
                        if let Some(m) = mask {
                            s += m[i * tk + j] as f64;
                        }
                        s.is_finite().then_some(s)
                    })
                    .collect();
                let mx = sc.iter().flatten().cloned().fold(f64::MIN, f64::max);
                let ex: Vec<f64> = sc
                    .iter()
                    .map(|s| s.map(|s| (s - mx).exp()).unwrap_or(0.0))
                    .collect();
                let sum: f64 = ex.iter().sum();
                for e in 0..d {
                    let o: f64 = (0..tk)
                        .filter(|&j| ex[j] != 0.0)
                        .map(|j| ex[j] * v(bi, j, h * d + e))
                        .sum();
                    out[(bi * tq + i) * heads * d + h * d + e] =
                        if sum > 0.0 { (o / sum) as f32 } else { 0.0 };
                }
            }
        }
    }
    out
}

// Every attention variant the browser's adapter supports (tiled, rows, flash, flash_split; window: rows,
// flash),
// forced, against the f64 reference. Tolerance 2e-6 absolute, as natively (tests/kernels/attention.rs):
// outputs are convex combinations of v in [-1, 1]; scores of magnitude <= ~4 from <= 64-term f32 dot
// products carry ~sqrt(D) * 2^-24 * 4 ~ 2e-6 of rounding, and the online softmax (per key, per tile, or
// per tile plus the flash kernel's merge of split rows) reorders the sums; a wrong mask, tile edge or
// merge changes outputs by O(0.1).
// Every case also runs with K/V packed in f16 (the `KV_F16` variants: the decoder's caches and cross K/V
// for non-fp32 weights) against the reference on the f16-rounded K/V (widening is exact: same
// tolerance), and the cases over a cache also through the `DYN_LEN` variants (kv_len and q_offset read
// from a buffer, as the planned decode step does), with f32 and f16 K/V.
#[wasm_bindgen_test]
async fn browser_attention_every_variant() {
    use ops::attention::{attention, AttnOpts, AttnVariant};
    use ops::window_attn::{window_attention_variant, WindowAttnVariant};
    let g = gpu().await;
    // (B, Bk, Tq, Tk, H, D, causal, kv_len, q_offset, mask)
    let cases = [
        (
            1usize, 1usize, 70usize, 61usize, 2usize, 64usize, false, None, 0usize, true,
        ), // encoder: 2 row blocks, ragged key tiles, mask
        (3, 1, 1, 45, 2, 64, false, None, 0, false), // decoder cross-attention, K/V shared by 3 rows
        (2, 2, 1, 40, 2, 32, true, Some(23usize), 22, false), // decoder self-attention over a cache
        (1, 1, 9, 40, 1, 16, true, Some(34), 25, false), // causal block ending inside a tile
    ];
    let mut ran = 0;
    for (ci, &(b, bk, tq, tk, heads, d, causal, kv_len, q_offset, masked)) in
        cases.iter().enumerate()
    {
        let hd = heads * d;
        let seed = 40 + ci as u64 * 4;
        let q: Vec<f32> = rand_vec(seed, b * tq * hd)
            .iter()
            .map(|x| x * 2.0)
            .collect();
        let k32: Vec<f32> = rand_vec(seed + 1, bk * tk * hd)
            .iter()
            .map(|x| x * 2.0)
            .collect();
        let v32 = rand_vec(seed + 2, bk * tk * hd);
        let mask: Option<Vec<f32>> = masked.then(|| {
            rand_vec(seed + 3, tq * tk)
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    if i % 7 == 3 && i % tk != 0 {
                        f32::NEG_INFINITY
                    } else {
                        x * 3.0
                    }
                })
                .collect()
        });
        let scale = (d as f64).powf(-0.5);
        let kvl = kv_len.unwrap_or(tk);
        let kb = |bi: usize| if bk == 1 { 0 } else { bi };
        let tq_ = Tensor::from_f32(&g, &[b, tq, hd], &q, "q").unwrap();
        let tm = mask
            .as_ref()
            .map(|m| Tensor::from_f32(&g, &[tq, tk], m, "mask").unwrap());
        // [kv_len, q_offset] for the DYN_LEN variants.
        let dyn_len = Tensor::from_u32(&g, &[2], &[kvl as u32, q_offset as u32], "dyn").unwrap();
        for f16 in [false, true] {
            let round = |x: &[f32]| -> Vec<f32> {
                match f16 {
                    true => x.iter().map(|&a| half::f16::from_f32(a).to_f32()).collect(),
                    false => x.to_vec(),
                }
            };
            let (k, v) = (round(&k32), round(&v32));
            let want = attention_ref(
                (b, tq, tk, heads, d),
                scale,
                |bi, i, col| (q[(bi * tq + i) * hd + col] * scale as f32) as f64 / scale,
                |bi, j, col| k[(kb(bi) * tk + j) * hd + col] as f64,
                |bi, j, col| v[(kb(bi) * tk + j) * hd + col] as f64,
                |i, j| j < kvl && (!causal || j <= q_offset + i),
                mask.as_deref(),
            );
            let upload = |x: &[f32], label: &str| match f16 {
                true => Tensor::from_f32_as_f16(&g, &[bk, tk, hd], x, label).unwrap(),
                false => Tensor::from_f32(&g, &[bk, tk, hd], x, label).unwrap(),
            };
            let (tk_, tv_) = (upload(&k, "k"), upload(&v, "v"));
            let opts = AttnOpts {
                heads,
                scale: scale as f32,
                causal,
                kv_len: kv_len.map(|l| l as u32),
                q_offset: q_offset as u32,
                mask: tm.as_ref(),
                ..Default::default()
            };
            // The DYN_LEN variants only where a cache fill is given (their options carry none).
            let dyn_runs: &[bool] = if kv_len.is_some() {
                &[false, true]
            } else {
                &[false]
            };
            for (var, &dynamic) in AttnVariant::ALL
                .into_iter()
                .filter(|x| x.supports(&g.caps, d))
                .flat_map(|x| dyn_runs.iter().map(move |d| (x, d)))
            {
                let to =
                    Tensor::from_f32(&g, &[b, tq, hd], &vec![f32::NAN; b * tq * hd], "o").unwrap();
                let mut rec = Recorder::new(&g);
                if dynamic {
                    let o = AttnOpts {
                        kv_len: None,
                        q_offset: 0,
                        ..opts
                    };
                    attention(
                        &mut rec,
                        &tq_,
                        &tk_,
                        &tv_,
                        &AttnOpts {
                            dyn_len: Some(&dyn_len),
                            variant: Some(var),
                            ..o
                        },
                        &to,
                    )
                    .unwrap();
                } else {
                    attention(
                        &mut rec,
                        &tq_,
                        &tk_,
                        &tv_,
                        &AttnOpts {
                            variant: Some(var),
                            ..opts
                        },
                        &to,
                    )
                    .unwrap();
                }
                rec.submit().unwrap();
                let got = run_vec(&g, &to).await;
                let dm = max_diff(&got, &want);
                let name = format!(
                    "case {ci} {}{}{}",
                    var.name(),
                    if f16 { " kv f16" } else { "" },
                    if dynamic { " dyn_len" } else { "" }
                );
                web_sys::console::log_1(&format!("attention {name}: max diff {dm:e}").into());
                assert!(got.iter().all(|x| x.is_finite()), "{name}");
                assert!(dm <= 2e-6, "{name}: max diff {dm}");
                ran += 1;
            }
        }
    }
    assert_eq!(
        ran, 48,
        "tiled, rows, flash and flash_split on every case, K/V f32 and f16, fixed and dynamic length"
    );
    // DaViT window attention, 7x7 windows, head dim 32, over the fused qkv (nW, T, 3C).
    let (nw, t, c, heads) = (3usize, 49usize, 64usize, 2usize);
    let d = c / heads;
    let qkv = rand_vec(60, nw * t * 3 * c);
    let scale = (d as f64).powf(-0.5);
    let at = |wi: usize, tok: usize, col: usize| qkv[(wi * t + tok) * 3 * c + col] as f64;
    let want = attention_ref(
        (nw, t, t, heads, d),
        scale,
        |wi, i, col| (qkv[(wi * t + i) * 3 * c + col] * scale as f32) as f64 / scale,
        |wi, j, col| at(wi, j, c + col),
        |wi, j, col| at(wi, j, 2 * c + col),
        |_, _| true,
        None,
    );
    let tqkv = Tensor::from_f32(&g, &[nw, t, 3 * c], &qkv, "qkv").unwrap();
    let mut ran = 0;
    for var in WindowAttnVariant::ALL
        .into_iter()
        .filter(|x| x.supports(&g.caps, c, heads))
    {
        let to = Tensor::from_f32(&g, &[nw, t, c], &vec![f32::NAN; nw * t * c], "o").unwrap();
        let mut rec = Recorder::new(&g);
        window_attention_variant(&mut rec, var, &tqkv, heads, scale as f32, &to).unwrap();
        rec.submit().unwrap();
        let got = run_vec(&g, &to).await;
        let dm = max_diff(&got, &want);
        web_sys::console::log_1(
            &format!("window attention {}: max diff {dm:e}", var.name()).into(),
        );
        assert!(dm <= 2e-6, "window {}: max diff {dm}", var.name());
        ran += 1;
    }
    assert_eq!(ran, 2, "rows and flash");
}

#[wasm_bindgen_test]
async fn browser_channel_attention_and_pos_embed() {
    let g = gpu().await;
    // Channel attention: N = 300 tokens (2 splits), C = 16 in 2 groups (vec4) and C = 6 in 3 (scalar).
    for (c, groups, seed) in [(16usize, 2usize, 31u64), (6, 3, 32)] {
        let n = 300usize;
        let qkv = rand_vec(seed, n * 3 * c);
        let d = c / groups;
        let scale = (n as f64).powf(-0.5);
        let at = |tok: usize, col: usize| qkv[tok * 3 * c + col] as f64;
        let mut want = vec![0f32; n * c];
        for gi in 0..groups {
            for i in 0..d {
                let sc: Vec<f64> = (0..d)
                    .map(|j| {
                        (0..n)
                            .map(|t| at(t, gi * d + i) * at(t, c + gi * d + j))
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let mx = sc.iter().cloned().fold(f64::MIN, f64::max);
                let ex: Vec<f64> = sc.iter().map(|v| (v - mx).exp()).collect();
                let sum: f64 = ex.iter().sum();
                for t in 0..n {
                    let o: f64 = (0..d)
                        .map(|j| ex[j] / sum * at(t, 2 * c + gi * d + j))
                        .sum();
                    want[t * c + gi * d + i] = o as f32;
                }
            }
        }
        let tq = Tensor::from_f32(&g, &[1, n, 3 * c], &qkv, "qkv").unwrap();
        let to = Tensor::zeros(&g, &[1, n, c], DType::F32, "o").unwrap();
        let mut rec = Recorder::new(&g);
        ops::channel_attn::channel_attention(&mut rec, &tq, groups, &to).unwrap();
        rec.submit().unwrap();
        let got = run_vec(&g, &to).await;
        assert!(
            max_diff(&got, &want) <= 1e-5,
            "channel_attention C{c}: {}",
            max_diff(&got, &want)
        );
    }
    // Projector position terms: 3x2 grid, C = 6 (column half 3 first, row half 3), temporal row 0.
    let (h, w, c, p) = (3usize, 2usize, 6usize, 4usize);
    let x = rand_vec(33, h * w * c);
    let col = rand_vec(34, p * 3);
    let row = rand_vec(35, p * 3);
    let tmp = rand_vec(36, 2 * c);
    let mut want = vec![0f32; x.len()];
    for y in 0..h {
        for xx in 0..w {
            for ch in 0..c {
                let pos = if ch < 3 {
                    col[xx * 3 + ch]
                } else {
                    row[y * 3 + ch - 3]
                };
                want[(y * w + xx) * c + ch] = (x[(y * w + xx) * c + ch] + pos) + tmp[ch];
            }
        }
    }
    let tx = Tensor::from_f32(&g, &[1, h * w, c], &x, "x").unwrap();
    let tc = Tensor::from_f32(&g, &[p, 3], &col, "col").unwrap();
    let tr = Tensor::from_f32(&g, &[p, 3], &row, "row").unwrap();
    let tt = Tensor::from_f32(&g, &[2, c], &tmp, "t").unwrap();
    let to = Tensor::zeros(&g, &[1, h * w, c], DType::F32, "o").unwrap();
    let mut rec = Recorder::new(&g);
    ops::pos_embed::pos2d_temporal_add(&mut rec, &tx, &tc, &tr, &tt, (h, w), &to).unwrap();
    rec.submit().unwrap();
    assert_eq!(max_diff(&run_vec(&g, &to).await, &want), 0.0);
}

// ---- Linear variants and the tuner -------------------------------------------------------------------

/// f64 reference of x (M, K) @ w (N, K)^T + bias, and per-element bounds: a K-term f32 sum of products
/// errs by at most gamma_K * sum |x w| (gamma_K ~ K 2^-24), plus the bias add and output roundings.
fn linear_ref64(
    x: &[f32],
    w: &[f32],
    b: &[f32],
    m: usize,
    n: usize,
    k: usize,
) -> (Vec<f32>, Vec<f32>) {
    let u = 1.0 / (1u64 << 24) as f64;
    let mut want = vec![0f32; m * n];
    let mut bound = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut a) = (b[j] as f64, b[j].abs() as f64);
            for t in 0..k {
                let p = x[i * k + t] as f64 * w[j * k + t] as f64;
                s += p;
                a += p.abs();
            }
            want[i * n + j] = s as f32;
            bound[i * n + j] = ((k as f64 + 3.0) * u * a * 1.01 + 1e-30) as f32;
        }
    }
    (want, bound)
}

/// Every linear variant this browser can run (the registry's candidate list: here no subgroups), forced,
/// on shapes with ragged tile edges, f32 and packed-f16 weights, against the f64 reference.
#[wasm_bindgen_test]
async fn browser_linear_every_variant() {
    use ops::matmul::{linear, LinearArgs, LinearVariant};
    let g = gpu().await;
    let mut ran = 0;
    // (37, 300, 152): partial row blocks of every register-blocked kernel, two 256-column workgroups with
    // a ragged last column group, the padded stem K.
    for &(m, n, k) in &[
        (1, 37, 64),
        (3, 70, 40),
        (130, 129, 147),
        (17, 65, 32),
        (37, 300, 152),
    ] {
        for format in [DType::F32, DType::F16] {
            let x = rand_vec(m as u64, m * k);
            let mut w: Vec<f32> = rand_vec(n as u64 + 7, n * k)
                .iter()
                .map(|v| v * 0.5)
                .collect();
            let b = rand_vec(k as u64 + 3, n);
            let tw = if format == DType::F16 {
                w = w.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
                Tensor::from_f32_as_f16(&g, &[n, k], &w, "w").unwrap()
            } else {
                Tensor::from_f32(&g, &[n, k], &w, "w").unwrap()
            };
            let tx = Tensor::from_f32(&g, &[m, k], &x, "x").unwrap();
            let tb = Tensor::from_f32(&g, &[n], &b, "b").unwrap();
            let (want, bound) = linear_ref64(&x, &w, &b, m, n, k);
            for v in LinearVariant::ALL {
                if !v.supports(&g.caps, m, k, format) {
                    continue;
                }
                let to = Tensor::zeros(&g, &[m, n], DType::F32, "o").unwrap();
                let mut rec = Recorder::new(&g);
                linear(
                    &mut rec,
                    &tx,
                    &tw,
                    LinearArgs::default().bias(Some(&tb)).variant(v),
                    &to,
                )
                .unwrap();
                rec.submit().unwrap();
                let got = run_vec(&g, &to).await;
                for (i, ((gv, wv), bd)) in got.iter().zip(&want).zip(&bound).enumerate() {
                    assert!(
                        (gv - wv).abs() <= *bd,
                        "{v:?} {format:?} m={m} n={n} k={k} [{i}]: {gv} vs {wv} (bound {bd})"
                    );
                }
                ran += 1;
            }
        }
    }
    web_sys::console::log_1(&format!("linear: {ran} variant x shape x format runs").into());
    assert!(
        ran >= 4 * 2 * 3,
        "scalar, tiled64, tiled128 at least everywhere"
    );
}

/// Block-quantized weights (q8, q4: `src/gpu/quant.rs`) in the browser: every linear variant that reads
/// them here (no subgroups: vec4, GEMV, multi-row GEMV), forced, against the f64 reference on the
/// dequantized weights (the kernels dequantize in registers with f32 arithmetic, so the f32-sum bound of
/// `linear_ref64` applies unchanged); and the `embedding_packed` gather of q8/q4/f16 rows, exact (it only
/// dequantizes: d * q in f32, as the host does), with out-of-range ids giving zero rows.
#[wasm_bindgen_test]
async fn browser_quantized_linear_and_embedding() {
    use florence2_wasm::quant::{self, QFormat};
    use ops::matmul::{linear, LinearArgs, LinearVariant};
    let g = gpu().await;
    let mut ran = std::collections::BTreeMap::new();
    for &(m, n, k) in &[
        (1, 37, 64),
        (3, 70, 96),
        (4, 33, 256),
        (19, 65, 32),
        (40, 24, 128),
    ] {
        let x = rand_vec(m as u64 + 11, m * k);
        let w: Vec<f32> = rand_vec(n as u64 + 5, n * k)
            .iter()
            .map(|v| v * 0.5)
            .collect();
        let b = rand_vec(k as u64 + 13, n);
        let tx = Tensor::from_f32(&g, &[m, k], &x, "x").unwrap();
        let tb = Tensor::from_f32(&g, &[n], &b, "b").unwrap();
        for fmt in [QFormat::Q8, QFormat::Q4] {
            let format = if fmt == QFormat::Q8 {
                DType::Q8
            } else {
                DType::Q4
            };
            let mut bytes = Vec::new();
            quant::quantize_rows(fmt, k, &w, &mut bytes).unwrap();
            let wq = quant::dequantize_rows(fmt, k, &bytes).unwrap();
            let tw = Tensor::from_f32_quantized(&g, &[n, k], &w, fmt, "w").unwrap();
            let (want, bound) = linear_ref64(&x, &wq, &b, m, n, k);
            for v in LinearVariant::ALL {
                if !v.supports(&g.caps, m, k, format) {
                    continue;
                }
                let to = Tensor::zeros(&g, &[m, n], DType::F32, "o").unwrap();
                let mut rec = Recorder::new(&g);
                linear(
                    &mut rec,
                    &tx,
                    &tw,
                    LinearArgs::default().bias(Some(&tb)).variant(v),
                    &to,
                )
                .unwrap();
                rec.submit().unwrap();
                let got = run_vec(&g, &to).await;
                for (i, ((gv, wv), bd)) in got.iter().zip(&want).zip(&bound).enumerate() {
                    assert!(
                        (gv - wv).abs() <= *bd,
                        "{v:?} {fmt:?} m={m} n={n} k={k} [{i}]: {gv} vs {wv} (bound {bd})"
                    );
                }
                *ran.entry((v.name(), fmt.name())).or_insert(0) += 1;
            }
        }
    }
    web_sys::console::log_1(&format!("quantized linear runs (variant, format): {ran:?}").into());
    for fmt in ["q8", "q4"] {
        for v in ["reg8x8", "reg16x16", "gemv"] {
            assert!(ran.contains_key(&(v, fmt)), "{v} {fmt} never ran");
        }
    }

    // embedding_packed: rows of a (V, C) table gathered by id (the shared embedding in q8/q4/fp16).
    let (vocab, c) = (97, 64);
    let table: Vec<f32> = rand_vec(47, vocab * c).iter().map(|v| v * 2.0).collect();
    let ids: [u32; 9] = [0, 96, 3, 3, 50, 97, 1_000_000, u32::MAX, 25];
    let ti = Tensor::from_u32(&g, &[ids.len()], &ids, "ids").unwrap();
    for dt in [DType::F16, DType::Q8, DType::Q4] {
        let (tt, host) = match dt.qformat() {
            None => (
                Tensor::from_f32_as_f16(&g, &[vocab, c], &table, "t").unwrap(),
                table
                    .iter()
                    .map(|&x| half::f16::from_f32(x).to_f32())
                    .collect::<Vec<_>>(),
            ),
            Some(fmt) => {
                let mut bytes = Vec::new();
                quant::quantize_rows(fmt, c, &table, &mut bytes).unwrap();
                (
                    Tensor::from_f32_quantized(&g, &[vocab, c], &table, fmt, "t").unwrap(),
                    quant::dequantize_rows(fmt, c, &bytes).unwrap(),
                )
            }
        };
        let mut want = vec![0f32; ids.len() * c];
        for (r, &id) in ids.iter().enumerate() {
            if (id as usize) < vocab {
                want[r * c..(r + 1) * c]
                    .copy_from_slice(&host[id as usize * c..(id as usize + 1) * c]);
            }
        }
        let to = Tensor::from_f32(&g, &[ids.len(), c], &vec![7.0; ids.len() * c], "o").unwrap();
        let mut rec = Recorder::new(&g);
        ops::embedding::embedding(&mut rec, &ti, &tt, &to).unwrap();
        rec.submit().unwrap();
        assert_eq!(run_vec(&g, &to).await, want, "embedding {dt:?}");
    }
}

/// The residual epilogue (out = x w^T + b + residual) through every variant this browser can run, with
/// f32 and block-quantized (q8, q4) weights, against the f64 reference on the dequantized weights (the
/// bound of `linear_ref64` plus one rounding of the residual add).
#[wasm_bindgen_test]
async fn browser_linear_residual_and_quantized_every_variant() {
    use florence2_wasm::quant;
    use ops::matmul::{linear, LinearArgs, LinearVariant};
    let g = gpu().await;
    let (m, n, k) = (21, 70, 96);
    let mut ran = 0;
    for format in [DType::F32, DType::Q8, DType::Q4] {
        let x = rand_vec(5, m * k);
        let mut w: Vec<f32> = rand_vec(6, n * k).iter().map(|v| v * 0.5).collect();
        let b = rand_vec(7, n);
        let r = rand_vec(8, m * n);
        let tw = match format.qformat() {
            Some(q) => {
                let t = Tensor::from_f32_quantized(&g, &[n, k], &w, q, "w").unwrap();
                let mut bytes = Vec::new();
                quant::quantize_rows(q, k, &w, &mut bytes).unwrap();
                w = quant::dequantize_rows(q, k, &bytes).unwrap();
                t
            }
            None => Tensor::from_f32(&g, &[n, k], &w, "w").unwrap(),
        };
        let tx = Tensor::from_f32(&g, &[m, k], &x, "x").unwrap();
        let tb = Tensor::from_f32(&g, &[n], &b, "b").unwrap();
        let tr = Tensor::from_f32(&g, &[m, n], &r, "r").unwrap();
        let (lin, bound) = linear_ref64(&x, &w, &b, m, n, k);
        for v in LinearVariant::ALL {
            if !v.supports(&g.caps, m, k, format) {
                continue;
            }
            let to = Tensor::zeros(&g, &[m, n], DType::F32, "o").unwrap();
            let mut rec = Recorder::new(&g);
            linear(
                &mut rec,
                &tx,
                &tw,
                LinearArgs::default()
                    .bias(Some(&tb))
                    .residual(Some(&tr))
                    .variant(v),
                &to,
            )
            .unwrap();
            rec.submit().unwrap();
            let got = run_vec(&g, &to).await;
            for i in 0..m * n {
                let want = lin[i] + r[i];
                let bd = bound[i] + 2.0 * f32::EPSILON * want.abs();
                assert!(
                    (got[i] - want).abs() <= bd,
                    "{v:?} {format:?} [{i}]: {} vs {want} (bound {bd})",
                    got[i]
                );
            }
            ran += 1;
        }
    }
    web_sys::console::log_1(&format!("linear + residual: {ran} variant x format runs").into());
    assert!(
        ran >= 3 + 2 * 5,
        "f32 everywhere, q8/q4 through the vec4 and reg kernels"
    );
}

/// The tuner in the browser: it times, installs its choices and caches them in the Cache API, so a second
/// tuning of the same shapes times nothing.
#[wasm_bindgen_test]
async fn browser_tuner_caches_its_choices() {
    use florence2_wasm::gpu::registry::LinearShape;
    use florence2_wasm::gpu::tune::{tune, CacheLocation, Tuning};
    let g = gpu().await;
    let shapes = [
        LinearShape {
            m: 1,
            n: 40,
            k: 64,
            format: DType::F32,
        },
        LinearShape {
            m: 70,
            n: 48,
            k: 32,
            format: DType::F16,
        },
    ];
    let first = tune(&g, &shapes, Tuning::Exhaustive, &CacheLocation::Default)
        .await
        .unwrap();
    web_sys::console::log_1(&first.table().into());
    assert!(first.timings >= 2);
    assert_eq!(g.choices.len(), 2);
    let has_caches = js_sys::Reflect::has(&js_sys::global(), &"caches".into()).unwrap_or(false);
    g.choices.clear();
    let second = tune(&g, &shapes, Tuning::Auto, &CacheLocation::Default)
        .await
        .unwrap();
    assert_eq!(g.choices.len(), 2);
    if has_caches {
        assert_eq!(second.timings, 0, "{}", second.table());
    } else {
        web_sys::console::log_1(
            &"no Cache API in this context: the cache half is not exercised".into(),
        );
    }
}

/// What the engine knows of the browser's adapter. Headless Chromium here runs WebGPU on SwiftShader, a
/// CPU adapter: `Caps::is_cpu` must say so (wgpu maps `GPUAdapterInfo.isFallbackAdapter`; the engine
/// also recognises software adapters by name and architecture), because static kernel choices and the
/// tuner's budget depend on it.
#[wasm_bindgen_test]
async fn browser_caps_identify_the_adapter() {
    let g = gpu().await;
    web_sys::console::log_1(
        &format!(
            "caps: is_cpu={} timestamp_query={} name={:?} key={}",
            g.caps.is_cpu, g.caps.timestamp_query, g.caps.adapter_name, g.caps.adapter_key
        )
        .into(),
    );
    let info = florence2_wasm::wasm::JsFlorence2::is_supported().await;
    web_sys::console::log_1(&info);
    let adapter = js_sys::Reflect::get(&info, &"adapter".into()).unwrap();
    let s = js_sys::JSON::stringify(&adapter).unwrap();
    assert!(
        g.caps.is_cpu,
        "SwiftShader is a CPU adapter: {} / {}",
        String::from(s),
        g.caps.adapter_key
    );
    // The adapter's identity from GPUAdapterInfo is in the tuning cache key (wgpu leaves vendor and
    // device ids at 0 in the browser), so two GPUs with equal limits do not share kernel choices.
    assert!(
        g.caps.adapter_key.contains("architecture=swiftshader"),
        "{}",
        g.caps.adapter_key
    );
    assert!(!g.caps.adapter_name.is_empty());
}

/// The CPU backend's quantized decode dots in wasm: the module is built with SIMD128
/// (.cargo/config.toml), and that path equals the scalar one bit for bit (same products, same order).
#[wasm_bindgen_test]
fn wasm_simd128_quant_row_dots_equal_portable() {
    use florence2_wasm::cpu::qdot::{portable, quant_row_dots};
    use florence2_wasm::quant::{quantize_rows, QFormat};
    // a test-time check (a failed build would hide which setting was missing)
    let simd128 = std::hint::black_box(cfg!(target_feature = "simd128"));
    assert!(simd128, "wasm built without +simd128");
    for (s, fmt) in [(1u64, QFormat::Q8), (2, QFormat::Q4)] {
        for k in [32, 768, 3072] {
            for m in 1..=4 {
                let w = rand_vec(s * 7 + k as u64, k);
                let mut bytes = Vec::new();
                quantize_rows(fmt, k, &w, &mut bytes).unwrap();
                let scales: Vec<f32> = rand_vec(s + m as u64, k / 32)
                    .iter()
                    .map(|v| v.abs() + 0.01)
                    .collect();
                let x = rand_vec(s * 13 + m as u64, m * k);
                let (mut got, mut want) = (vec![0f32; m], vec![0f32; m]);
                quant_row_dots(fmt, k, &bytes, &scales, &x, &mut got);
                portable(fmt, k, &bytes, &scales, &x, &mut want);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{fmt:?} k={k} m={m}");
            }
        }
    }
}

/// The int8 decode dots in wasm (`QuantDot::Int8`): the SIMD128 kernel (`i32x4.dot_i16x8_s`) is the one
/// chosen, and equals the portable kernel bit for bit (exact integer lane sums, same f32 order), for
/// both formats, every M and K of 1 to 96 blocks.
#[wasm_bindgen_test]
fn wasm_simd128_int8_row_dots_equal_portable() {
    use florence2_wasm::cpu::qdot_int8::{int8_row_dots, int8_row_dots_with, Int8Kernel, QuantX};
    use florence2_wasm::quant::{quantize_rows, QFormat};
    assert_eq!(Int8Kernel::best(), Int8Kernel::Simd128);
    for (s, fmt) in [(3u64, QFormat::Q8), (4, QFormat::Q4)] {
        for k in [32, 96, 160, 768, 3072] {
            let mut bytes = Vec::new();
            quantize_rows(fmt, k, &rand_vec(s * 7 + k as u64, k), &mut bytes).unwrap();
            for m in 1..=4 {
                let qx = QuantX::new(&rand_vec(s * 13 + m as u64, m * k), k);
                let xr = (&qx.q[..], &qx.d[..]);
                let (mut got, mut want) = (vec![0f32; m], vec![0f32; m]);
                int8_row_dots(fmt, k, &bytes, xr, &mut got);
                int8_row_dots_with(Int8Kernel::Portable, fmt, k, &bytes, xr, &mut want);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{fmt:?} k={k} m={m}");
                assert!(want.iter().all(|v| v.is_finite() && *v != 0.0));
            }
        }
    }
}

/// The CPU backend's f16 widening in wasm (SIMD128 integer operations) equals `half`'s `to_f32` on every
/// one of the 65536 halves, bit for bit (NaNs included), at every alignment of a slice's tail.
#[wasm_bindgen_test]
fn wasm_simd128_f16_widening_is_exact_for_every_half() {
    use florence2_wasm::cpu::widen::f16_to_f32;
    let all: Vec<half::f16> = (0..=u16::MAX).map(half::f16::from_bits).collect();
    for skip in 0..9 {
        let src = &all[skip..];
        let mut got = vec![0f32; src.len()];
        f16_to_f32(src, &mut got);
        for (h, g) in src.iter().zip(&got) {
            assert_eq!(
                g.to_bits(),
                h.to_f32().to_bits(),
                "half {:#06x}",
                h.to_bits()
            );
        }
    }
}
