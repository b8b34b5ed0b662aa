//! Browser attention bench: every attention variant's time per Florence-2-base attention shape on the
//! browser's adapter (SwiftShader in headless Chromium), from the wasm build, with the tuner's pick. Not
//! part of the test suite: run it with
//! `WASM_BINDGEN_TEST_TIMEOUT=1800 wasm-pack test --headless --chrome --mode no-install -- --test browser_attention_bench`
//! (a wasm-bindgen-test in its own test target, so `wasm-pack test` gives it the browser; natively this
//! file compiles to nothing).
//!
//! Timing is the tuner's own (`gpu::tune::tune_with`, `auto` mode, no cache): candidates recorded,
//! submitted and awaited with `onSubmittedWorkDone`, one warm-up each, interleaved rep by rep, median
//! of 3, at the shape `auto` times (encoder rows capped at 256, windows at 32: cost per row / window is
//! flat). Compare within a row; the chosen variant is what the model would run on this adapter.
#![cfg(target_arch = "wasm32")]

use florence2_wasm::gpu::registry::OpKind;
use florence2_wasm::gpu::tune::{tune_with, CacheLocation, TuneCase, Tuning};
use florence2_wasm::gpu::{Device, DeviceOptions};
use florence2_wasm::ops::attention::{choose_attention_variant, AttnShape, AttnVariant};
use florence2_wasm::ops::window_attn::WindowShape;
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

fn log(s: &str) {
    web_sys::console::log_1(&s.into());
}

fn attn(b: usize, tq: usize, bk: usize, tk: usize) -> AttnShape {
    AttnShape {
        b,
        tq,
        bk,
        tk,
        heads: 12,
        d: 64,
        causal: false,
        masked: false,
    }
}

#[wasm_bindgen_test]
async fn browser_attention_bench() {
    let g = Device::new(DeviceOptions::default())
        .await
        .expect("WebGPU adapter (Chromium needs --enable-unsafe-webgpu)");
    log(&format!("adapter: {}", g.describe()));
    let shapes: Vec<(&str, Box<dyn TuneCase>)> = vec![
        (
            "encoder self T585 (timed 256 rows)",
            Box::new(attn(1, 585, 1, 585)),
        ),
        ("decoder cross B1 Tk585", Box::new(attn(1, 1, 1, 585))),
        ("decoder cross B3 Tk585 Bk1", Box::new(attn(3, 1, 1, 585))),
        ("decoder self B3 cache 1024", Box::new(attn(3, 1, 3, 1024))),
        (
            "window 12x12 C128 H4 (timed 32 win)",
            Box::new(WindowShape {
                windows: 256,
                t: 144,
                c: 128,
                heads: 4,
            }),
        ),
        (
            "window 7x7 C128 H4 (timed 32 win)",
            Box::new(WindowShape {
                windows: 256,
                t: 49,
                c: 128,
                heads: 4,
            }),
        ),
    ];
    let names: Vec<&str> = AttnVariant::ALL.iter().map(|v| v.name()).collect();
    log(&format!(
        "| shape | {} ms | static | chosen | chosen / static |",
        names.join(" ms | ")
    ));
    log(&format!("|---|{}---|---|---|", "---|".repeat(names.len())));
    for (label, case) in &shapes {
        g.choices.clear();
        let cases: Vec<&dyn TuneCase> = vec![case.as_ref()];
        let report = tune_with(&g, &[], &cases, Tuning::Auto, &CacheLocation::None)
            .await
            .expect("tuning");
        let Some(row) = report.rows.first() else {
            log(&format!("| {label} | no timing |"));
            continue;
        };
        let cells: Vec<String> = names
            .iter()
            .map(|n| {
                row.times_ms
                    .iter()
                    .find(|(v, _)| v == n)
                    .and_then(|(_, t)| *t)
                    .map(|t| format!("{t:.2}"))
                    .unwrap_or_else(|| "-".into())
            })
            .collect();
        // The static choice (tuning off); window attention's is its register kernel.
        let static_name = match case.class().op {
            OpKind::WindowAttention => "rows",
            _ => choose_attention_variant(&g.caps, 64).name(),
        };
        let time_of = |n: &str| {
            row.times_ms
                .iter()
                .find(|(v, _)| *v == n)
                .and_then(|(_, t)| *t)
        };
        let ratio = match (time_of(row.chosen), time_of(static_name)) {
            (Some(c), Some(s)) => format!("{:.2}", c / s),
            _ => "-".into(),
        };
        log(&format!(
            "| {label} | {} | {static_name} | {} | {ratio} |",
            cells.join(" | "),
            row.chosen
        ));
    }
    g.choices.clear();
}
