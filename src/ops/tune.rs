//! The on-device tuner. For each distinct (op, weight format, shape class) a model will run, it times
//! every candidate variant the registry lists for that op on this adapter (submit-and-wait wall time,
//! a few repetitions interleaved across variants, median) and records the fastest in the device's
//! [`Choices`](crate::ops::registry::Choices). The result is cached per adapter and package version:
//! natively in `$XDG_CACHE_HOME/florence2-wasm/` (else `~/.cache/florence2-wasm/`, `%LOCALAPPDATA%`),
//! in the browser in the Cache API. A later load with a cache hit does no timing at all.
//!
//! A broken cache never fails a load: it is reported as a [`TuneReport::warnings`] entry naming it
//! (`tuning cache ... is corrupt`) and the shapes are re-timed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, Gpu, Recorder, Tensor};
use crate::model::config::Florence2Config;
use crate::model::florence2::Florence2;
use crate::ops::matmul::{linear_variant, Act, LinearVariant};
use crate::ops::registry::{format_from_name, ShapeClass};

/// `tuning` option: `auto` (time what is not cached; the default), `off` (static choices, no timing, no
/// cache), `exhaustive` (ignore the cache, time every candidate at the full shape with more repetitions,
/// then write the cache).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Tuning {
    #[default]
    Auto,
    Off,
    Exhaustive,
}

impl std::str::FromStr for Tuning {
    type Err = Error;
    fn from_str(s: &str) -> Result<Tuning> {
        match s {
            "auto" => Ok(Tuning::Auto),
            "off" => Ok(Tuning::Off),
            "exhaustive" => Ok(Tuning::Exhaustive),
            other => Err(Error::InvalidInput(format!(
                "tuning must be \"auto\", \"off\" or \"exhaustive\", got {other:?}"
            ))),
        }
    }
}

impl Tuning {
    pub fn name(self) -> &'static str {
        match self {
            Tuning::Auto => "auto",
            Tuning::Off => "off",
            Tuning::Exhaustive => "exhaustive",
        }
    }
}

/// Where tuning results are kept.
#[derive(Clone, Debug, Default)]
pub enum CacheLocation {
    /// Natively: the user's cache directory; in the browser: the Cache API.
    #[default]
    Default,
    /// Natively: this directory (tests, benches).
    #[cfg(not(target_arch = "wasm32"))]
    Dir(std::path::PathBuf),
    /// Do not read or write a cache.
    None,
}

/// A linear layer's call shape: x (M, K) @ w (N, K)^T with weights in `format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearShape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub format: DType,
}

impl LinearShape {
    pub fn class(&self) -> ShapeClass {
        ShapeClass::linear(self.m, self.n, self.k, self.format)
    }
}

/// The candidate hook for ops other than linear: a call shape the tuner times through the same loop,
/// cache and report as the linear shapes. Attention ([`crate::ops::attention::AttnShape`]) and window
/// attention ([`crate::ops::window_attn::WindowShape`]) implement it beside their launchers.
pub trait TuneCase {
    /// The registry class the choice is stored under.
    fn class(&self) -> ShapeClass;
    /// Names of the variants that can run this shape on an adapter with `caps`.
    fn candidates(&self, caps: &Caps) -> Vec<&'static str>;
    /// Floating-point work of one call (sizes the calls per timed submit).
    fn flops(&self) -> f64;
    /// Allocate zero-filled operands on `gpu`; the returned function records one call of a variant.
    fn prepare(&self, gpu: &std::sync::Arc<Gpu>) -> Result<CaseRunner>;
    /// The smaller shape timed in `auto` (like linear rows capped at [`AUTO_MAX_ROWS`]: fewer query rows
    /// or windows, whose cost per row or window is flat once the grid fills the device), or `None` to
    /// time the full shape.
    fn auto_shape(&self) -> Option<Box<dyn TuneCase>> {
        None
    }
}

/// Records one call of the named variant (see [`TuneCase::prepare`]).
pub type CaseRunner = Box<dyn Fn(&mut Recorder, &'static str) -> Result<()>>;

/// One timed (or cached) shape class.
#[derive(Clone, Debug)]
pub struct TuneRow {
    pub class: ShapeClass,
    /// The linear shape that was timed (rows may be capped in `auto`, see [`AUTO_MAX_ROWS`]); `None` for
    /// the other ops ([`TuneCase`]), which are timed at their full shape.
    pub timed_shape: Option<LinearShape>,
    /// Median milliseconds per call for each candidate; `None` when it failed to run.
    pub times_ms: Vec<(&'static str, Option<f64>)>,
    pub chosen: &'static str,
    /// Taken from the cache (no timing this load).
    pub cached: bool,
}

/// What [`tune`] did.
#[derive(Clone, Debug, Default)]
pub struct TuneReport {
    pub rows: Vec<TuneRow>,
    /// Candidate timings run this call (0 when everything came from the cache or tuning is off).
    pub timings: usize,
    /// Cache file or key read/written, when any.
    pub cache_path: Option<String>,
    /// Non-fatal problems (corrupt or unwritable cache).
    pub warnings: Vec<String>,
}

impl TuneReport {
    /// The table `florence2 tune` prints: op and shape, each variant's time, the chosen one.
    pub fn table(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!(
            "{:<44} {:>8}  {}\n",
            "op / shape class", "chosen", "variants (ms per call; * = chosen)"
        ));
        for r in &self.rows {
            let times: Vec<String> = r
                .times_ms
                .iter()
                .map(|(n, t)| {
                    let mark = if *n == r.chosen { "*" } else { "" };
                    match t {
                        Some(t) => format!("{mark}{n} {t:.3}"),
                        None => format!("{n} failed"),
                    }
                })
                .collect();
            let times = if r.cached && times.is_empty() {
                "(cached)".to_string()
            } else {
                times.join(", ")
            };
            s.push_str(&format!(
                "{:<44} {:>8}  {}{}\n",
                r.class.describe(),
                r.chosen,
                times,
                if r.cached { "  [cache]" } else { "" }
            ));
        }
        s
    }
}

/// In `auto`, shapes with more rows than this are timed at this many rows (the per-row cost of a GEMM
/// is flat once the grid fills the device); `exhaustive` times the full shape.
pub const AUTO_MAX_ROWS: usize = 2048;

/// Repetitions per candidate (median taken).
const AUTO_REPS: usize = 3;
const EXHAUSTIVE_REPS: usize = 7;

/// Floating-point work per timed submit, so small shapes are not measured as pure submit overhead.
const TARGET_FLOPS_PER_SUBMIT: f64 = 5.0e7;
const MAX_CALLS_PER_SUBMIT: usize = 16;

/// Version recorded in (and required of) the cache: a new package may bring new kernels.
const PACKAGE_VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Serialize, Deserialize)]
struct CacheFile {
    package: String,
    adapter: String,
    entries: Vec<CacheEntry>,
}

#[derive(Serialize, Deserialize, Clone)]
struct CacheEntry {
    op: String,
    format: String,
    dims: [usize; 3],
    variant: String,
    times_ms: BTreeMap<String, f64>,
}

/// 64-bit FNV-1a: a short stable file name for an adapter key (the key itself is stored inside and
/// compared on load, so a collision only costs a re-tune).
fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn cache_name(adapter_key: &str) -> String {
    format!(
        "tuning-{:016x}.json",
        fnv1a(&format!("{PACKAGE_VERSION}\n{adapter_key}"))
    )
}

/// The linear shapes (patch-embedding convs included, as im2col GEMMs) Florence-2 runs for `cfg` on a `height` x `width` image, with decode steps of 1 and
/// `beams` rows and weights in `format`. Prompt length varies; the encoder rows are taken for a prompt
/// of 16 tokens (rows are bucketed by powers of two, so nearby lengths share the class).
pub fn model_linear_shapes(
    cfg: &Florence2Config,
    height: usize,
    width: usize,
    beams: usize,
    format: DType,
) -> Vec<LinearShape> {
    let mut out = Vec::new();
    let mut push = |m: usize, n: usize, k: usize, format: DType| {
        // The loader keeps matrices whose rows are not whole quantization blocks in f16.
        let format = if format.qformat().is_some() && !k.is_multiple_of(crate::gpu::quant::QBLOCK) {
            DType::F16
        } else {
            format
        };
        let s = LinearShape { m, n, k, format };
        if m > 0 && n > 0 && k > 0 && !out.iter().any(|o: &LinearShape| o.class() == s.class()) {
            out.push(s);
        }
    };
    let v = &cfg.vision;
    let (mut h, mut w) = (height, width);
    let ws = v.window_size.max(1);
    for s in 0..v.embed_dim.len() {
        let (k, st, p) = (v.patch_size[s], v.patch_stride[s], v.patch_padding[s]);
        h = (h + 2 * p).saturating_sub(k) / st.max(1) + 1;
        w = (w + 2 * p).saturating_sub(k) / st.max(1) + 1;
        let c = v.embed_dim[s];
        // Patch-embedding conv as im2col + GEMM: K = k*k*Cin (147 for the 7x7 RGB stem, run padded to
        // 152 with an f32 weight: `conv::gemm_k`).
        let cin = if s == 0 {
            v.in_channels
        } else {
            v.embed_dim[s - 1]
        };
        let kk = k * k * cin;
        let stored = if format.qformat().is_some() && !kk.is_multiple_of(crate::gpu::quant::QBLOCK)
        {
            DType::F16
        } else {
            format
        };
        let (kg, fg) = crate::ops::conv::gemm_k(kk, stored);
        push(h * w, c, kg, fg);
        let hidden = (c as f64 * v.mlp_ratio) as usize;
        let rows = h * w;
        let wrows = h.div_ceil(ws) * w.div_ceil(ws) * ws * ws;
        push(wrows, 3 * c, c, format); // window attention qkv
        push(rows, c, c, format); // attention out projections
        push(rows, 3 * c, c, format); // channel attention qkv
        push(rows, hidden, c, format); // fc1 (GELU)
        push(rows, c, hidden, format); // fc2
    }
    let t = &cfg.text;
    let c_last = v.embed_dim.last().copied().unwrap_or(0);
    let image_tokens = h * w + 1;
    push(image_tokens, v.projection_dim, c_last, format); // image_projection
    let seq = image_tokens + 16;
    let d = t.d_model;
    push(seq, d, d, format); // encoder q/k/v/o, decoder cross k/v
    push(seq, t.encoder_ffn_dim, d, format);
    push(seq, d, t.encoder_ffn_dim, format);
    let mut steps = vec![1];
    if beams > 1 {
        steps.push(beams);
    }
    for &m in &steps {
        push(m, d, d, format); // decoder q/k/v/o, cross q/o
        push(m, t.decoder_ffn_dim, d, format);
        push(m, d, t.decoder_ffn_dim, format);
        push(m, t.vocab_size, d, format); // LM head
    }
    out
}

/// Tune the kernels for the shapes `model` runs on `height` x `width` images with decode steps of up to
/// `beams` rows, weights in the model's resident format.
pub async fn tune_model(
    model: &Florence2,
    height: usize,
    width: usize,
    beams: usize,
    mode: Tuning,
    cache: &CacheLocation,
) -> Result<TuneReport> {
    let format = model.shared.dtype();
    let shapes = model_linear_shapes(&model.config, height, width, beams.max(1), format);
    let cases = model_attention_cases(&model.config, height, width, beams.max(1));
    let cases: Vec<&dyn TuneCase> = cases.iter().map(|c| c.as_ref()).collect();
    tune_with(model.gpu(), &shapes, &cases, mode, cache).await
}

/// The attention calls Florence-2 runs for `cfg` on a `height` x `width` image with decode steps of 1
/// and `beams` rows: DaViT window attention per stage, encoder self-attention over image + prompt
/// tokens (a prompt of 16 tokens, as in [`model_linear_shapes`]), decoder self-attention over a cache of
/// the position table's length and cross-attention over the encoder sequence (K/V shared by the rows).
pub fn model_attention_cases(
    cfg: &Florence2Config,
    height: usize,
    width: usize,
    beams: usize,
) -> Vec<Box<dyn TuneCase>> {
    use crate::ops::attention::AttnShape;
    use crate::ops::window_attn::WindowShape;
    let mut out: Vec<Box<dyn TuneCase>> = Vec::new();
    let mut push = |case: Box<dyn TuneCase>| {
        if !out.iter().any(|o| o.class() == case.class()) {
            out.push(case);
        }
    };
    let v = &cfg.vision;
    let (mut h, mut w) = (height, width);
    let ws = v.window_size.max(1);
    for s in 0..v.embed_dim.len() {
        let (k, st, p) = (v.patch_size[s], v.patch_stride[s], v.patch_padding[s]);
        h = (h + 2 * p).saturating_sub(k) / st.max(1) + 1;
        w = (w + 2 * p).saturating_sub(k) / st.max(1) + 1;
        let (c, heads) = (v.embed_dim[s], v.num_heads.get(s).copied().unwrap_or(1));
        let windows = h.div_ceil(ws) * w.div_ceil(ws);
        push(Box::new(WindowShape {
            windows,
            t: ws * ws,
            c,
            heads,
        }));
    }
    let t = &cfg.text;
    let seq = h * w + 1 + 16;
    let dm = t.d_model;
    let enc = |b: usize, tq: usize, bk: usize, tk: usize, heads: usize| AttnShape {
        b,
        tq,
        bk,
        tk,
        heads,
        d: dm / heads.max(1),
        causal: false,
        masked: false,
    };
    push(Box::new(enc(1, seq, 1, seq, t.encoder_attention_heads)));
    let cache_len = t.max_position_embeddings.max(1);
    let mut steps = vec![1];
    if beams > 1 {
        steps.push(beams);
    }
    for &b in &steps {
        let heads = t.decoder_attention_heads;
        push(Box::new(enc(b, 1, b, cache_len, heads))); // self-attention over the cache
        push(Box::new(enc(b, 1, 1, seq, heads))); // cross-attention, K/V shared (Bk = 1)
    }
    out
}

/// Tune `shapes` on `gpu` (see the module docs) and install the choices. With [`Tuning::Off`] the
/// choice table is cleared (static choices) and nothing is timed or cached.
pub async fn tune(
    gpu: &std::sync::Arc<Gpu>,
    shapes: &[LinearShape],
    mode: Tuning,
    cache: &CacheLocation,
) -> Result<TuneReport> {
    tune_with(gpu, shapes, &[], mode, cache).await
}

/// [`tune`] with the calls of other ops ([`TuneCase`]: attention, window attention) after the linear
/// shapes, in the same cache file and report.
pub async fn tune_with(
    gpu: &std::sync::Arc<Gpu>,
    shapes: &[LinearShape],
    cases: &[&dyn TuneCase],
    mode: Tuning,
    cache: &CacheLocation,
) -> Result<TuneReport> {
    let mut report = TuneReport::default();
    if mode == Tuning::Off {
        gpu.choices.clear();
        return Ok(report);
    }
    // Distinct classes, keeping the largest row count seen for each as the one to time.
    let mut classes: Vec<LinearShape> = Vec::new();
    for s in shapes {
        match classes.iter_mut().find(|c| c.class() == s.class()) {
            Some(c) => c.m = c.m.max(s.m),
            None => classes.push(*s),
        }
    }
    let adapter = gpu.caps.adapter_key.clone();
    let name = cache_name(&adapter);
    let mut entries: Vec<CacheEntry> = Vec::new();
    if !matches!(cache, CacheLocation::None) {
        report.cache_path = Some(store::describe(cache, &name));
        match store::load(cache, &name).await {
            Ok(None) => {}
            Ok(Some(text)) => match serde_json::from_str::<CacheFile>(&text) {
                Ok(f) if f.package == PACKAGE_VERSION && f.adapter == adapter => {
                    entries = f.entries
                }
                Ok(_) => {} // another adapter or version under a colliding name: re-tune.
                Err(e) => report.warnings.push(format!(
                    "tuning cache {} is corrupt ({e}); ignoring it and re-tuning",
                    store::describe(cache, &name)
                )),
            },
            Err(e) => report.warnings.push(format!(
                "tuning cache {} could not be read ({e}); re-tuning",
                store::describe(cache, &name)
            )),
        }
    }
    for w in &report.warnings {
        log::warn!("{w}");
    }

    let mut dirty = false;
    for shape in &classes {
        let class = shape.class();
        let candidates: Vec<LinearVariant> = LinearVariant::ALL
            .into_iter()
            .filter(|v| v.supports(&gpu.caps, shape.m, shape.k, shape.format))
            .collect();
        if candidates.is_empty() {
            continue;
        }
        if mode == Tuning::Auto {
            let hit = entries.iter().find(|e| {
                e.op == class.op.name()
                    && format_from_name(&e.format) == Some(class.format)
                    && e.dims == class.dims
            });
            if let Some(v) = hit
                .and_then(|e| LinearVariant::from_name(&e.variant))
                .filter(|v| candidates.contains(v))
            {
                gpu.choices.set(class, v.name());
                report.rows.push(TuneRow {
                    class,
                    timed_shape: Some(*shape),
                    times_ms: Vec::new(),
                    chosen: v.name(),
                    cached: true,
                });
                continue;
            }
        }
        let timed_shape = LinearShape {
            m: if mode == Tuning::Exhaustive {
                shape.m
            } else {
                shape.m.min(AUTO_MAX_ROWS)
            },
            ..*shape
        };
        let reps = if mode == Tuning::Exhaustive {
            EXHAUSTIVE_REPS
        } else {
            AUTO_REPS
        };
        let times = time_linear(gpu, &timed_shape, &candidates, reps).await?;
        report.timings += candidates.len();
        let best = times
            .iter()
            .filter_map(|(v, t)| t.map(|t| (*v, t)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let Some((best, _)) = best else {
            continue; // nothing ran: keep the static choice.
        };
        gpu.choices.set(class, best.name());
        entries.retain(|e| {
            !(e.op == class.op.name()
                && format_from_name(&e.format) == Some(class.format)
                && e.dims == class.dims)
        });
        entries.push(CacheEntry {
            op: class.op.name().to_string(),
            format: format!("{:?}", class.format),
            dims: class.dims,
            variant: best.name().to_string(),
            times_ms: times
                .iter()
                .filter_map(|(v, t)| t.map(|t| (v.name().to_string(), t)))
                .collect(),
        });
        dirty = true;
        report.rows.push(TuneRow {
            class,
            timed_shape: Some(timed_shape),
            times_ms: times.iter().map(|(v, t)| (v.name(), *t)).collect(),
            chosen: best.name(),
            cached: false,
        });
    }
    let mut done: Vec<ShapeClass> = Vec::new();
    for case in cases {
        let class = case.class();
        let candidates = case.candidates(&gpu.caps);
        if candidates.is_empty() || done.contains(&class) {
            continue;
        }
        done.push(class);
        if mode == Tuning::Auto {
            let hit = entries.iter().find(|e| {
                e.op == class.op.name()
                    && format_from_name(&e.format) == Some(class.format)
                    && e.dims == class.dims
            });
            if let Some(&v) = hit.and_then(|e| candidates.iter().find(|c| **c == e.variant)) {
                gpu.choices.set(class, v);
                report.rows.push(TuneRow {
                    class,
                    timed_shape: None,
                    times_ms: Vec::new(),
                    chosen: v,
                    cached: true,
                });
                continue;
            }
        }
        let reps = if mode == Tuning::Exhaustive {
            EXHAUSTIVE_REPS
        } else {
            AUTO_REPS
        };
        let small = match mode {
            Tuning::Exhaustive => None,
            _ => case.auto_shape(),
        };
        let timed: &dyn TuneCase = small.as_deref().unwrap_or(*case);
        let runner = timed.prepare(gpu)?;
        let calls = ((TARGET_FLOPS_PER_SUBMIT / timed.flops().max(1.0)).ceil() as usize)
            .clamp(1, MAX_CALLS_PER_SUBMIT);
        let run = |i: usize, n: usize| -> Result<()> {
            let mut rec = Recorder::new(gpu);
            for _ in 0..n {
                runner(&mut rec, candidates[i])?;
            }
            rec.submit()
        };
        let times = time_runs(gpu, candidates.len(), reps, run, calls).await;
        report.timings += candidates.len();
        let best = candidates
            .iter()
            .zip(&times)
            .filter_map(|(v, t)| t.map(|t| (*v, t)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let Some((best, _)) = best else {
            continue; // nothing ran: keep the static choice.
        };
        gpu.choices.set(class, best);
        entries.retain(|e| {
            !(e.op == class.op.name()
                && format_from_name(&e.format) == Some(class.format)
                && e.dims == class.dims)
        });
        entries.push(CacheEntry {
            op: class.op.name().to_string(),
            format: format!("{:?}", class.format),
            dims: class.dims,
            variant: best.to_string(),
            times_ms: candidates
                .iter()
                .zip(&times)
                .filter_map(|(v, t)| t.map(|t| (v.to_string(), t)))
                .collect(),
        });
        dirty = true;
        report.rows.push(TuneRow {
            class,
            timed_shape: None,
            times_ms: candidates.iter().copied().zip(times).collect(),
            chosen: best,
            cached: false,
        });
    }
    if dirty && !matches!(cache, CacheLocation::None) {
        let file = CacheFile {
            package: PACKAGE_VERSION.to_string(),
            adapter,
            entries,
        };
        let text = serde_json::to_string_pretty(&file)
            .map_err(|e| Error::Gpu(format!("serialising the tuning cache: {e}")))?;
        if let Err(e) = store::save(cache, &name, &text).await {
            let w = format!(
                "tuning cache {} could not be written ({e})",
                store::describe(cache, &name)
            );
            log::warn!("{w}");
            report.warnings.push(w);
        }
    }
    Ok(report)
}

/// Median ms per call of each candidate on zero-filled operands of `shape` (values do not change the
/// work of these kernels). Candidates are interleaved rep by rep, so a noisy neighbour hits all alike.
async fn time_linear(
    gpu: &std::sync::Arc<Gpu>,
    shape: &LinearShape,
    candidates: &[LinearVariant],
    reps: usize,
) -> Result<Vec<(LinearVariant, Option<f64>)>> {
    let LinearShape { m, n, k, format } = *shape;
    let x = Tensor::zeros(gpu, &[m, k], DType::F32, "tune.x")?;
    let w = Tensor::zeros(gpu, &[n, k], format, "tune.w")?;
    let b = Tensor::zeros(gpu, &[n], DType::F32, "tune.bias")?;
    let out = Tensor::zeros(gpu, &[m, n], DType::F32, "tune.out")?;
    let flops = 2.0 * (m * n * k) as f64;
    let calls = ((TARGET_FLOPS_PER_SUBMIT / flops).ceil() as usize).clamp(1, MAX_CALLS_PER_SUBMIT);
    let run = |i: usize, calls: usize| -> Result<()> {
        let mut rec = Recorder::new(gpu);
        for _ in 0..calls {
            linear_variant(&mut rec, candidates[i], &x, &w, Some(&b), Act::None, &out)?;
        }
        rec.submit()
    };
    let times = time_runs(gpu, candidates.len(), reps, run, calls).await;
    Ok(candidates.iter().copied().zip(times).collect())
}

/// Median ms per call of each of `n` candidates, `run(i, calls)` recording and submitting `calls` calls
/// of candidate i. Warm-up first (compiles each pipeline; a candidate that fails is left out: `None`),
/// then `reps` rounds interleaved across candidates, so a noisy neighbour hits all alike.
async fn time_runs(
    gpu: &std::sync::Arc<Gpu>,
    n: usize,
    reps: usize,
    run: impl Fn(usize, usize) -> Result<()>,
    calls: usize,
) -> Vec<Option<f64>> {
    let mut alive: Vec<bool> = Vec::with_capacity(n);
    for i in 0..n {
        let ok = run(i, 1).is_ok() && finish(gpu).await.is_ok();
        alive.push(ok);
    }
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); n];
    for _ in 0..reps {
        for i in 0..n {
            if !alive[i] {
                continue;
            }
            let t0 = clock::now_ms();
            let r = run(i, calls);
            let done = finish(gpu).await;
            if r.is_err() || done.is_err() {
                alive[i] = false;
                continue;
            }
            samples[i].push((clock::now_ms() - t0) / calls as f64);
        }
    }
    samples
        .into_iter()
        .zip(alive)
        .map(|(mut s, ok)| {
            if !ok || s.is_empty() {
                return None;
            }
            s.sort_by(|a, b| a.total_cmp(b));
            Some(s[s.len() / 2])
        })
        .collect()
}

/// Wait until the queue has finished all submitted work.
async fn finish(gpu: &Gpu) -> Result<()> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        gpu.wait_idle()
    }
    #[cfg(target_arch = "wasm32")]
    {
        let (tx, rx) = futures_channel::oneshot::channel();
        gpu.queue.on_submitted_work_done(move || {
            let _ = tx.send(());
        });
        rx.await
            .map_err(|_| Error::Gpu("work-done callback dropped".into()))?;
        gpu.check()
    }
}

mod clock {
    #[cfg(not(target_arch = "wasm32"))]
    pub fn now_ms() -> f64 {
        use std::sync::OnceLock;
        use std::time::Instant;
        static START: OnceLock<Instant> = OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_secs_f64() * 1e3
    }

    /// `performance.now()` where the global has it (pages and workers), else `Date.now()`.
    #[cfg(target_arch = "wasm32")]
    pub fn now_ms() -> f64 {
        use wasm_bindgen::JsCast;
        let perf = js_sys::Reflect::get(&js_sys::global(), &"performance".into()).ok();
        if let Some(p) = perf.filter(|p| p.is_object()) {
            if let Ok(f) = js_sys::Reflect::get(&p, &"now".into()) {
                if let Ok(f) = f.dyn_into::<js_sys::Function>() {
                    if let Some(t) = f.call0(&p).ok().and_then(|v| v.as_f64()) {
                        return t;
                    }
                }
            }
        }
        js_sys::Date::now()
    }
}

/// Reading and writing the cache text.
mod store {
    use super::CacheLocation;

    #[cfg(not(target_arch = "wasm32"))]
    fn dir(loc: &CacheLocation) -> Option<std::path::PathBuf> {
        use std::path::PathBuf;
        match loc {
            CacheLocation::None => None,
            CacheLocation::Dir(d) => Some(d.clone()),
            CacheLocation::Default => {
                let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
                let base = env("XDG_CACHE_HOME")
                    .map(PathBuf::from)
                    .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".cache")))
                    .or_else(|| env("LOCALAPPDATA").map(PathBuf::from))?;
                Some(base.join("florence2-wasm"))
            }
        }
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub fn describe(loc: &CacheLocation, name: &str) -> String {
        match dir(loc) {
            Some(d) => d.join(name).display().to_string(),
            None => "(no cache directory)".into(),
        }
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub async fn load(loc: &CacheLocation, name: &str) -> Result<Option<String>, String> {
        let Some(d) = dir(loc) else {
            return Ok(None);
        };
        match std::fs::read(d.join(name)) {
            // Not UTF-8 is corrupt too: the lossy text fails to parse and is reported as such.
            Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub async fn save(loc: &CacheLocation, name: &str, text: &str) -> Result<(), String> {
        let Some(d) = dir(loc) else {
            return Err("no cache directory (set XDG_CACHE_HOME or HOME)".into());
        };
        std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
        // Write then rename, so a concurrent reader never sees half a file.
        let tmp = d.join(format!("{name}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, text).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, d.join(name)).map_err(|e| e.to_string())
    }

    #[cfg(target_arch = "wasm32")]
    const CACHE_NAME: &str = "florence2-wasm-tuning";
    /// A synthetic URL keying the entry in the Cache API (never fetched).
    #[cfg(target_arch = "wasm32")]
    const URL_BASE: &str = "https://florence2-wasm.invalid/tuning/";

    #[cfg(target_arch = "wasm32")]
    pub fn describe(loc: &CacheLocation, name: &str) -> String {
        match loc {
            CacheLocation::None => "(no cache)".into(),
            CacheLocation::Default => format!("Cache API {CACHE_NAME}: {URL_BASE}{name}"),
        }
    }

    #[cfg(target_arch = "wasm32")]
    async fn open(loc: &CacheLocation) -> Result<Option<web_sys::Cache>, String> {
        use wasm_bindgen::JsCast;
        use wasm_bindgen_futures::JsFuture;
        if matches!(loc, CacheLocation::None) {
            return Ok(None);
        }
        let caches = js_sys::Reflect::get(&js_sys::global(), &"caches".into())
            .ok()
            .and_then(|c| c.dyn_into::<web_sys::CacheStorage>().ok());
        let Some(caches) = caches else {
            return Ok(None); // no Cache API (insecure context): tune every load.
        };
        let c = JsFuture::from(caches.open(CACHE_NAME))
            .await
            .map_err(|e| format!("{e:?}"))?;
        Ok(c.dyn_into::<web_sys::Cache>().ok())
    }

    #[cfg(target_arch = "wasm32")]
    pub async fn load(loc: &CacheLocation, name: &str) -> Result<Option<String>, String> {
        use wasm_bindgen::JsCast;
        use wasm_bindgen_futures::JsFuture;
        let Some(cache) = open(loc).await? else {
            return Ok(None);
        };
        let url = format!("{URL_BASE}{name}");
        let hit = JsFuture::from(cache.match_with_str(&url))
            .await
            .map_err(|e| format!("{e:?}"))?;
        let Ok(resp) = hit.dyn_into::<web_sys::Response>() else {
            return Ok(None);
        };
        let text = JsFuture::from(resp.text().map_err(|e| format!("{e:?}"))?)
            .await
            .map_err(|e| format!("{e:?}"))?;
        Ok(text.as_string())
    }

    #[cfg(target_arch = "wasm32")]
    pub async fn save(loc: &CacheLocation, name: &str, text: &str) -> Result<(), String> {
        use wasm_bindgen_futures::JsFuture;
        let Some(cache) = open(loc).await? else {
            return Ok(());
        };
        let url = format!("{URL_BASE}{name}");
        let resp = web_sys::Response::new_with_opt_str(Some(text)).map_err(|e| format!("{e:?}"))?;
        JsFuture::from(cache.put_with_str(&url, &resp))
            .await
            .map(|_| ())
            .map_err(|e| format!("{e:?}"))
    }
}
