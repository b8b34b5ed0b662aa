//! Decode GEMV benchmark: the linear variants that run decode-sized inputs (M = 1 and 3 rows: one token
//! per beam), per weight format (f32, f16, q8, q4), at Florence-2-base's decoder shapes and the LM head,
//! timed on the GPU (timestamp queries: submit and readback excluded), with the weight bytes each call
//! reads and the resulting GB/s; beside bandwidth ceilings measured in the same run: a CPU memcpy (one
//! thread and two), the adapter's buffer-to-buffer copy, and a shader that only reads 64 MiB in three
//! access patterns (`gemv_read.wgsl`: a stream per lane of 1 or 4 KiB, a workgroup sweeping with lanes
//! on consecutive words, an 8-lane chunk sweeping its own run).
//!
//! `cargo bench --bench gemv` (`GEMV_BENCH_VARIANTS=<substring,...>` times only variants whose name
//! contains one of them; `GEMV_BENCH_ONLY=<substring>` only the shapes whose label contains it, e.g.
//! `none` for the ceilings alone; `GEMV_BENCH_ROWS=1,3`; `GEMV_BENCH_FORMATS=f32,f16,q8,q4`;
//! `GEMV_BENCH_SPIN=S` keeps running the first cell of each shape for S seconds, for a profiler). Each
//! cell (format, variant): one warm-up call (kernel compilation), then 7 samples alternating over all
//! cells of a (shape, M), each sample a batch of calls of >= 2 ms GPU time, timed twice: GPU timestamps
//! (the GB/s column) and the CPU time of lavapipe's threads (the ratio column: the work done, which
//! other load on this shared 2-core machine inflates far less than wall or GPU time); medians per call.
//! Under `cargo test` (no `--bench` argument) it only builds.

use std::sync::Arc;
use std::time::Instant;

#[path = "util.rs"]
mod util;
use util::{cpu_secs, Rng};

use florence2_wasm::gpu::{
    DType, Device, DeviceOptions, Kernel, QFormat, Recorder, Shader, Tensor,
};
use florence2_wasm::ops::matmul::{self, LinearVariant};

/// (label, K, N) of the decode linears of Florence-2-base (d_model 768, ffn 3072, vocabulary 51328).
const SHAPES: &[(&str, usize, usize)] = &[
    ("proj 768->768", 768, 768),
    ("fc1 768->3072", 768, 3072),
    ("fc2 3072->768", 3072, 768),
    ("LM head 768->51328", 768, 51328),
];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn weight(gpu: &Device, fmt: DType, n: usize, k: usize, data: &[f32]) -> Tensor {
    match fmt {
        DType::F32 => Tensor::from_f32(gpu, &[n, k], data, "w"),
        DType::F16 => Tensor::from_f32_as_f16(gpu, &[n, k], data, "w"),
        DType::Q8 => Tensor::from_f32_quantized(gpu, &[n, k], data, QFormat::Q8, "w"),
        _ => Tensor::from_f32_quantized(gpu, &[n, k], data, QFormat::Q4, "w"),
    }
    .expect("weight")
}

/// GB/s of a CPU memcpy of `bytes` with `threads` threads (bytes read + written counted), best of 5.
fn memcpy_bandwidth(bytes: usize, threads: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        std::thread::scope(|s| {
            let chunk = bytes / threads;
            for (d, sc) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
                s.spawn(move || d.copy_from_slice(sc));
            }
        });
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&dst);
    2.0 * bytes as f64 / best / 1e9
}

/// CPU ms (all threads) per call of `record`, `calls` calls in one submit, waited for.
fn cpu_ms(gpu: &Arc<Device>, calls: usize, record: &dyn Fn(&mut Recorder)) -> f64 {
    let mut rec = Recorder::new(gpu);
    for _ in 0..calls {
        record(&mut rec);
    }
    let c = cpu_secs();
    rec.submit().expect("submit");
    gpu.wait_idle().expect("wait");
    (cpu_secs() - c) * 1e3 / calls as f64
}

/// Median GPU ms per call of `record` (batches of calls reaching >= 2 ms, `samples` batches).
fn gpu_ms(gpu: &Arc<Device>, calls: usize, record: &dyn Fn(&mut Recorder)) -> f64 {
    let mut rec = Recorder::new_timed(gpu).expect("timestamp queries");
    for _ in 0..calls {
        record(&mut rec);
    }
    pollster::block_on(rec.submit_timed()).expect("timed submit") / calls as f64
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("gemv bench: run with `cargo bench --bench gemv`");
        return;
    }
    let gpu = pollster::block_on(Device::new(DeviceOptions::default())).expect("a GPU adapter");
    println!("adapter: {}", gpu.describe());
    let filter: Vec<String> = std::env::var("GEMV_BENCH_VARIANTS")
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    let only = std::env::var("GEMV_BENCH_ONLY").unwrap_or_default();
    let rows: Vec<usize> = std::env::var("GEMV_BENCH_ROWS")
        .unwrap_or_else(|_| "1,3".into())
        .split(',')
        .map(|s| s.trim().parse().expect("GEMV_BENCH_ROWS"))
        .collect();
    let formats: Vec<DType> = std::env::var("GEMV_BENCH_FORMATS")
        .unwrap_or_else(|_| "f32,f16,q8,q4".into())
        .split(',')
        .map(|s| match s.trim() {
            "f32" => DType::F32,
            "f16" => DType::F16,
            "q8" => DType::Q8,
            "q4" => DType::Q4,
            o => panic!("GEMV_BENCH_FORMATS: unknown format {o}"),
        })
        .collect();

    // Ceilings: CPU memcpy (256 MiB, larger than any cache) and the adapter's buffer copy.
    let mb = 256 << 20;
    println!(
        "ceiling: CPU memcpy 256 MiB: {:.1} GB/s (1 thread), {:.1} GB/s (2 threads), read + write bytes",
        memcpy_bandwidth(mb, 1),
        memcpy_bandwidth(mb, 2)
    );
    {
        let n = 32 << 20;
        let a = Tensor::zeros(&gpu, &[n], DType::F32, "copy.a").expect("a");
        let b = Tensor::zeros(&gpu, &[n], DType::F32, "copy.b").expect("b");
        // Timestamps cover compute passes only: a copy is timed by the wall clock (submit + wait).
        let ms = median(
            (0..4)
                .map(|_| {
                    let mut rec = Recorder::new(&gpu);
                    rec.copy(&a, &b).expect("copy");
                    let t = Instant::now();
                    rec.submit().expect("submit");
                    gpu.wait_idle().expect("wait");
                    t.elapsed().as_secs_f64() * 1e3
                })
                .skip(1)
                .collect(),
        );
        println!(
            "ceiling: GPU buffer copy 128 MiB: {ms:.2} ms wall, {:.1} GB/s (read + write)",
            2.0 * (n * 4) as f64 / ms / 1e6
        );
    }

    // Ceiling: a shader that only reads (XOR of vec4<u32> words), 64 MiB, both access patterns.
    {
        const WG: u32 = 64;
        static READ: Shader = Shader {
            name: "bench_read",
            source: include_str!("gemv_read.wgsl"),
            consts: &[("WG", WG)],
        };
        let words = 4 << 20; // vec4<u32> words: 64 MiB
        let src = Tensor::zeros(&gpu, &[words * 4], DType::U32, "read.src").expect("src");
        for (contig, chunk, per) in [
            (true, false, 64usize),
            (false, false, 64),
            (false, false, 256),
            (false, true, 64),
            (false, true, 256),
        ] {
            let total = words / per;
            let dst = Tensor::zeros(&gpu, &[total], DType::U32, "read.dst").expect("dst");
            let params: [u32; 4] = [per as u32, total as u32, 0, 0];
            let ov = [
                ("CONTIG", if contig { 1.0 } else { 0.0 }),
                ("CHUNK", if chunk { 1.0 } else { 0.0 }),
            ];
            let k = Kernel::new(&READ, "read_words").with(&ov);
            let rec_one = |rec: &mut Recorder| {
                rec.dispatch(
                    &k,
                    &params,
                    &[src.binding(&gpu).expect("b"), dst.binding(&gpu).expect("b")],
                    [(total as u32).div_ceil(WG), 1, 1],
                )
                .expect("dispatch");
            };
            gpu_ms(&gpu, 1, &rec_one);
            let g: Vec<f64> = (0..5).map(|_| gpu_ms(&gpu, 1, &rec_one)).collect();
            let c: Vec<f64> = (0..5).map(|_| cpu_ms(&gpu, 1, &rec_one)).collect();
            let (g, c) = (median(g), median(c));
            println!(
                "ceiling: shader read of 64 MiB ({}, {} KiB per lane): {g:.2} ms GPU, {c:.2} ms CPU: \
                 {:.1} GB/s",
                if contig {
                    "workgroup sweeps, lanes on consecutive words"
                } else if chunk {
                    "each SIMD chunk of 8 lanes sweeps its run, lanes on consecutive words"
                } else {
                    "a stream per lane"
                },
                per / 64,
                (words * 16) as f64 / g / 1e6
            );
        }
    }

    let variants: Vec<LinearVariant> = LinearVariant::ALL
        .into_iter()
        .filter(|v| filter.is_empty() || filter.iter().any(|f| v.name().contains(f.as_str())))
        .collect();
    println!(
        "\n{:<20} {:>2} {:>4} {:<20} {:>9} {:>9} {:>10} {:>8} {:>9}",
        "shape", "M", "fmt", "variant", "GPU ms", "CPU ms", "MB read", "GB/s", "vs f32"
    );
    for &(label, k, n) in SHAPES {
        if !label.contains(only.as_str()) {
            continue;
        }
        let data = Rng(0x1234_5678 ^ (k * n) as u64).fill(n * k, (3.0 / k as f32).sqrt());
        let bias = Tensor::from_f32(&gpu, &[n], &Rng(5).fill(n, 0.1), "b").expect("bias");
        for &m in &rows {
            let x = Tensor::from_f32(&gpu, &[m, k], &Rng(9).fill(m * k, 1.0), "x").expect("x");
            let out = Tensor::zeros(&gpu, &[m, n], DType::F32, "out").expect("out");
            // Every (format, variant) cell of this (shape, M), timed in alternation.
            let ws: Vec<(DType, Tensor)> = formats
                .iter()
                .map(|&f| (f, weight(&gpu, f, n, k, &data)))
                .collect();
            let caps = &gpu.caps;
            let mut cells: Vec<(usize, LinearVariant)> = Vec::new();
            for (wi, (fmt, _)) in ws.iter().enumerate() {
                for &v in &variants {
                    let decode_kernel =
                        matches!(v, LinearVariant::SubgroupC4 | LinearVariant::Reg4x4)
                            || v.name().starts_with("gemv");
                    if decode_kernel && v.supports(caps, m, k, *fmt) {
                        cells.push((wi, v));
                    }
                }
            }
            let call = |(wi, v): (usize, LinearVariant), rec: &mut Recorder| {
                matmul::linear(
                    rec,
                    &x,
                    &ws[wi].1,
                    matmul::LinearArgs::default().bias(Some(&bias)).variant(v),
                    &out,
                )
                .expect("linear");
            };
            // Warm-up (compile) and batch size per cell: >= 2 ms of GPU time per sample.
            let batch: Vec<usize> = cells
                .iter()
                .map(|&c| {
                    let one = gpu_ms(&gpu, 1, &|rec| call(c, rec));
                    ((2.0 / one.max(1e-3)).ceil() as usize).clamp(1, 64)
                })
                .collect();
            let mut times = vec![Vec::new(); cells.len()];
            let mut cpu = vec![Vec::new(); cells.len()];
            for _ in 0..7 {
                for (i, &c) in cells.iter().enumerate() {
                    times[i].push(gpu_ms(&gpu, batch[i], &|rec| call(c, rec)));
                    cpu[i].push(cpu_ms(&gpu, batch[i], &|rec| call(c, rec)));
                }
            }
            let wall: Vec<f64> = times.into_iter().map(median).collect();
            let cpu: Vec<f64> = cpu.into_iter().map(median).collect();
            // Ratios from CPU time (the work done; the machine is shared), GB/s from GPU time.
            let ms = &cpu;
            let f32_best = cells
                .iter()
                .zip(ms)
                .filter(|((wi, _), _)| ws[*wi].0 == DType::F32)
                .map(|(_, &t)| t)
                .fold(f64::NAN, f64::min);
            for ((&(wi, v), &t), &gt) in cells.iter().zip(ms).zip(&wall) {
                let (fmt, w) = &ws[wi];
                let bytes = w.byte_size() as f64;
                let static_pick = matmul::choose_linear_variant_for(caps, m, k, *fmt) == v;
                println!(
                    "{label:<20} {m:>2} {:>4} {:<20} {gt:>9.3} {t:>9.3} {:>10.2} {:>8.2} {:>9.3}",
                    format!("{fmt:?}").to_lowercase(),
                    format!("{}{}", v.name(), if static_pick { "*" } else { "" }),
                    bytes / 1e6,
                    bytes / gt / 1e6,
                    t / f32_best
                );
            }
            // GEMV_BENCH_SPIN=S: keep running the first cell for S seconds (for a profiler).
            if let Some(spin) = std::env::var("GEMV_BENCH_SPIN")
                .ok()
                .and_then(|s| s.parse::<f64>().ok())
            {
                let t = Instant::now();
                while t.elapsed().as_secs_f64() < spin {
                    gpu_ms(&gpu, 4, &|rec| call(cells[0], rec));
                }
            }
        }
    }
    println!(
        "(* = the static choice; GPU ms: timestamps, what GB/s uses; CPU ms: lavapipe's threads' CPU time \
         per call (the work, robust to other load on a shared machine); vs f32 = CPU ms / the best f32 \
         CPU ms of the same shape and M)"
    );
}
