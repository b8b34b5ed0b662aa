//! Kernel benchmark: GFLOP/s of the matmul kernels at the shapes Florence-2-base runs, per variant, side by
//! side with a CPU baseline (`matrixmultiply` sgemm, 2 threads) measured in the same run.
//!
//! `cargo bench --bench kernels` (default: ~2-3 minutes on 2 cores with lavapipe; the slow scalar kernel
//! only on the decode shapes). `KERNELS_BENCH_FULL=1` runs every variant on every shape with more repeats.
//! Timing: each sample records the op into a fresh `Recorder`, submits and waits for the queue to go idle
//! (submit + wait, as the model pays it); one warm-up sample (kernel compilation) is excluded; the median
//! of the samples is reported. `KERNELS_BENCH_ONLY=<substring>` runs only the linear shapes whose label
//! contains it. `KERNELS_BENCH_F16=1` runs the linear table with f16-storage weights (the `static f16`
//! column then repeats the static choice in f32). `KERNELS_BENCH_VARIANTS=<substring>` times only the
//! linear variants whose name contains it, and skips the tuner (for quick kernel experiments).

use std::sync::Arc;
use std::time::{Duration, Instant};

use florence2_wasm::gpu::registry::LinearShape;
use florence2_wasm::gpu::tune;
use florence2_wasm::gpu::{DType, Device, DeviceOptions, Recorder, Tensor};
use florence2_wasm::ops::attention::{self, AttnOpts};
use florence2_wasm::ops::linear_tune::AUTO_MAX_ROWS;
use florence2_wasm::ops::matmul::{self, LinearVariant};
use florence2_wasm::ops::{conv, norm};

struct Cfg {
    full: bool,
    /// Timed samples per measurement (the median is reported).
    reps: usize,
    /// Stop sampling a measurement once it has used this much time (at least 1 sample).
    budget: Duration,
}

/// (label, M, K, N) in the order the model runs them.
const LINEAR_SHAPES: &[(&str, usize, usize, usize)] = &[
    // The 7x7 stem's im2col GEMM at 768 px, as it ran before K padding (K = 147: scalar and tiled
    // only) and as `conv2d` runs it now (K padded to 152).
    ("stem im2col K=147", 36864, 147, 128),
    ("stem im2col K=152", 36864, 152, 128),
    ("DaViT s0 mlp.fc1", 36864, 128, 512),
    ("DaViT s2 mlp.fc1", 2304, 512, 2048),
    ("DaViT s3 mlp.fc1", 576, 1024, 4096),
    ("BART enc attn proj", 585, 768, 768),
    ("BART enc ffn fc1", 585, 768, 3072),
    ("decode proj", 1, 768, 768),
    ("decode fc1", 1, 768, 3072),
    ("LM head", 1, 768, 51328),
];

/// (label, B, M, K, N) for the batched matmul.
const BMM_SHAPES: &[(&str, usize, usize, usize, usize)] =
    &[("12 heads q k^T, 577 tok", 12, 577, 64, 577)];

/// The tuner's candidates.
fn variants() -> Vec<LinearVariant> {
    LinearVariant::ALL.to_vec()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// CPU time (seconds) used so far by all live threads of this process, lavapipe's workers and the CPU
/// baseline's pool included (Linux: /proc/self/task/*/schedstat, nanoseconds). None elsewhere.
fn process_cpu_secs() -> Option<f64> {
    let mut ns = 0u64;
    for t in std::fs::read_dir("/proc/self/task").ok()? {
        let path = t.ok()?.path().join("schedstat");
        let s = std::fs::read_to_string(path).ok()?;
        ns += s.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(ns as f64 * 1e-9)
}

/// One measurement: median wall seconds and median CPU seconds (all threads) per sample.
#[derive(Clone, Copy)]
struct Timing {
    wall: f64,
    cpu: Option<f64>,
}

/// Median seconds of `f` (one untimed warm-up first).
fn time_it(cfg: &Cfg, mut f: impl FnMut()) -> Timing {
    f();
    let start = Instant::now();
    let mut walls = Vec::new();
    let mut cpus = Vec::new();
    while walls.len() < cfg.reps && (walls.is_empty() || start.elapsed() < cfg.budget) {
        let c0 = process_cpu_secs();
        let t = Instant::now();
        f();
        walls.push(t.elapsed().as_secs_f64());
        if let (Some(a), Some(b)) = (c0, process_cpu_secs()) {
            cpus.push(b - a);
        }
    }
    let cpu = (cpus.len() == walls.len()).then(|| median(cpus));
    Timing {
        wall: median(walls),
        cpu,
    }
}

fn rand_vec(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            ((s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

/// (wall GFLOP/s, GFLOP per CPU-second x cores): the second estimates the wall figure on an otherwise idle
/// machine when other processes compete for the cores (all `cores` busy for the whole run).
fn gflops(m: usize, k: usize, n: usize, t: Timing, cores: f64) -> (f64, Option<f64>) {
    let f = 2.0 * m as f64 * k as f64 * n as f64 / 1e9;
    (f / t.wall, t.cpu.map(|c| f / c * cores))
}

/// CPU baseline: C (M, N) = X (M, K) @ W (N, K)^T with matrixmultiply's sgemm.
fn cpu_linear(cfg: &Cfg, m: usize, k: usize, n: usize) -> Timing {
    let x = rand_vec(1, m * k);
    let w = rand_vec(2, n * k);
    let mut c = vec![0f32; m * n];
    time_it(cfg, || unsafe {
        // SAFETY: the pointers and strides describe the three live, correctly sized buffers above.
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            x.as_ptr(),
            k as isize,
            1,
            w.as_ptr(),
            1,
            k as isize,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    })
}

fn gpu_linear(
    cfg: &Cfg,
    gpu: &Arc<Device>,
    variant: LinearVariant,
    dtype: DType,
    m: usize,
    k: usize,
    n: usize,
) -> Timing {
    let x = Tensor::from_f32(gpu, &[m, k], &rand_vec(1, m * k), "x").unwrap();
    let wv = rand_vec(2, n * k);
    let w = match dtype {
        DType::F16 => Tensor::from_f32_as_f16(gpu, &[n, k], &wv, "w").unwrap(),
        DType::Q8 | DType::Q4 => {
            Tensor::from_f32_quantized(gpu, &[n, k], &wv, dtype.qformat().unwrap(), "w").unwrap()
        }
        _ => Tensor::from_f32(gpu, &[n, k], &wv, "w").unwrap(),
    };
    drop(wv);
    let b = Tensor::from_f32(gpu, &[n], &rand_vec(3, n), "b").unwrap();
    let out = Tensor::zeros(gpu, &[m, n], DType::F32, "out").unwrap();
    time_it(cfg, || {
        let mut rec = Recorder::new(gpu);
        matmul::linear(
            &mut rec,
            &x,
            &w,
            matmul::LinearArgs::default()
                .bias(Some(&b))
                .variant(variant),
            &out,
        )
        .unwrap();
        rec.submit().unwrap();
        gpu.wait_idle().unwrap();
    })
}

fn gpu_bmm(cfg: &Cfg, gpu: &Arc<Device>, bt: usize, m: usize, k: usize, n: usize) -> Timing {
    let a = Tensor::from_f32(gpu, &[bt, m, k], &rand_vec(1, bt * m * k), "a").unwrap();
    let b = Tensor::from_f32(gpu, &[bt, k, n], &rand_vec(2, bt * k * n), "b").unwrap();
    let out = Tensor::zeros(gpu, &[bt, m, n], DType::F32, "out").unwrap();
    time_it(cfg, || {
        let mut rec = Recorder::new(gpu);
        matmul::matmul(&mut rec, &a, &b, &out).unwrap();
        rec.submit().unwrap();
        gpu.wait_idle().unwrap();
    })
}

type Cell = Option<(f64, Option<f64>)>;

/// "wall (cpu-normalised)" GFLOP/s.
fn cell(v: Cell) -> String {
    match v {
        Some((w, Some(c))) => format!("{:>13}", format!("{w:.2} ({c:.1})")),
        Some((w, None)) => format!("{w:>13.2}"),
        None => format!("{:>13}", "-"),
    }
}

fn main() {
    // `cargo test --all-targets` runs harness-less benches without `--bench`: only build-check them then.
    if !std::env::args().any(|a| a == "--bench") {
        println!("kernels bench: run with `cargo bench --bench kernels`");
        return;
    }
    let full = std::env::var("KERNELS_BENCH_FULL").is_ok_and(|v| v != "0");
    let (wdt, other) = if std::env::var("KERNELS_BENCH_F16").is_ok_and(|v| v != "0") {
        (DType::F16, DType::F32)
    } else {
        (DType::F32, DType::F16)
    };
    let cfg = Cfg {
        full,
        reps: if full { 7 } else { 3 },
        budget: Duration::from_secs_f64(if full { 20.0 } else { 2.0 }),
    };
    // matrixmultiply's `threading` feature reads its thread count from this variable at first use.
    if std::env::var("MATMUL_NUM_THREADS").is_err() {
        std::env::set_var("MATMUL_NUM_THREADS", "2");
    }
    let gpu = pollster::block_on(Device::new(DeviceOptions::default())).expect("a GPU adapter");
    println!("adapter: {}", gpu.describe());
    println!(
        "CPU baseline: matrixmultiply sgemm, {} threads (threading feature); timing: median of <= {} \
         submit+wait samples after one warm-up{}",
        std::env::var("MATMUL_NUM_THREADS").unwrap_or_default(),
        cfg.reps,
        if cfg.full { " (full run)" } else { "" }
    );
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    println!(
        "cells: wall GFLOP/s (in brackets: GFLOP per process CPU-second x {cores} cores, i.e. the figure an \
         otherwise idle machine would approach; compare the two when other jobs load the cores)"
    );

    println!();
    println!(
        "linear  out (M, N) = x (M, K) @ w (N, K)^T + bias   [{} weights, GFLOP/s; '-' = cannot run or \
         skipped]",
        format!("{wdt:?}").to_lowercase()
    );
    println!(
        "  static = the choice with tuning off; tuned = the tuner's pick (tuning auto, timed in this run \
         at <= {} rows); best = the fastest measured here; tuned/best = its GFLOP/s over the best's; rematch = the same ratio from 5 alternating rounds of the two (only where they differ)",
        AUTO_MAX_ROWS
    );
    let mut header = format!(
        "{:<20} {:>6} {:>5} {:>6} | {:>13} |",
        "shape", "M", "K", "N", "cpu sgemm"
    );
    for v in variants() {
        header.push_str(&format!(" {:>13}", v.name()));
    }
    header.push_str(&format!(
        " | {:>13} | {:<13} {:<13} {:<13} {:>10} {:>10}",
        format!("static {}", format!("{other:?}").to_lowercase()),
        "static",
        "tuned",
        "best",
        "tuned/best",
        "rematch"
    ));
    println!("{header}");
    let only = std::env::var("KERNELS_BENCH_ONLY").unwrap_or_default();
    let only_v = std::env::var("KERNELS_BENCH_VARIANTS").unwrap_or_default();
    let mut worst_ratio = f64::INFINITY;
    let mut worst_rematch = f64::INFINITY;
    for &(label, m, k, n) in LINEAR_SHAPES {
        if !label.contains(only.as_str()) {
            continue;
        }
        let decode = m <= matmul::GEMV_MAX_ROWS;
        let cpu = gflops(m, k, n, cpu_linear(&cfg, m, k, n), cores);
        let run = |v: LinearVariant, dt: DType| {
            Some(gflops(
                m,
                k,
                n,
                gpu_linear(&cfg, &gpu, v, dt, m, k, n),
                cores,
            ))
        };
        let mut cells: Vec<(LinearVariant, Cell)> = Vec::new();
        for v in variants() {
            // The scalar kernel is very slow at the large GEMM shapes: only in full runs there.
            let skip = (v == LinearVariant::Scalar && !(cfg.full || decode || k % 8 != 0))
                || !v.name().contains(only_v.as_str());
            let cell = if !skip && v.supports(&gpu.caps, m, k, wdt) {
                run(v, wdt)
            } else {
                None
            };
            cells.push((v, cell));
        }
        let of = |v: LinearVariant| cells.iter().find(|c| c.0 == v).and_then(|c| c.1);
        let stat = matmul::choose_linear_variant(&gpu.caps, m, k);
        if !only_v.is_empty() {
            let mut line = format!("{label:<20} {m:>6} {k:>5} {n:>6} | {} |", cell(Some(cpu)));
            for (_, c) in &cells {
                line.push_str(&format!(" {}", cell(*c)));
            }
            println!("{line}");
            continue;
        }
        let stat16 = run(stat, other);
        // The tuner, as a model load runs it (no cache, so it really times).
        gpu.choices.clear();
        let shape = LinearShape {
            m,
            n,
            k,
            format: wdt,
        };
        let report = pollster::block_on(tune::tune(
            &gpu,
            &[shape],
            tune::Tuning::Auto,
            &tune::CacheLocation::None,
        ))
        .unwrap();
        let tuned = report
            .rows
            .first()
            .and_then(|r| LinearVariant::from_name(r.chosen))
            .unwrap_or(stat);
        let best = cells
            .iter()
            .filter_map(|(v, c)| c.map(|c| (*v, c.0)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let ratio = match (of(tuned), best) {
            (Some(t), Some((_, b))) => t.0 / b,
            _ => f64::NAN,
        };
        // The cells above are measured one after another: on a loaded machine a tiny shape's cell can
        // catch a busy second. Where the tuner's pick is not the best cell, time the two again in
        // alternating rounds (same run, same conditions) and report that ratio too.
        let rematch = match best {
            Some((b, _)) if b != tuned => {
                let (mut tt, mut tb) = (Vec::new(), Vec::new());
                for _ in 0..5 {
                    tt.push(gpu_linear(&cfg, &gpu, tuned, wdt, m, k, n).wall);
                    tb.push(gpu_linear(&cfg, &gpu, b, wdt, m, k, n).wall);
                }
                median(tb) / median(tt)
            }
            _ => ratio,
        };
        if rematch.is_finite() {
            worst_rematch = worst_rematch.min(rematch);
        }
        if ratio.is_finite() {
            worst_ratio = worst_ratio.min(ratio);
        }
        let mut line = format!("{label:<20} {m:>6} {k:>5} {n:>6} | {} |", cell(Some(cpu)));
        for (_, c) in &cells {
            line.push_str(&format!(" {}", cell(*c)));
        }
        line.push_str(&format!(
            " | {} | {:<13} {:<13} {:<13} {:>10.3} {:>10.3}",
            cell(stat16),
            stat.name(),
            tuned.name(),
            best.map_or("-", |b| b.0.name()),
            ratio,
            rematch
        ));
        println!("{line}");
    }
    gpu.choices.clear();
    println!(
        "worst tuned/best over the shapes: {worst_ratio:.3}; after the alternating rematch: \
         {worst_rematch:.3} (target >= 0.9)"
    );

    println!();
    println!("matmul  out (B, M, N) = a (B, M, K) @ b (B, K, N)   [GFLOP/s]");
    for &(label, bt, m, k, n) in BMM_SHAPES {
        let t = gpu_bmm(&cfg, &gpu, bt, m, k, n);
        println!(
            "{label:<24} B={bt} M={m} K={k} N={n}: {}",
            cell(Some(gflops(bt * m, k, n, t, cores)))
        );
    }

    other_ops(&cfg, &gpu, cores);
}

fn rand_tensor(gpu: &Arc<Device>, seed: u64, shape: &[usize]) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_f32(gpu, shape, &rand_vec(seed, n), "t").unwrap()
}

fn zeros(gpu: &Arc<Device>, shape: &[usize]) -> Tensor {
    Tensor::zeros(gpu, shape, DType::F32, "out").unwrap()
}

/// Median timing of one op recorded alone, submitted and waited for.
fn time_op(cfg: &Cfg, gpu: &Arc<Device>, mut op: impl FnMut(&mut Recorder)) -> Timing {
    time_it(cfg, || {
        let mut rec = Recorder::new(gpu);
        op(&mut rec);
        rec.submit().unwrap();
        gpu.wait_idle().unwrap();
    })
}

fn print_op(label: &str, t: Timing, work: f64, unit: &str, cores: f64) {
    let norm = t
        .cpu
        .map_or(String::new(), |c| format!(" ({:.2})", work / c * cores));
    println!(
        "{label:<44} {:>9.2} ms {:>9.2}{norm} {unit}",
        t.wall * 1e3,
        work / t.wall
    );
}

/// Attention, convolution and LayerNorm at Florence-2-base shapes (same timing and normalisation as the
/// linear table). FLOPs count the multiply-adds of q k^T and p v (4 T_q T_k C per batch row).
fn other_ops(cfg: &Cfg, gpu: &Arc<Device>, cores: f64) {
    println!();
    println!("other ops at Florence-2-base shapes   [wall ms, wall rate (CPU-normalised rate)]");

    let (r, c) = (36864, 128);
    let x = rand_tensor(gpu, 1, &[r, c]);
    let g = rand_tensor(gpu, 2, &[c]);
    let b = rand_tensor(gpu, 3, &[c]);
    let out = zeros(gpu, &[r, c]);
    let t = time_op(cfg, gpu, |rec| {
        norm::layer_norm(rec, &x, &g, &b, 1e-5, &out).unwrap()
    });
    print_op(
        "layer_norm (36864, 128)",
        t,
        (2 * r * c * 4) as f64 / 1e9,
        "GB/s",
        cores,
    );

    let attn =
        |label: &str, bq: usize, tq: usize, bk: usize, tk: usize, heads: usize, ch: usize| {
            let q = rand_tensor(gpu, 1, &[bq, tq, ch]);
            let k = rand_tensor(gpu, 2, &[bk, tk, ch]);
            let v = rand_tensor(gpu, 3, &[bk, tk, ch]);
            let out = zeros(gpu, &[bq, tq, ch]);
            let opts = AttnOpts {
                heads,
                scale: ((ch / heads) as f32).powf(-0.5),
                causal: false,
                kv_len: None,
                q_offset: 0,
                mask: None,
                ..Default::default()
            };
            let t = time_op(cfg, gpu, |rec| {
                attention::attention(rec, &q, &k, &v, &opts, &out).unwrap()
            });
            let flops = 4.0 * (bq * tq * tk * ch) as f64 / 1e9;
            print_op(label, t, flops, "GFLOP/s", cores);
        };
    attn(
        "attention BART encoder (1, 585, 12x64)",
        1,
        585,
        1,
        585,
        12,
        768,
    );
    attn(
        "attention DaViT s0 windows (784, 49, 4x32)",
        784,
        49,
        784,
        49,
        4,
        128,
    );
    attn(
        "attention decode cross, 3 beams (Tk 585 shared)",
        3,
        1,
        1,
        585,
        12,
        768,
    );

    let conv_row =
        |label: &str, hw: usize, cin: usize, cout: usize, k: usize, s: usize, p: usize| {
            let ho = conv::conv_out_len(hw, k, s, p).unwrap();
            let x = rand_tensor(gpu, 1, &[1, hw, hw, cin]);
            let w = rand_tensor(gpu, 2, &[cout, cin, k, k]);
            let bias = rand_tensor(gpu, 3, &[cout]);
            let out = zeros(gpu, &[1, ho, ho, cout]);
            let t = time_op(cfg, gpu, |rec| {
                conv::conv2d(
                    rec,
                    &x,
                    conv::Conv2dWeight::Checkpoint(&w),
                    &bias,
                    conv::Conv2dArgs::new(s, p),
                    &out,
                )
                .unwrap()
            });
            let flops = 2.0 * (ho * ho * cout * cin * k * k) as f64 / 1e9;
            print_op(label, t, flops, "GFLOP/s", cores);
        };
    conv_row("conv2d 7x7 s4 p3 (768x768x3 -> 128)", 768, 3, 128, 7, 4, 3);
    conv_row(
        "conv2d 3x3 s2 p1 (192x192x128 -> 256)",
        192,
        128,
        256,
        3,
        2,
        1,
    );
}
