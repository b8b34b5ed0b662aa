//! Browser kernel bench: GFLOP/s of every linear variant the browser's adapter can run (SwiftShader in
//! headless Chromium: no subgroups), from the wasm build. Not part of the test suite: run it with
//! `scripts/bench/browser_kernels.sh` (a wasm-bindgen-test in its own test target, so `wasm-pack test`
//! gives it the browser; natively this file compiles to nothing).
//!
//! Timing: each sample records one call into a fresh recorder, submits it and awaits
//! `onSubmittedWorkDone` (submit + wait, as the model pays it); one warm-up per variant (kernel
//! compilation) is excluded; variants are interleaved sample by sample so a noisy neighbour hits all
//! alike; the median of `REPS` is reported. Rows are capped at 256 (the large-M GEMMs behave alike per
//! row beyond that on a CPU adapter) and the scalar kernel only runs the decode shapes, so the run takes
//! minutes, not an hour. `static` is the variant `linear` picks with tuning off.
#![cfg(target_arch = "wasm32")]

use std::sync::Arc;

use florence2_wasm::gpu::tune::{Clock, WallClock};
use florence2_wasm::gpu::{DType, Device, DeviceOptions, Recorder, Tensor};
use florence2_wasm::ops::matmul::{self, LinearVariant};
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

const REPS: usize = 3;

/// (label, M, K, N): Florence-2-base linear shapes, rows capped at 256.
const SHAPES: &[(&str, usize, usize, usize)] = &[
    ("stem conv (K 147->152)", 256, 152, 128),
    ("DaViT s0 mlp.fc1", 256, 128, 512),
    ("DaViT s2 mlp.fc1", 256, 512, 2048),
    ("BART enc attn proj", 256, 768, 768),
    ("BART enc ffn fc1", 256, 768, 3072),
    ("decode proj", 1, 768, 768),
    ("decode fc1", 1, 768, 3072),
];

/// The tuner's candidates.
fn variants() -> Vec<LinearVariant> {
    LinearVariant::ALL.to_vec()
}

fn log(s: &str) {
    web_sys::console::log_1(&s.into());
}

async fn finish(g: &Device) {
    let (tx, rx) = futures_channel::oneshot::channel();
    g.wgpu()
        .expect("a GPU device")
        .queue
        .on_submitted_work_done(move || {
            let _ = tx.send(());
        });
    rx.await.expect("work-done callback");
}

#[wasm_bindgen_test]
async fn browser_kernels_bench() {
    let g: Arc<Device> = Device::new(DeviceOptions::default())
        .await
        .expect("WebGPU adapter (Chromium needs --enable-unsafe-webgpu)");
    log(&format!("adapter: {}", g.describe()));
    log(&format!(
        "cells: GFLOP/s = 2 M N K / median ms of {REPS} (submit + onSubmittedWorkDone); '-' = cannot run"
    ));
    let mut header = format!(
        "{:<24} {:>4} {:>4} {:>4} {:>5}",
        "shape", "fmt", "M", "K", "N"
    );
    for v in variants() {
        header.push_str(&format!(" {:>9}", v.name()));
    }
    header.push_str("  static    best");
    log(&header);
    for &(label, m, k, n) in SHAPES {
        for format in [DType::F32, DType::F16] {
            if m <= 4 && format == DType::F16 {
                continue;
            }
            let x = Tensor::zeros(&g, &[m, k], DType::F32, "x").unwrap();
            let w = Tensor::zeros(&g, &[n, k], format, "w").unwrap();
            let b = Tensor::zeros(&g, &[n], DType::F32, "b").unwrap();
            let out = Tensor::zeros(&g, &[m, n], DType::F32, "out").unwrap();
            let run = |v: LinearVariant| {
                let mut rec = Recorder::new(&g);
                matmul::linear(
                    &mut rec,
                    &x,
                    &w,
                    matmul::LinearArgs::default().bias(Some(&b)).variant(v),
                    &out,
                )
                .unwrap();
                rec.submit().unwrap();
            };
            let vs: Vec<LinearVariant> = variants()
                .into_iter()
                .filter(|v| v.supports(&g.caps, m, k, format))
                .filter(|&v| v != LinearVariant::Scalar || m <= matmul::GEMV_MAX_ROWS)
                .collect();
            for &v in &vs {
                run(v);
                finish(&g).await;
            }
            let mut samples = vec![Vec::new(); vs.len()];
            for _ in 0..REPS {
                for (i, &v) in vs.iter().enumerate() {
                    let t0 = WallClock.now_ms();
                    run(v);
                    finish(&g).await;
                    samples[i].push(WallClock.now_ms() - t0);
                }
            }
            let flop = 2.0 * (m * n * k) as f64;
            let mut rates = Vec::new();
            for (v, mut s) in vs.iter().zip(samples) {
                s.sort_by(|a, b| a.total_cmp(b));
                rates.push((*v, flop / (s[s.len() / 2] * 1e6)));
            }
            let mut line = format!(
                "{label:<24} {:>4} {m:>4} {k:>4} {n:>5}",
                format!("{format:?}").to_lowercase()
            );
            for v in variants() {
                line.push_str(&match rates.iter().find(|r| r.0 == v) {
                    Some((_, r)) => format!(" {r:>9.2}"),
                    None => format!(" {:>9}", "-"),
                });
            }
            let best = rates.iter().max_by(|a, b| a.1.total_cmp(&b.1));
            line.push_str(&format!(
                "  {}  {}",
                matmul::choose_linear_variant(&g.caps, m, k).name(),
                best.map_or("-", |b| b.0.name())
            ));
            log(&line);
        }
    }
}
