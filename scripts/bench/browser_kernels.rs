//! Browser kernel bench: GFLOP/s of every linear variant the browser's adapter can run (SwiftShader in
//! headless Chromium: no subgroups), from the wasm build, with the tuner's pick. Not part of the test
//! suite: run it with `scripts/bench/browser_kernels.sh` (a wasm-bindgen-test in its own test target, so
//! `wasm-pack test` gives it the browser; natively this file compiles to nothing).
//!
//! Timing is the tuner's own (`ops::tune`, exhaustive mode, no cache): every candidate recorded into a
//! fresh recorder, submitted, and awaited with `onSubmittedWorkDone`; one warm-up (pipeline compilation)
//! per candidate; candidates interleaved rep by rep so a noisy neighbour hits all alike; median of 7.
//! Rows are capped at 512 (the model's large-M GEMMs behave alike per row beyond that on a CPU adapter)
//! so the slow scalar kernel finishes in minutes.
#![cfg(target_arch = "wasm32")]

use florence2_wasm::gpu::{DType, Gpu, GpuOptions};
use florence2_wasm::ops::matmul::LinearVariant;
use florence2_wasm::ops::tune::{tune, CacheLocation, LinearShape, Tuning};
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

/// (label, M, K, N): Florence-2-base linear shapes, rows capped at 512.
const SHAPES: &[(&str, usize, usize, usize)] = &[
    ("stem conv (K 147->152)", 512, 152, 128),
    ("DaViT s0 mlp.fc1", 512, 128, 512),
    ("DaViT s2 mlp.fc1", 512, 512, 2048),
    ("BART enc attn proj", 512, 768, 768),
    ("BART enc ffn fc1", 512, 768, 3072),
    ("decode proj", 1, 768, 768),
    ("decode fc1", 1, 768, 3072),
];

fn log(s: &str) {
    web_sys::console::log_1(&s.into());
}

#[wasm_bindgen_test]
async fn browser_kernels_bench() {
    let g = Gpu::new(GpuOptions::default())
        .await
        .expect("WebGPU adapter (Chromium needs --enable-unsafe-webgpu)");
    log(&format!("adapter: {}", g.describe()));
    log(
        "cells: GFLOP/s (2 M N K / median ms of 7, submit + onSubmittedWorkDone); '-' = cannot run",
    );
    let mut header = format!(
        "{:<24} {:>4} {:>5} {:>5} {:>5}",
        "shape", "fmt", "M", "K", "N"
    );
    for v in LinearVariant::ALL {
        header.push_str(&format!(" {:>9}", v.name()));
    }
    header.push_str("   tuned");
    log(&header);
    for &(label, m, k, n) in SHAPES {
        for format in [DType::F32, DType::F16] {
            if m <= 4 && format == DType::F16 {
                continue;
            }
            g.choices.clear();
            let shape = LinearShape { m, n, k, format };
            let report = tune(&g, &[shape], Tuning::Exhaustive, &CacheLocation::None)
                .await
                .expect("tuning");
            let Some(row) = report.rows.first() else {
                log(&format!("{label}: no timing"));
                continue;
            };
            let t = row.timed_shape.unwrap_or(shape);
            let flop = 2.0 * (t.m * t.n * t.k) as f64;
            let mut line = format!(
                "{label:<24} {:>4} {:>5} {:>5} {:>5}",
                format!("{format:?}").to_lowercase(),
                t.m,
                t.k,
                t.n
            );
            for v in LinearVariant::ALL {
                let ms = row
                    .times_ms
                    .iter()
                    .find(|(name, _)| *name == v.name())
                    .and_then(|(_, ms)| *ms);
                line.push_str(&match ms {
                    Some(ms) => format!(" {:>9.2}", flop / (ms * 1e6)),
                    None => format!(" {:>9}", "-"),
                });
            }
            line.push_str(&format!("   {}", row.chosen));
            log(&line);
        }
    }
    g.choices.clear();
}
