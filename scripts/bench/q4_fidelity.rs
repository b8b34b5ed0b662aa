//! Where the q4 error comes from, and what 4-bit alternatives would reach: `cargo bench --bench
//! q4_fidelity` (issue 10's fidelity target: q4 encoder-output cosine >= 0.99 against f32).
//!
//! Method: "host-side" quantization of the f32 model. The f32 load's matrix weights are read back,
//! passed through a quantizer on the host (quantize, then dequantize to the exact `d * q` values the
//! kernels would use) for chosen groups of tensors, and uploaded again as f32; everything else stays the
//! f32 reference. `tests/model/dtype_fidelity.rs::resident_dtypes_compute_what_their_weights_hold` shows that
//! a resident q4 load computes exactly with its dequantized values, and the first rows here show the
//! host replica of the engine's q4 giving the resident q4's figures, so these rows measure the real
//! format. Figures per fixture dir (HF-native tiny2 and tiny4: the other layouts hold the same weights)
//! over its reference cases: min cosine of `inputs_embeds` (vision + projector + prompt embedding),
//! min and mean cosine of the encoder output, and the share of teacher-forced decode steps (along f32's
//! greedy ids) whose arg-max equals f32's; and, per fixture, the f32 decoder's median top-1 margin in
//! units of the standard deviation of its logits (how close the random model's choices are).
//!
//! First, one Linear at base width with random vs structured weights and inputs (how much the output
//! error owes to the weights' and activations' structure). Then per fixture: sections (1) resident q4 vs
//! its host replica; (2) one group quantized at a time; (3) every group but
//! one (that one q8); (4) mixed q8/q4 policies with their byte cost at Florence-2-base's shapes; (5)
//! other 4-bit scalar quantizers (relative rms weight error, end to end, and the cosine implied by the
//! error if 1-cos grows as its square), with six draws of random q4-sized errors to show how much a
//! single figure owes to its particular rounding pattern; (6) synthetic weight distributions of the
//! same shapes and rms (resampled Gaussian, Student-t(4), outlier columns), the engine's q4 on a model
//! carrying them against that model's own f32.
//! `Q4_BENCH_DIRS=tiny2` limits the fixture dirs.
//!
//! Results (on the random-weight fixtures, whose matrices are Gaussian), against the engine's quantizer
//! (`src/gpu/quant.rs`): relative rms weight error of q4 per 32-weight block, the engine's quantizer
//! 9.7%; using the 16th level (`d = -m / 8`, `m` the signed weight of largest magnitude, q in [-8, 7]:
//! same layout and kernels, only the scale changes) 8.6%; a per-block least-squares scale 9.1%; a
//! 16-level codebook fitted to the data (non-uniform, needs a table lookup in the kernels) 8.2%; affine
//! min/max (q4_1-like, +0.5 bit per weight) 7.9%. The encoder-output error grows as the square of the
//! weight error (q4 -> q8 confirms it), so these give expected encoder-output cosines of about
//! 0.982-0.987 where the engine's gives 0.977-0.980, below issue 10's 0.99 either way: that needs about
//! 6.5% rms error, where the rate-distortion bound of a Gaussian is 6.25% at 4 bits per weight (4.4% at
//! the 4.5 bits the format spends with its scales; only vector codes approach it) and the best 16-level
//! scalar codebook measured 8.2%. Mixed precision: the cheapest mix measured that reaches 0.99 on both
//! fixtures keeps the DaViT attention, the projector and the whole BART encoder in q8: +35.6 MB at
//! Florence-2-base's shapes, a 178 MB q4 download against the 0.17 GB target, so no mixed policy is
//! applied either. Independent draws of q4-sized errors move the encoder-output 1-cos by 0.017..0.041 on
//! one fixture, more than the differences between these quantizers; and the greedy arg-max agreement
//! (96% -> 63% / 56% for the 16th level and least-squares scales) swings from 11% to 93% between such
//! draws on tiny2, whose random decoder has a median top-1 margin of 0.19 logit standard deviations: it
//! cannot rank quantizers. So the format stays as it is: no alternative meets the target within the q4
//! budgets.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::sync::Arc;

use common::fidelity::{reference_cases, score, top2, RefCase, Score};
use common::fixtures::fixtures;
use florence2_wasm::gpu::{readback, Device, DeviceOptions, Tensor};
use florence2_wasm::model::florence2::Florence2;
use florence2_wasm::quant::QFormat;
use florence2_wasm::weights::{self, LoadOptions, WeightDType};

/// Seeded splitmix64 + Box-Muller normals (no RNG crate among the dev-dependencies).
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        (-2.0 * self.uniform().ln()).sqrt() * (std::f64::consts::TAU * self.uniform()).cos()
    }
    /// Student-t with 4 degrees of freedom scaled to unit variance (variance of t_4 is 2).
    fn student4(&mut self) -> f64 {
        let chi2: f64 = (0..4).map(|_| self.normal().powi(2)).sum();
        self.normal() / (chi2 / 4.0).sqrt() / 2f64.sqrt()
    }
}

/// A 4-bit scalar quantizer of 32-weight blocks: the block's values as the GPU would see them.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Quantizer {
    /// The engine's format ([`florence2_wasm::quant`]): d = max|w| / 7 in f16, q in [-7, 7].
    EngineQ4,
    /// The engine's q8 (for the mixed-precision rows).
    EngineQ8,
    /// The 16th level: d = -m / 8 with m the signed weight of largest magnitude, q in [-8, 7].
    SignedMax,
    /// Per-block least-squares scale: d = s * max|w| / 7 for the best s in 0.60..=1.00 (41 steps), q
    /// clamped to [-7, 7] (clips the extremes when that lowers the block's squared error).
    LeastSquares,
    /// Affine (q4_1-like): 16 levels from the block's min to its max (f16 scale and f16 minimum: 0.5
    /// more bits per weight than the engine's format).
    Affine,
    /// A 16-level codebook fitted (Lloyd / k-means, on the values divided by their block's max|w|) to the
    /// whole model's matrix weights, scaled by max|w| per block (NF4-like, but fitted to the data:
    /// the best fixed non-uniform codebook with an absmax scale). Kernels would need a table lookup.
    Lloyd,
    /// Not a quantizer: q4-sized random error, w + d (u - 1/2) with d = max|w| / 7 per block and u
    /// uniform in [0, 1) from this seed (and the tensor). Independent draws of an error with the engine
    /// q4's statistics show how much of a single figure is the particular rounding pattern.
    Noise(u64),
}

impl Quantizer {
    fn name(self) -> &'static str {
        match self {
            Quantizer::EngineQ4 => "engine q4 (absmax/7)",
            Quantizer::EngineQ8 => "engine q8",
            Quantizer::SignedMax => "signed max (-8..7)",
            Quantizer::LeastSquares => "least-squares scale",
            Quantizer::Affine => "affine min/max (+0.5 bit)",
            Quantizer::Lloyd => "Lloyd codebook (absmax)",
            Quantizer::Noise(_) => "q4-sized uniform noise",
        }
    }
}

fn f16r(x: f64) -> f64 {
    half::f16::from_f64(x).to_f64()
}

/// Quantize-dequantize rows of `k` weights (k % 32 == 0). `book`: the Lloyd codebook (16 levels in
/// [-1, 1]) for [`Quantizer::Lloyd`].
fn fake_quantize(q: Quantizer, k: usize, w: &[f32], book: &[f64]) -> Vec<f32> {
    use florence2_wasm::quant::{dequantize_rows, quantize_rows, QFormat};
    let engine = |fmt| {
        let mut bytes = Vec::new();
        quantize_rows(fmt, k, w, &mut bytes).unwrap();
        dequantize_rows(fmt, k, &bytes).unwrap()
    };
    match q {
        Quantizer::EngineQ4 => return engine(QFormat::Q4),
        Quantizer::EngineQ8 => return engine(QFormat::Q8),
        _ => {}
    }
    let mut out = Vec::with_capacity(w.len());
    let mut rng = match q {
        Quantizer::Noise(seed) => Rng(seed
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(w.len() as u64)
            ^ w.first().map_or(0, |x| x.to_bits() as u64)),
        _ => Rng(0),
    };
    for b in w.chunks_exact(32) {
        let b: Vec<f64> = b.iter().map(|&x| x as f64).collect();
        let amax = b.iter().fold(0f64, |m, x| m.max(x.abs()));
        let grid = |d: f64, lo: f64, hi: f64| -> Vec<f64> {
            b.iter()
                .map(|&x| {
                    if d == 0.0 {
                        0.0
                    } else {
                        d * (x / d).round().clamp(lo, hi)
                    }
                })
                .collect()
        };
        let sse = |v: &[f64]| -> f64 { v.iter().zip(&b).map(|(a, x)| (a - x).powi(2)).sum() };
        let deq: Vec<f64> = match q {
            Quantizer::SignedMax => {
                let m = b
                    .iter()
                    .fold(0f64, |m, &x| if x.abs() > m.abs() { x } else { m });
                grid(f16r(-m / 8.0), -8.0, 7.0)
            }
            Quantizer::LeastSquares => (0..=40)
                .map(|i| grid(f16r(amax / 7.0 * (0.6 + 0.01 * i as f64)), -7.0, 7.0))
                .min_by(|a, c| sse(a).total_cmp(&sse(c)))
                .unwrap(),
            Quantizer::Affine => {
                let lo = f16r(b.iter().cloned().fold(f64::INFINITY, f64::min));
                let hi = b.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let d = f16r((hi - lo) / 15.0);
                b.iter()
                    .map(|&x| {
                        if d == 0.0 {
                            lo
                        } else {
                            lo + d * ((x - lo) / d).round().clamp(0.0, 15.0)
                        }
                    })
                    .collect()
            }
            Quantizer::Lloyd => {
                let d = f16r(amax);
                b.iter()
                    .map(|&x| {
                        let t = if d > 0.0 { x / d } else { 0.0 };
                        let c = book
                            .iter()
                            .min_by(|a, c| (*a - t).abs().total_cmp(&(*c - t).abs()))
                            .unwrap();
                        d * c
                    })
                    .collect()
            }
            Quantizer::Noise(_) => {
                let d = amax / 7.0;
                b.iter().map(|&x| x + d * (rng.uniform() - 0.5)).collect()
            }
            Quantizer::EngineQ4 | Quantizer::EngineQ8 => unreachable!(),
        };
        out.extend(deq.iter().map(|&x| x as f32));
    }
    out
}

/// Fit the 16-level Lloyd codebook on the block-normalized values (w / max|w| of its block).
fn lloyd_codebook(mats: &[&[f32]]) -> Vec<f64> {
    let mut t = Vec::new();
    for m in mats {
        for b in m.chunks_exact(32) {
            let amax = b.iter().fold(0f32, |m, x| m.max(x.abs())) as f64;
            if amax > 0.0 {
                t.extend(b.iter().map(|&x| x as f64 / amax));
            }
        }
    }
    // Start from the engine's uniform grid plus one level, then Lloyd iterations.
    let mut book: Vec<f64> = (0..16).map(|i| -1.0 + 2.0 * i as f64 / 15.0).collect();
    for _ in 0..50 {
        let mut sum = [0f64; 16];
        let mut n = [0usize; 16];
        for &x in &t {
            let (j, _) = book
                .iter()
                .enumerate()
                .min_by(|a, c| (a.1 - x).abs().total_cmp(&(c.1 - x).abs()))
                .unwrap();
            sum[j] += x;
            n[j] += 1;
        }
        for j in 0..16 {
            if n[j] > 0 {
                book[j] = sum[j] / n[j] as f64;
            }
        }
    }
    book
}

/// Relative rms error sqrt(sum (q - w)^2 / sum w^2) of a quantizer on rows of 32-weight blocks.
fn rel_rms(q: Quantizer, mats: &[&[f32]], book: &[f64]) -> f64 {
    let (mut e, mut s) = (0f64, 0f64);
    for m in mats {
        let d = fake_quantize(q, 32, m, book);
        for (&a, &b) in d.iter().zip(m.iter()) {
            e += (a as f64 - b as f64).powi(2);
            s += (b as f64).powi(2);
        }
    }
    (e / s).sqrt()
}

/// The f32 load's matrix weights (what `is_matrix_weight` selects; `lm_head.weight` only when the
/// checkpoint has one) as host vectors.
fn host_matrices(g: &Arc<Device>, w: &weights::Weights) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    w.names()
        .filter_map(|n| {
            let t = w.get_any(n).unwrap();
            weights::is_matrix_weight(n, t.shape()).then(|| {
                (
                    n.to_owned(),
                    t.shape().to_vec(),
                    readback::to_f32_blocking(g, &t).unwrap(),
                )
            })
        })
        .collect()
}

/// The weight groups of the ablation, by canonical name. The tied LM head is the shared embedding's
/// buffer; "prompt embedding" and "LM head" split it (the other use keeps f32).
const GROUPS: [&str; 9] = [
    "DaViT attention (qkv, proj)",
    "DaViT MLP (fc1, fc2)",
    "projector",
    "prompt embedding",
    "LM head",
    "BART encoder attention",
    "BART encoder MLP",
    "BART decoder attention",
    "BART decoder MLP",
];

fn group_of(name: &str) -> usize {
    let has = |s: &str| name.contains(s);
    if has("vision_tower") {
        if has("_attn.") {
            0
        } else {
            1
        }
    } else if has("multi_modal_projector") {
        2
    } else if name == "model.language_model.shared.weight" {
        3
    } else if name == "lm_head.weight" {
        4
    } else if has("language_model.encoder.") {
        if has("self_attn.") {
            5
        } else {
            6
        }
    } else if has("language_model.decoder.") {
        if has("_attn.") {
            7
        } else {
            8
        }
    } else {
        panic!("no ablation group for {name}")
    }
}

/// The f32 weights with `pick(name)`'s quantizer applied to those matrices whose rows are whole blocks
/// (the others keep f32). The tied LM head: when the shared embedding is replaced but the head is not
/// (or the reverse), `lm_head.weight` is inserted as its own tensor.
fn variant_weights(
    g: &Arc<Device>,
    base: &weights::Weights,
    host: &[(String, Vec<usize>, Vec<f32>)],
    book: &[f64],
    pick: &dyn Fn(&str) -> Option<Quantizer>,
) -> weights::Weights {
    let mut w = base.clone();
    let shared = "model.language_model.shared.weight";
    for (name, shape, vals) in host {
        let k = shape[1];
        let mut put = |n: &str, q: Option<Quantizer>| {
            let v = match q {
                Some(q) if k % 32 == 0 => fake_quantize(q, k, vals, book),
                _ => vals.clone(),
            };
            w.insert(n, Tensor::from_f32(g, shape, &v, n).unwrap());
        };
        put(name, pick(name));
        if name == shared && !base.has("lm_head.weight") {
            put("lm_head.weight", pick("lm_head.weight"));
        }
    }
    w
}

/// Synthetic stand-ins for the matrix weights of the same shapes and per-tensor rms: `student` draws
/// Student-t(4) (heavy tails); otherwise Gaussian with 1% of the input columns scaled by 6 (outlier
/// input channels, as trained transformers have), renormalised to the same rms.
fn synthetic(host: &[(String, Vec<usize>, Vec<f32>)], student: bool, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = Rng(seed);
    host.iter()
        .map(|(_, shape, v)| {
            let rms = (v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
            let (n, k) = (shape[0], shape[1]);
            let cols: Vec<f64> = (0..k)
                .map(|_| {
                    if !student && rng.uniform() < 0.01 {
                        6.0
                    } else {
                        1.0
                    }
                })
                .collect();
            let mut out: Vec<f64> = (0..n * k)
                .map(|i| {
                    if student {
                        rng.student4()
                    } else {
                        rng.normal() * cols[i % k]
                    }
                })
                .collect();
            let r = (out.iter().map(|x| x * x).sum::<f64>() / out.len() as f64).sqrt();
            out.iter_mut().for_each(|x| *x *= rms / r);
            out.iter().map(|&x| x as f32).collect()
        })
        .collect()
}

/// Florence-2-base's matrices per ablation group, as (rows, K) lists: DaViT embed_dim
/// [128, 256, 512, 1024] with depths [1, 1, 9, 1] (a spatial and a channel block each: qkv, proj, fc1,
/// fc2), the projector 1024 -> 768, BART d_model 768, FFN 3072, 6 + 6 layers, vocabulary 51328 (the
/// released config.json sizes).
fn base_matrices() -> Vec<Vec<(usize, usize)>> {
    let mut g: Vec<Vec<(usize, usize)>> = vec![Vec::new(); GROUPS.len()];
    for (dep, c) in [(1, 128), (1, 256), (9, 512), (1, 1024)] {
        for _ in 0..2 * dep {
            g[0].extend([(3 * c, c), (c, c)]);
            g[1].extend([(4 * c, c), (c, 4 * c)]);
        }
    }
    let (d, f) = (768, 3072);
    g[2].push((d, 1024));
    g[3].push((51328, d)); // tied: the LM head is the same buffer
    for _ in 0..6 {
        g[5].extend([(d, d); 4]);
        g[6].extend([(f, d), (d, f)]);
        g[7].extend([(d, d); 8]);
        g[8].extend([(f, d), (d, f)]);
    }
    g
}

/// Extra bytes at base shapes when the groups `q8` are stored q8 instead of q4.
fn base_q8_cost(q8: &[usize]) -> f64 {
    let m = base_matrices();
    q8.iter()
        .flat_map(|&gi| m[gi].iter())
        .map(|&(n, k)| (n * (QFormat::Q8.row_bytes(k) - QFormat::Q4.row_bytes(k))) as f64)
        .sum()
}

/// Median over the reference steps of (top-1 - top-2 logit) / std of the logits, and the number of
/// steps whose top two logits are equal (identical LM-head rows, e.g. the fixtures' padded vocabulary
/// rows, give equal logits: a rounding of the weights keeps such ties, independent noise breaks them).
fn median_margin(refs: &[RefCase]) -> (f64, usize) {
    let mut m: Vec<f64> = refs
        .iter()
        .flat_map(|r| r.logits.iter())
        .map(|l| {
            let (_, t1, t2) = top2(l);
            let n = l.len() as f64;
            let mean = l.iter().map(|&x| x as f64).sum::<f64>() / n;
            let sd = (l.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
            (t1 - t2) as f64 / sd
        })
        .collect();
    m.sort_by(f64::total_cmp);
    let ties = m.iter().filter(|&&x| x == 0.0).count();
    (m.get(m.len() / 2).copied().unwrap_or(0.0), ties)
}

/// One Linear at Florence-2-base's width (768 x 768), engine q4: relative rms error of the weights and
/// of the outputs `||(Q(W) - W) x|| / ||W x||` over 64 inputs, for (a) Gaussian W and random x (what
/// every Linear of a random fixture sees: the output error equals the weight error), (b) W with half
/// its energy in 16 rank-one directions (a decaying spectrum, as trained matrices have) and random x,
/// (c) the same W with inputs half in its 16 input directions (activations aligned with what the layer
/// reads, as in a trained network). Quantization noise is unstructured, so it does not grow with that
/// alignment while the signal does. What this shows is a mechanism by which trained layers can be less
/// sensitive than random ones; how aligned Florence-2's activations are is not known here.
fn single_linear() {
    let (n, k, r) = (768usize, 768usize, 16usize);
    let mut rng = Rng(21);
    let mut gauss = |len: usize| -> Vec<f64> { (0..len).map(|_| rng.normal()).collect() };
    let energy = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>();
    let (u, v) = (gauss(n * r), gauss(k * r));
    let noise = gauss(n * k);
    let mut low = vec![0f64; n * k];
    for i in 0..n {
        for j in 0..k {
            low[i * k + j] = (0..r).map(|t| u[i * r + t] * v[j * r + t]).sum();
        }
    }
    let scale = (energy(&noise) / energy(&low)).sqrt();
    let structured: Vec<f64> = low.iter().zip(&noise).map(|(a, b)| a * scale + b).collect();
    let xs_random: Vec<Vec<f64>> = (0..64).map(|_| gauss(k)).collect();
    let xs_aligned: Vec<Vec<f64>> = (0..64)
        .map(|_| {
            let c = gauss(r);
            let inside: Vec<f64> = (0..k)
                .map(|j| (0..r).map(|t| v[j * r + t] * c[t]).sum())
                .collect();
            let out = gauss(k);
            let f = (energy(&out) / energy(&inside)).sqrt();
            inside.iter().zip(&out).map(|(a, b)| a * f + b).collect()
        })
        .collect();
    let matvec = |w: &[f64], x: &[f64]| -> Vec<f64> {
        (0..n)
            .map(|i| (0..k).map(|j| w[i * k + j] * x[j]).sum())
            .collect()
    };
    println!("\nOne Linear 768 x 768, engine q4 (relative rms error of weights / of outputs over 64 inputs):");
    for (label, w, xs) in [
        ("(a) Gaussian W, random x", &noise, &xs_random),
        (
            "(b) W half in 16 rank-one directions, random x",
            &structured,
            &xs_random,
        ),
        (
            "(c) the same W, x half in its 16 input directions",
            &structured,
            &xs_aligned,
        ),
    ] {
        let wf: Vec<f32> = w.iter().map(|&x| x as f32).collect();
        let q: Vec<f64> = fake_quantize(Quantizer::EngineQ4, k, &wf, &[])
            .iter()
            .map(|&x| x as f64)
            .collect();
        let dw: Vec<f64> = q.iter().zip(&wf).map(|(a, &b)| a - b as f64).collect();
        let we = (energy(&dw) / energy(w)).sqrt();
        let (mut num, mut den) = (0.0, 0.0);
        for x in xs.iter() {
            num += energy(&matvec(&dw, x));
            den += energy(&matvec(w, x));
        }
        println!(
            "  {label:52} weights {:.2}%, outputs {:.2}%",
            100.0 * we,
            100.0 * (num / den).sqrt()
        );
    }
}

fn main() {
    // `cargo test --all-targets` runs harness-less benches without `--bench`: only build-check them then.
    if !std::env::args().any(|a| a == "--bench") {
        println!("q4 fidelity bench: run with `cargo bench --bench q4_fidelity`");
        return;
    }
    let g = pollster::block_on(Device::new(DeviceOptions::default())).expect("a GPU adapter");
    println!("adapter: {}", g.describe());
    let dirs = std::env::var("Q4_BENCH_DIRS").unwrap_or_else(|_| "tiny2,tiny4".into());
    let m = base_matrices();
    println!("\nFlorence-2-base matrices per group (q4 -> q8 costs 0.5 byte per weight):");
    for (gi, name) in GROUPS.iter().enumerate() {
        if m[gi].is_empty() {
            println!("  {name:30} tied: the prompt embedding's buffer");
            continue;
        }
        let w: usize = m[gi].iter().map(|(n, k)| n * k).sum();
        println!(
            "  {name:30} {:3} matrices {:6.2} M weights, +{:5.2} MB in q8",
            m[gi].len(),
            w as f64 / 1e6,
            base_q8_cost(&[gi]) / 1e6
        );
    }
    single_linear();
    for dir in dirs.split(',') {
        fixture(&g, dir.trim());
    }
}

fn fixture(g: &Arc<Device>, dir: &str) {
    let path = fixtures().join("models").join(dir);
    let (cfg, w32) =
        weights::load_dir_with(g, &path, LoadOptions::with_dtype(WeightDType::Fp32)).expect("load");
    let f32m = Florence2::new(g, cfg.clone(), &w32).expect("model");
    let refs = reference_cases(g, dir, &f32m);
    let host = host_matrices(g, &w32);
    let quantized: Vec<&[f32]> = host
        .iter()
        .filter(|(_, s, _)| s[1] % 32 == 0)
        .map(|(_, _, v)| v.as_slice())
        .collect();
    let book = lloyd_codebook(&quantized);
    let model = |w: &weights::Weights| Florence2::new(g, cfg.clone(), w).expect("model");
    let run = |pick: &dyn Fn(&str) -> Option<Quantizer>| {
        score(
            g,
            &model(&variant_weights(g, &w32, &host, &book, pick)),
            &refs,
        )
    };
    let row = |label: &str, s: &Score| println!("| {dir} | {label} | {s} |");
    let margin = median_margin(&refs);
    println!(
        "\n{dir}: f32 decoder's median top-1 margin / logit std over {} teacher-forced steps: {:.3} \
         ({} steps with an exact tie)",
        refs.iter().map(|r| r.logits.len()).sum::<usize>(),
        margin.0,
        margin.1
    );

    println!("\n## {dir}: (1) resident q4 and its host replica\n");
    let (_, wq4) =
        weights::load_dir_with(g, &path, LoadOptions::with_dtype(WeightDType::Q4)).expect("load");
    let all = run(&|_| Some(Quantizer::EngineQ4));
    row("resident q4", &score(g, &model(&wq4), &refs));
    row("host q4, every group", &all);
    row("host q8, every group", &run(&|_| Some(Quantizer::EngineQ8)));

    println!("\n## {dir}: (2) one group in q4, the rest f32\n");
    let counts = |gi: usize| -> (usize, usize) {
        host.iter()
            .filter(|(n, s, _)| group_of(n) == gi && s[1] % 32 == 0)
            .fold((0, 0), |(t, e), (_, s, _)| (t + 1, e + s[0] * s[1]))
    };
    let mut sum = 0.0;
    for (gi, name) in GROUPS.iter().enumerate() {
        let (nt, ne) = counts(gi);
        // The LM head of a tied checkpoint is the shared embedding's tensor (counted under group 3).
        let tied_head = gi == 4 && counts(3).0 > 0;
        if nt == 0 && !tied_head {
            println!("| {dir} | only {name} | no matrix with whole 32-weight rows |");
            continue;
        }
        let s = run(&|n: &str| (group_of(n) == gi).then_some(Quantizer::EngineQ4));
        sum += 1.0 - s.mean_enc;
        row(&format!("only {name} ({nt} tensors, {ne} weights)"), &s);
    }
    println!(
        "| {dir} | sum of the single-group 1-cos | {sum:.4} (every group at once: {:.4}) |",
        1.0 - all.mean_enc
    );

    println!("\n## {dir}: (3) every group q4 but one (q8)\n");
    for (gi, name) in GROUPS.iter().enumerate() {
        if counts(gi).0 == 0 {
            continue;
        }
        let s = run(&|n: &str| {
            Some(if group_of(n) == gi {
                Quantizer::EngineQ8
            } else {
                Quantizer::EngineQ4
            })
        });
        row(&format!("all q4, {name} q8"), &s);
    }

    println!(
        "\n## {dir}: (4) mixed policies (groups listed in q8, the rest q4), cost at base shapes\n"
    );
    for (label, q8) in [
        ("projector, enc attn", &[2usize, 5][..]),
        ("DaViT attn, projector, enc attn", &[0, 2, 5][..]),
        ("DaViT attn, projector, enc attn+MLP", &[0, 2, 5, 6][..]),
        (
            "DaViT attn+MLP, projector, enc attn+MLP",
            &[0, 1, 2, 5, 6][..],
        ),
    ] {
        let s = run(&|n: &str| {
            Some(if q8.contains(&group_of(n)) {
                Quantizer::EngineQ8
            } else {
                Quantizer::EngineQ4
            })
        });
        row(
            &format!("q8: {label} (base +{:.1} MB)", base_q8_cost(q8) / 1e6),
            &s,
        );
    }

    println!("\n## {dir}: (5) 4-bit scalar quantizers on every group\n");
    let e_engine = rel_rms(Quantizer::EngineQ4, &quantized, &book);
    let c_engine = 1.0 - all.mean_enc;
    for q in [
        Quantizer::EngineQ4,
        Quantizer::SignedMax,
        Quantizer::LeastSquares,
        Quantizer::Affine,
        Quantizer::Lloyd,
        Quantizer::EngineQ8,
    ] {
        let e = rel_rms(q, &quantized, &book);
        let s = run(&|_| Some(q));
        // If 1-cos grows as the square of the weight error (it does from q4 to q8, see the q8 row),
        // this quantizer's error alone would give:
        let implied = 1.0 - c_engine * (e / e_engine).powi(2);
        row(
            &format!(
                "{} rms err {:.2}%, implied mean cos {implied:.4}",
                q.name(),
                100.0 * e
            ),
            &s,
        );
    }
    let mut draws: Vec<f64> = (1..=6)
        .map(|seed| {
            let q = Quantizer::Noise(seed);
            let s = run(&|_| Some(q));
            row(
                &format!(
                    "{} draw {seed}, rms err {:.2}%",
                    q.name(),
                    100.0 * rel_rms(q, &quantized, &book)
                ),
                &s,
            );
            1.0 - s.mean_enc
        })
        .collect();
    draws.sort_by(f64::total_cmp);
    println!(
        "| {dir} | 1-cos (mean over cases) of 6 q4-sized noise draws | min {:.4} median {:.4} max {:.4} (engine q4: {c_engine:.4}) |",
        draws[0],
        (draws[2] + draws[3]) / 2.0,
        draws[5]
    );
    println!(
        "| {dir} | weight rms error for a mean cos of 0.99 (1-cos scaling as err^2) | {:.2}% |",
        100.0 * e_engine * (0.01 / c_engine).sqrt()
    );
    println!("| {dir} | Lloyd codebook | {book:.3?} |");

    println!("\n## {dir}: (6) synthetic matrices of the same shapes and rms, engine q4 vs their own f32\n");
    let gauss: Vec<Vec<f32>> = {
        let mut rng = Rng(7);
        host.iter()
            .map(|(_, _, v)| {
                let rms =
                    (v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
                v.iter().map(|_| (rng.normal() * rms) as f32).collect()
            })
            .collect()
    };
    for (label, vals) in [
        ("Gaussian (resampled)", gauss),
        ("Student-t(4)", synthetic(&host, true, 11)),
        (
            "Gaussian + 1% outlier columns x6",
            synthetic(&host, false, 13),
        ),
    ] {
        let mats: Vec<&[f32]> = host
            .iter()
            .zip(&vals)
            .filter(|((_, s, _), _)| s[1] % 32 == 0)
            .map(|(_, v)| v.as_slice())
            .collect();
        let b2 = lloyd_codebook(&mats);
        let errs: Vec<String> = [
            Quantizer::EngineQ4,
            Quantizer::LeastSquares,
            Quantizer::Lloyd,
            Quantizer::EngineQ8,
        ]
        .iter()
        .map(|&q| format!("{} {:.2}%", q.name(), 100.0 * rel_rms(q, &mats, &b2)))
        .collect();
        let alt: Vec<(String, Vec<usize>, Vec<f32>)> = host
            .iter()
            .zip(vals)
            .map(|((n, s, _), v)| (n.clone(), s.clone(), v))
            .collect();
        // (A tied LM head follows the shared embedding: `Florence2::new` uses it.)
        let ws = variant_weights(g, &w32, &alt, &b2, &|_| None);
        let alt_refs = reference_cases(g, dir, &model(&ws));
        let s = score(
            g,
            &model(&variant_weights(g, &w32, &alt, &b2, &|_| {
                Some(Quantizer::EngineQ4)
            })),
            &alt_refs,
        );
        row(&format!("{label}: rms err {}", errs.join(", ")), &s);
    }
}
