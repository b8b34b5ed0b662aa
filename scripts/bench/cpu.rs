//! CPU kernel benchmark (`cargo bench --bench cpu`): GEMM throughput of the CPU backend at
//! Florence-2-base's linear shapes, the chosen path (`cpu::linear`, on the `gemm` crate) against the
//! alternatives measured to choose it: the `gemm` crate called directly, `matrixmultiply` (threaded) and
//! the portable blocked loop of `cpu::gemm` (wasm runs the packed GEMM instead:
//! `scripts/bench/browser_cpu_gemm.sh`); `cpu::linear` with f16/q8/q4 weights (dequantized per panel);
//! the decode GEMV per weight format (M = 1 and 3) with its weight bandwidth, q8/q4 with both dots
//! (`QuantDot::Exact` and `QuantDot::Int8`); and the machine's ceilings measured in the same run: an
//! AVX-512 (else AVX2) FMA loop on every thread (the arithmetic peak) and numpy/OpenBLAS GEMM
//! (`python3 -c`, when numpy is installed).
//!
//! Every figure is a median of 5 samples taken round-robin over the variants of a shape (so load from
//! other processes on this shared machine hits all of them alike), wall time, rayon's default threads
//! (the core count). `CPU_BENCH_ONLY=<substring>` runs only shapes whose label contains it. Under
//! `cargo test` (no `--bench` argument) it only builds.

use std::time::Instant;

#[path = "util.rs"]
mod util;
use util::Rng;

use florence2_wasm::cpu::gemm::{sgemm_nt_with, Backend, MatRef};
use florence2_wasm::cpu::linear::{linear, linear_rows, LinearRef};
use florence2_wasm::cpu::qdot_int8::{Int8Kernel, QuantDot, QuantX};
use florence2_wasm::cpu::{par, Weight};
use florence2_wasm::ops::matmul::Act;
use florence2_wasm::quant::{quantize_rows, QFormat};
use half::f16;

/// (label, M, K, N): the base model's GEMMs at 768 px (DaViT stage MLPs and qkv, the projector, the
/// BART encoder over 590 tokens).
const GEMMS: &[(&str, usize, usize, usize)] = &[
    ("davit s0 fc1", 36864, 128, 512),
    ("davit s1 qkv", 9216, 256, 768),
    ("davit s1 fc2", 9216, 1024, 256),
    ("davit s2 fc1", 2304, 512, 2048),
    ("davit s2 fc2", 2304, 2048, 512),
    ("davit s3 fc1", 576, 1024, 4096),
    ("projector", 577, 1024, 768),
    ("encoder qkv", 590, 768, 768),
    ("encoder fc1", 590, 768, 3072),
    ("encoder fc2", 590, 3072, 768),
];

/// (label, K, N) of the decode linears.
const GEMVS: &[(&str, usize, usize)] = &[
    ("dec proj", 768, 768),
    ("dec fc1", 768, 3072),
    ("dec fc2", 3072, 768),
    ("LM head", 768, 51328),
];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median seconds per call of each closure, sampled round-robin (each sample >= 50 ms of calls).
fn time_all(fs: &mut [Box<dyn FnMut() + '_>]) -> Vec<f64> {
    let mut reps = vec![1usize; fs.len()];
    for (f, r) in fs.iter_mut().zip(&mut reps) {
        let t = Instant::now();
        f(); // warm-up, sizes the batch
        *r = ((0.05 / t.elapsed().as_secs_f64().max(1e-9)) as usize).clamp(1, 1000);
    }
    let mut samples = vec![Vec::new(); fs.len()];
    for _ in 0..5 {
        for ((f, &r), s) in fs.iter_mut().zip(&reps).zip(&mut samples) {
            let t = Instant::now();
            for _ in 0..r {
                f();
            }
            s.push(t.elapsed().as_secs_f64() / r as f64);
        }
    }
    samples.into_iter().map(median).collect()
}

fn quant(fmt: QFormat, k: usize, w: &[f32]) -> Vec<u8> {
    let mut b = Vec::new();
    quantize_rows(fmt, k, w, &mut b).expect("quantize");
    b
}

fn gemm_row(label: &str, (m, k, n): (usize, usize, usize)) {
    let mut rng = Rng(0x9E37_79B9 ^ (m * k * n) as u64);
    let x = rng.fill(m * k, 1.0);
    let w = rng.fill(n * k, 0.5);
    let bias = rng.fill(n, 0.5);
    let wh: Vec<f16> = w.iter().map(|&v| f16::from_f32(v)).collect();
    let (q8, q4) = (quant(QFormat::Q8, k, &w), quant(QFormat::Q4, k, &w));
    let mut outs = vec![vec![0f32; m * n]; 8];
    let [o0, o1, o2, o3, o4, o5, o6, _] = &mut outs[..] else {
        return;
    };
    let lin = |wt| LinearRef {
        w: wt,
        n,
        k,
        bias: Some(&bias),
    };
    let (xm, wm) = (MatRef::new(&x, m, k), MatRef::new(&w, n, k));
    let mut fs: Vec<Box<dyn FnMut() + '_>> = vec![
        Box::new(|| linear(&lin(Weight::F32(&w)), &x, Act::None, o0).expect("linear")),
        Box::new(|| sgemm_nt_with(Backend::Gemm, xm, wm, o1, n, 0).expect("gemm")),
        Box::new(|| mm_sgemm(&x, &w, (m, k, n), o2)),
        Box::new(|| sgemm_nt_with(Backend::Blocked, xm, wm, o3, n, 0).expect("blocked")),
        Box::new(|| linear(&lin(Weight::F16(&wh)), &x, Act::None, o4).expect("f16")),
        Box::new(|| linear(&lin(Weight::Quant(QFormat::Q8, &q8)), &x, Act::None, o5).expect("q8")),
        Box::new(|| linear(&lin(Weight::Quant(QFormat::Q4, &q4)), &x, Act::None, o6).expect("q4")),
    ];
    let secs = time_all(&mut fs);
    let gf = |s: f64| 2.0 * (m * k * n) as f64 / s * 1e-9;
    let cells: Vec<String> = secs.iter().map(|&s| format!("{:>8.1}", gf(s))).collect();
    println!("{label:<14} {m:>5}x{k:>4}x{n:>4} {}", cells.join(" "));
}

/// `matrixmultiply`'s threaded sgemm: out (M, N) = x (M, K) @ w (N, K)^T.
fn mm_sgemm(x: &[f32], w: &[f32], (m, k, n): (usize, usize, usize), out: &mut [f32]) {
    // SAFETY: x is (M, K) row-major, w^T is read as (K, N) with strides (1, K), out is (M, N) row-major;
    // all three slices hold exactly those elements.
    unsafe {
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
            out.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

fn gemv_row(label: &str, (k, n): (usize, usize), m: usize) {
    let mut rng = Rng(0x51 ^ (k * n) as u64);
    let x = rng.fill(m * k, 1.0);
    let w = rng.fill(n * k, 0.5);
    let wh: Vec<f16> = w.iter().map(|&v| f16::from_f32(v)).collect();
    let (q8, q4) = (quant(QFormat::Q8, k, &w), quant(QFormat::Q4, k, &w));
    let bytes = [n * k * 4, n * k * 2, q8.len(), q4.len(), q8.len(), q4.len()];
    let mut outs = vec![vec![0f32; m * n]; 6];
    let [o0, o1, o2, o3, o4, o5] = &mut outs[..] else {
        return;
    };
    let lin = |wt| LinearRef {
        w: wt,
        n,
        k,
        bias: None,
    };
    let quant = |fmt, b, o: &mut [f32], dot| {
        linear_rows(
            &lin(Weight::Quant(fmt, b)),
            &x,
            Act::None,
            None,
            o,
            (false, dot),
        )
        .expect("quantized")
    };
    let mut fs: Vec<Box<dyn FnMut() + '_>> = vec![
        Box::new(|| linear(&lin(Weight::F32(&w)), &x, Act::None, o0).expect("f32")),
        Box::new(|| linear(&lin(Weight::F16(&wh)), &x, Act::None, o1).expect("f16")),
        Box::new(|| quant(QFormat::Q8, &q8, o2, QuantDot::Exact)),
        Box::new(|| quant(QFormat::Q4, &q4, o3, QuantDot::Exact)),
        Box::new(|| quant(QFormat::Q8, &q8, o4, QuantDot::Int8)),
        Box::new(|| quant(QFormat::Q4, &q4, o5, QuantDot::Int8)),
    ];
    let secs = time_all(&mut fs);
    let cells: Vec<String> = secs
        .iter()
        .zip(bytes)
        .map(|(&s, b)| format!("{:>7.3} ms {:>5.1} GB/s", s * 1e3, b as f64 / s * 1e-9))
        .collect();
    println!("{label:<9} M{m} {k:>4}x{n:>5}  {}", cells.join(" | "));
}

/// The int8 row-dot kernels one by one on one thread (every weight row of the shape with one x row):
/// time per call and weight bytes per second.
fn int8_kernels_row(label: &str, (k, n): (usize, usize)) {
    let mut rng = Rng(0x52 ^ (k * n) as u64);
    let x = rng.fill(k, 1.0);
    let w = rng.fill(n * k, 0.5);
    let qx = QuantX::new(&x, k);
    for fmt in [QFormat::Q8, QFormat::Q4] {
        let q = quant(fmt, k, &w);
        let rb = fmt.row_bytes(k);
        let kernels = Int8Kernel::available();
        let mut outs = vec![vec![0f32; n]; kernels.len()];
        let mut fs: Vec<Box<dyn FnMut() + '_>> = Vec::new();
        for (&kern, o) in kernels.iter().zip(outs.iter_mut()) {
            let (q, qx) = (&q, &qx);
            fs.push(Box::new(move || {
                for (r, d) in q.chunks_exact(rb).zip(o.chunks_exact_mut(1)) {
                    qx.row_dots_with(kern, fmt, r, 0, d);
                }
            }));
        }
        let secs = time_all(&mut fs);
        let cells: Vec<String> = kernels
            .iter()
            .zip(secs)
            .map(|(kern, s)| {
                let gb = q.len() as f64 / s * 1e-9;
                format!("{kern:?} {:.3} ms {gb:.1} GB/s", s * 1e3)
            })
            .collect();
        println!("{label:<9} {fmt:?} {k:>4}x{n:>5}  {}", cells.join(" | "));
    }
}

/// Arithmetic peak: independent FMA chains on every rayon thread, GFLOP/s.
fn fma_peak() -> (f64, &'static str) {
    #[cfg(target_arch = "x86_64")]
    {
        let wide = is_x86_feature_detected!("avx512f");
        if wide || (is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            let iters = 20_000_000usize;
            let lanes = if wide { 16.0 } else { 8.0 };
            let t = Instant::now();
            let sums = par::map(par::threads(), |_| {
                // SAFETY: the features were detected above.
                unsafe {
                    if wide {
                        fma512(iters)
                    } else {
                        fma256(iters)
                    }
                }
            });
            let s = t.elapsed().as_secs_f64();
            std::hint::black_box(sums);
            let flops = par::threads() as f64 * iters as f64 * 12.0 * lanes * 2.0;
            return (
                flops / s * 1e-9,
                if wide { "AVX-512 FMA" } else { "AVX2 FMA" },
            );
        }
    }
    (0.0, "no FMA loop for this target")
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::incompatible_msrv)]
#[target_feature(enable = "avx512f")]
unsafe fn fma512(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
    let mut acc = [_mm512_set1_ps(1.0); 12];
    for _ in 0..iters {
        for r in acc.iter_mut() {
            *r = _mm512_fmadd_ps(*r, a, b);
        }
    }
    acc.iter().map(|&r| _mm512_reduce_add_ps(r)).sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma256(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
    let mut acc = [_mm256_set1_ps(1.0); 12];
    for _ in 0..iters {
        for r in acc.iter_mut() {
            *r = _mm256_fmadd_ps(*r, a, b);
        }
    }
    let mut out = [0f32; 8];
    let s = acc
        .iter()
        .fold(_mm256_setzero_ps(), |s, &r| _mm256_add_ps(s, r));
    _mm256_storeu_ps(out.as_mut_ptr(), s);
    out.iter().sum()
}

/// numpy/OpenBLAS GEMM GFLOP/s at a square 2048 and at one model shape, same thread count.
fn numpy_gemm() -> String {
    let code = "import numpy as np, time\n\
        def g(m,k,n):\n  a=np.random.rand(m,k).astype(np.float32); b=np.random.rand(k,n).astype(np.float32); a@b\n  \
        ts=[]\n  for _ in range(5):\n    t=time.perf_counter(); a@b; ts.append(time.perf_counter()-t)\n  \
        return 2*m*k*n/sorted(ts)[2]*1e-9\n\
        print('2048^3 %.1f, 2304x512x2048 %.1f, 590x768x3072 %.1f GFLOP/s' % (g(2048,2048,2048), g(2304,512,2048), g(590,768,3072)))";
    let t = par::threads().to_string();
    match std::process::Command::new("python3")
        .args(["-c", code])
        .env("OPENBLAS_NUM_THREADS", &t)
        .env("OMP_NUM_THREADS", &t)
        .output()
    {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        Ok(o) => format!(
            "not run ({})",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ),
        Err(e) => format!("not run ({e})"),
    }
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    // matrixmultiply's threading reads this once.
    std::env::set_var("MATMUL_NUM_THREADS", par::threads().to_string());
    let only = std::env::var("CPU_BENCH_ONLY").unwrap_or_default();
    println!("threads: {}", par::threads());
    let (peak, how) = fma_peak();
    println!("ceiling, {how} loop on every thread: {peak:.1} GFLOP/s");
    println!("ceiling, numpy/OpenBLAS: {}", numpy_gemm());
    println!(
        "\nGEMM GFLOP/s (wall, median of 5), f32 unless named; linear = the chosen path (+bias)"
    );
    println!(
        "{:<14} {:>15} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "shape", "MxKxN", "linear", "gemm", "mmult", "blocked", "lin f16", "lin q8", "lin q4"
    );
    for &(label, m, k, n) in GEMMS.iter().filter(|s| s.0.contains(&only)) {
        gemm_row(label, (m, k, n));
    }
    println!(
        "\nDecode GEMV (cpu::linear, M <= 4): time per call and weight bytes per second; q8/q4 with \
         the exact dot (weights widened to f32) and the int8 dot (x quantized per call, {:?})",
        florence2_wasm::cpu::qdot_int8::Int8Kernel::best()
    );
    println!(
        "{:<22} {:^22} | {:^22} | {:^22} | {:^22} | {:^22} | {:^22}",
        "", "f32", "f16", "q8 exact", "q4 exact", "q8 int8", "q4 int8"
    );
    for &(label, k, n) in GEMVS.iter().filter(|s| s.0.contains(&only)) {
        for m in [1, 3] {
            gemv_row(label, (k, n), m);
        }
    }
    println!("\nint8 row-dot kernels, one thread, M = 1 (every weight row once)");
    for &(label, k, n) in GEMVS.iter().filter(|s| s.0.contains(&only)) {
        int8_kernels_row(label, (k, n));
    }
}
