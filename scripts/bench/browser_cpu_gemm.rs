//! Browser CPU GEMM bench: GFLOP/s of the wasm build's GEMM backends (`cpu::gemm::Backend`: the `gemm`
//! crate's SIMD128 kernels, the packed GEMM on four-lane vectors, the portable blocked loop) on
//! Florence-2-base shapes, in headless Chromium's wasm engine, one thread. Not part of the test suite:
//! `scripts/bench/browser_cpu_gemm.sh` runs it from a release build, once built with `+simd128` and once
//! with `+simd128,+relaxed-simd` (where the packed GEMM's multiply-add is `f32x4.relaxed_madd`).
//!
//! Timing: backends interleave sample by sample (a noisy neighbour hits all alike), after `WARM` calls
//! each (V8 runs a function in its baseline tier until it has run enough to be optimized); a sample
//! times enough calls for about 0.5 GFLOP (browsers coarsen `performance.now()`); the median of `REPS`
//! is reported.
#![cfg(target_arch = "wasm32")]

use florence2_wasm::cpu::gemm::{sgemm_nt_with, Backend, MatRef};
use florence2_wasm::cpu::lanes::RELAXED;
use florence2_wasm::gpu::tune::{Clock, WallClock};
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

const REPS: usize = 5;
const WARM: usize = 4;

/// (label, M, K, N): Florence-2-base GEMM shapes at 768 px, rows capped at 576.
const SHAPES: &[(&str, usize, usize, usize)] = &[
    ("DaViT s0 qkv", 576, 128, 384),
    ("DaViT s0 mlp.fc1", 576, 128, 512),
    ("DaViT s1 mlp.fc2", 576, 1024, 256),
    ("DaViT s2 qkv", 576, 512, 1536),
    ("DaViT s2 mlp.fc1", 576, 512, 2048),
    ("DaViT s2 mlp.fc2", 576, 2048, 512),
    ("DaViT s3 mlp.fc1", 576, 1024, 4096),
    ("window q k^T", 144, 32, 144),
    ("BART ffn fc1", 577, 768, 3072),
];

const BACKENDS: [Backend; 3] = [Backend::Gemm, Backend::Packed, Backend::Blocked];

fn log(s: &str) {
    web_sys::console::log_1(&s.into());
}

#[wasm_bindgen_test]
fn browser_cpu_gemm_bench() {
    log(&format!(
        "wasm CPU GEMM, one thread; relaxed SIMD: {RELAXED}; GFLOP/s = 2 M N K / median ms of {REPS}"
    ));
    log(&format!(
        "{:<18} {:>4} {:>5} {:>5} {:>9} {:>9} {:>9}",
        "shape", "M", "K", "N", "gemm", "packed", "blocked"
    ));
    for &(label, m, k, n) in SHAPES {
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1)
            .collect();
        let b: Vec<f32> = (0..n * k)
            .map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.1)
            .collect();
        let mut c = vec![0f32; m * n];
        let mut run = |be: Backend| {
            sgemm_nt_with(
                be,
                MatRef::new(&a, m, k),
                MatRef::new(&b, n, k),
                &mut c,
                n,
                0,
            )
            .unwrap();
        };
        for _ in 0..WARM {
            BACKENDS.iter().for_each(|&be| run(be));
        }
        let flop = 2.0 * (m * n * k) as f64;
        let calls = (5e8 / flop).ceil().max(1.0) as usize;
        let mut samples = vec![Vec::new(); BACKENDS.len()];
        for _ in 0..REPS {
            for (i, &be) in BACKENDS.iter().enumerate() {
                let t0 = WallClock.now_ms();
                (0..calls).for_each(|_| run(be));
                samples[i].push((WallClock.now_ms() - t0) / calls as f64);
            }
        }
        let mut line = format!("{label:<18} {m:>4} {k:>5} {n:>5}");
        for mut s in samples {
            s.sort_by(|x, y| x.total_cmp(y));
            line.push_str(&format!(" {:>9.2}", flop / (s[REPS / 2] * 1e6)));
        }
        log(&line);
    }
}
