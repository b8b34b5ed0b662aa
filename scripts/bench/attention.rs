//! Attention variants side by side on Florence-2-base's shapes: `cargo bench --bench attention`.
//! Rows: encoder self-attention over image + prompt tokens, decoder cross-attention at 1 and 3 rows (K/V
//! shared), decoder self-attention over a KV cache, DaViT window attention (12x12 windows as released,
//! and 7x7). Columns: every variant that supports the shape (`AttnVariant::ALL`,
//! `WindowAttnVariant::ALL`), forced, median ms per call (submit and wait; a few calls per submit for
//! small shapes), then the static choice of this adapter and the fastest. Variants run interleaved rep
//! by rep, so a change of machine load hits them alike; compare within a row. The decoder rows run
//! twice more, with K/V in f16 (the `KV_F16` variants, the decoder's caches and cross K/V for non-fp32
//! weights): a "kv f16" row after each, its variants interleaved with the f32 row's.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use common::Rng;
use florence2_wasm::gpu::{DType, Device, DeviceOptions, Recorder, Tensor};
use florence2_wasm::ops::attention::{attention, choose_attention_variant, AttnOpts, AttnVariant};
use florence2_wasm::ops::window_attn::{self, window_attention_variant, WindowAttnVariant};

/// One variant's call on one shape, or `None` where the variant cannot run the shape.
type Run = Option<Box<dyn Fn(&mut Recorder)>>;

fn main() {
    // `cargo test --all-targets` runs harness-less benches without `--bench`: only build-check them then.
    if !std::env::args().any(|a| a == "--bench") {
        println!("attention bench: run with `cargo bench --bench attention`");
        return;
    }
    let g = pollster::block_on(Device::new(DeviceOptions::default())).expect("a GPU adapter");
    println!("adapter: {}", g.describe());
    let reps: usize = std::env::var("ATTN_BENCH_REPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    println!();
    println!("| shape | tiled ms | rows ms | flash ms | flash_split ms | static | best | flash / static |");
    println!("|---|---|---|---|---|---|---|---|");
    attention_rows(&g, reps);
    window_rows(&g, reps);
}

/// Median ms per call of each runnable closure, `calls` calls per submit, interleaved rep by rep after a
/// warm-up (kernel compilation). `None` marks a variant that cannot run the shape.
fn time_all(
    g: &std::sync::Arc<Device>,
    runs: &[Run],
    reps: usize,
    calls: usize,
) -> Vec<Option<f64>> {
    let mut ts: Vec<Vec<f64>> = vec![Vec::new(); runs.len()];
    for rep in 0..=reps {
        for (i, run) in runs.iter().enumerate() {
            let Some(run) = run else { continue };
            let t0 = Instant::now();
            let mut rec = Recorder::new(g);
            for _ in 0..if rep == 0 { 1 } else { calls } {
                run(&mut rec);
            }
            rec.submit().expect("submit");
            g.wait_idle().expect("wait");
            if rep > 0 {
                ts[i].push(t0.elapsed().as_secs_f64() * 1e3 / calls as f64);
            }
        }
    }
    ts.into_iter()
        .map(|mut t| {
            if t.is_empty() {
                return None;
            }
            t.sort_by(f64::total_cmp);
            Some(t[t.len() / 2])
        })
        .collect()
}

fn print_row(name: &str, names: &[&str], times: &[Option<f64>], static_name: &str) {
    let cells: Vec<String> = times
        .iter()
        .map(|t| t.map(|t| format!("{t:.3}")).unwrap_or_else(|| "-".into()))
        .collect();
    let best = names
        .iter()
        .zip(times)
        .filter_map(|(n, t)| t.map(|t| (*n, t)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    let time_of = |n: &str| names.iter().position(|x| *x == n).and_then(|i| times[i]);
    let ratio = match (time_of("flash"), time_of(static_name)) {
        (Some(f), Some(s)) => format!("{:.2}", f / s),
        _ => "-".into(),
    };
    println!(
        "| {name} | {} | {static_name} | {} | {ratio} |",
        cells.join(" | "),
        best.map(|b| b.0).unwrap_or("-")
    );
}

/// Generic attention on the base model's shapes (D = 64, 12 heads; 585 = 577 image tokens + 8 prompt).
fn attention_rows(g: &std::sync::Arc<Device>, reps: usize) {
    // name, B, Bk, Tq, Tk, causal, kv_len, q_offset
    type Shape = (
        &'static str,
        usize,
        usize,
        usize,
        usize,
        bool,
        Option<u32>,
        u32,
    );
    let shapes: [Shape; 5] = [
        (
            "encoder self B1 T585 H12 D64",
            1,
            1,
            585,
            585,
            false,
            None,
            0,
        ),
        ("decoder cross B1 Tq1 Tk585", 1, 1, 1, 585, false, None, 0),
        (
            "decoder cross B3 Tq1 Tk585 Bk1",
            3,
            1,
            1,
            585,
            false,
            None,
            0,
        ),
        (
            "decoder self B1 Tq1 kv20/1024",
            1,
            1,
            1,
            1024,
            false,
            Some(20),
            19,
        ),
        (
            "decoder self B3 Tq1 kv200/1024",
            3,
            3,
            1,
            1024,
            false,
            Some(200),
            199,
        ),
    ];
    let (h, d) = (12, 64);
    let hd = h * d;
    for (name, b, bk, tq, tk, causal, kv_len, q_offset) in shapes {
        let mut rng = Rng::new(1);
        let q = Tensor::from_f32(g, &[b, tq, hd], &rng.vec(b * tq * hd, 1.0), "q").unwrap();
        let (kx, vx) = (rng.vec(bk * tk * hd, 1.0), rng.vec(bk * tk * hd, 1.0));
        let k = Tensor::from_f32(g, &[bk, tk, hd], &kx, "k").unwrap();
        let v = Tensor::from_f32(g, &[bk, tk, hd], &vx, "v").unwrap();
        let k16 = Tensor::from_f32_as_f16(g, &[bk, tk, hd], &kx, "k16").unwrap();
        let v16 = Tensor::from_f32_as_f16(g, &[bk, tk, hd], &vx, "v16").unwrap();
        let out = std::rc::Rc::new(Tensor::zeros(g, &[b, tq, hd], DType::F32, "out").unwrap());
        let rc = std::rc::Rc::new;
        let (q, k, v, k16, v16) = (rc(q), rc(k), rc(v), rc(k16), rc(v16));
        let calls = if tq > 1 { 1 } else { 8 };
        // The decoder's shapes also with f16 K/V.
        let kv_sets = if tq == 1 {
            vec![(k.clone(), v.clone()), (k16, v16)]
        } else {
            vec![(k.clone(), v.clone())]
        };
        let runs: Vec<Run> = kv_sets
            .iter()
            .flat_map(|kv| {
                AttnVariant::ALL
                    .into_iter()
                    .map(move |var| (kv.clone(), var))
            })
            .map(|((k, v), var)| {
                if !var.supports(&g.caps, d) {
                    return None;
                }
                let (q, out) = (q.clone(), out.clone());
                let f: Box<dyn Fn(&mut Recorder)> = Box::new(move |rec: &mut Recorder| {
                    let opts = AttnOpts {
                        heads: h,
                        scale: 0.125,
                        causal,
                        kv_len,
                        q_offset,
                        mask: None,
                        ..Default::default()
                    };
                    attention(
                        rec,
                        &q,
                        &k,
                        &v,
                        &AttnOpts {
                            variant: Some(var),
                            ..opts
                        },
                        &out,
                    )
                    .expect("attention");
                });
                Some(f)
            })
            .collect();
        let times = time_all(g, &runs, reps, calls);
        let names: Vec<&str> = AttnVariant::ALL.iter().map(|v| v.name()).collect();
        for (i, row) in times.chunks(names.len()).enumerate() {
            let label = match i {
                0 => name.to_string(),
                _ => format!("{name} kv f16"),
            };
            print_row(
                &label,
                &names,
                row,
                choose_attention_variant(&g.caps, d).name(),
            );
        }
    }
}

/// DaViT window attention over the fused qkv (stage 0 of base: C = 128, 4 heads, D = 32). 64 windows
/// per call (a quarter of stage 0 at 768 px: the cost per window does not depend on the count).
fn window_rows(g: &std::sync::Arc<Device>, reps: usize) {
    let (c, heads, nw) = (128, 4, 64);
    for ws in [12usize, 7] {
        let t = ws * ws;
        let mut rng = Rng::new(2);
        let qkv = std::rc::Rc::new(
            Tensor::from_f32(g, &[nw, t, 3 * c], &rng.vec(nw * t * 3 * c, 1.0), "qkv").unwrap(),
        );
        let out = std::rc::Rc::new(Tensor::zeros(g, &[nw, t, c], DType::F32, "win").unwrap());
        // Columns of the table: tiled (not a window kernel), rows, flash, flash_split (not one either).
        let runs: Vec<Run> = [
            None,
            Some(WindowAttnVariant::Rows),
            Some(WindowAttnVariant::Flash),
            None,
        ]
        .into_iter()
        .map(|var| {
            let var = var.filter(|v| v.supports(&g.caps, c, heads))?;
            let (qkv, out) = (qkv.clone(), out.clone());
            let f: Box<dyn Fn(&mut Recorder)> = Box::new(move |rec: &mut Recorder| {
                window_attention_variant(rec, var, &qkv, heads, 0.17, &out)
                    .expect("window attention");
            });
            Some(f)
        })
        .collect();
        let times = time_all(g, &runs, reps, 1);
        let static_name = if window_attn::supported(c, heads) {
            "rows"
        } else {
            "-"
        };
        print_row(
            &format!("window {ws}x{ws} nW{nw} C{c} H{heads} D32"),
            &["tiled", "rows", "flash", "flash_split"],
            &times,
            static_name,
        );
    }
}
