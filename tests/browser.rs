//! Browser tests: run with `wasm-pack test --headless --chrome -- --test browser` (scripts/test.sh).
//! They run the kernels on the browser's WebGPU (SwiftShader in headless Chromium), proving that every
//! shader validates and runs under the browser's limits (256 invocations per workgroup, 10 storage buffers
//! per stage, no shader-f16, no subgroups through wgpu's WebGPU backend), and compare against the same CPU
//! references the native tests use. Natively this file compiles to nothing.
#![cfg(target_arch = "wasm32")]

use std::sync::Arc;

use florence2_wasm::gpu::{readback, DType, Gpu, GpuOptions, Recorder, Tensor};
use florence2_wasm::ops;
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

async fn gpu() -> Arc<Gpu> {
    Gpu::new(GpuOptions::default())
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
