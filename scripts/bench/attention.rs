//! Attention variants side by side on Florence-2-base's shapes (encoder self-attention, decoder cross and
//! self attention with a KV cache): `cargo bench --bench attention`. Each variant that supports the head
//! dim runs interleaved rep by rep so machine load affects them alike; medians are printed.

#[path = "../../tests/common/mod.rs"]
mod common;

use common::Rng;
use florence2_wasm::gpu::{readback, DType, Gpu, GpuOptions, Recorder, Tensor};
use florence2_wasm::ops::attention::{attention_variant, AttnOpts, AttnVariant};

const VARIANTS: [AttnVariant; 2] = [AttnVariant::Tiled, AttnVariant::Rows];

fn main() {
    // `cargo test --all-targets` runs harness-less benches without `--bench`: only build-check them then.
    if !std::env::args().any(|a| a == "--bench") {
        println!("attention bench: run with `cargo bench --bench attention`");
        return;
    }
    let g = pollster::block_on(Gpu::new(GpuOptions::default())).expect("a GPU adapter");
    println!("adapter: {}", g.describe());
    attention_timings(&g);
}

/// Timings of every variant on the base model's shapes.
#[allow(clippy::type_complexity)]
fn attention_timings(g: &std::sync::Arc<Gpu>) {
    use std::time::Instant;
    let g = g.clone();
    let shapes: [(
        &str,
        usize,
        usize,
        usize,
        usize,
        usize,
        bool,
        Option<u32>,
        u32,
    ); 4] = [
        // name, B, Bk, Tq, Tk, H, causal, kv_len, q_offset   (D = 64)
        ("encoder self B1 T585", 1, 1, 585, 585, 12, false, None, 0),
        (
            "decoder cross B3 Tq1 Tk585 Bk1",
            3,
            1,
            1,
            585,
            12,
            false,
            None,
            0,
        ),
        (
            "decoder self B3 Tq1 kv20/1024",
            3,
            3,
            1,
            1024,
            12,
            true,
            Some(20),
            19,
        ),
        (
            "decoder cross B1 Tq1 Tk585",
            1,
            1,
            1,
            585,
            12,
            false,
            None,
            0,
        ),
    ];
    for (name, b, bk, tq, tk, h, causal, kv_len, q_offset) in shapes {
        let hd = h * 64;
        let mut rng = Rng::new(1);
        let q = Tensor::from_f32(&g, &[b, tq, hd], &rng.vec(b * tq * hd, 1.0), "q").unwrap();
        let k = Tensor::from_f32(&g, &[bk, tk, hd], &rng.vec(bk * tk * hd, 1.0), "k").unwrap();
        let v = Tensor::from_f32(&g, &[bk, tk, hd], &rng.vec(bk * tk * hd, 1.0), "v").unwrap();
        let out = Tensor::zeros(&g, &[b, tq, hd], DType::F32, "out").unwrap();
        let opts = AttnOpts {
            heads: h,
            scale: 0.125,
            causal,
            kv_len,
            q_offset,
            mask: None,
        };
        let keys = kv_len.map(|l| l as usize).unwrap_or(tk);
        let flops = 4.0 * (b * h * tq * keys * 64) as f64;
        let reps = if tq > 1 { 3 } else { 20 };
        // Variants interleaved rep by rep, so that a change of machine load hits them alike.
        let vars = VARIANTS;
        let mut ts = vec![Vec::new(); vars.len()];
        for i in 0..=reps {
            for (vi, &var) in vars.iter().enumerate() {
                let t0 = Instant::now();
                let mut rec = Recorder::new(&g);
                attention_variant(&mut rec, var, &q, &k, &v, &opts, &out).unwrap();
                rec.submit().unwrap();
                readback::to_f32_blocking(&g, &out).unwrap();
                if i > 0 {
                    ts[vi].push(t0.elapsed().as_secs_f64());
                }
            }
        }
        for (vi, var) in vars.iter().enumerate() {
            let ts = &mut ts[vi];
            ts.sort_by(f64::total_cmp);
            let med = ts[ts.len() / 2];
            eprintln!(
                "{name:34} {var:?}: median {:9.3} ms  {:6.2} GFLOP/s",
                med * 1e3,
                flops / med / 1e9
            );
        }
    }
}
