//! The on-device tuner. For each distinct (op, weight format, shape class) a model will run, it times
//! the candidate variants the registry lists for that op on this adapter and records the fastest in the
//! device's [`Choices`](crate::gpu::registry::Choices). The result is cached per adapter and package
//! version: natively in `$XDG_CACHE_HOME/florence2-wasm/` (else `~/.cache/florence2-wasm/`,
//! `%LOCALAPPDATA%`), in the browser in the Cache API. A later load with a cache hit does no timing.
//!
//! **Timing.** Where the adapter has TIMESTAMP_QUERY, a sample is the GPU time between the first
//! dispatch's beginning and the last one's end ([`Recorder::new_timed`]): submit and readback latency,
//! which dominate tiny shapes and differ nothing between candidates, are left out. Otherwise a sample is
//! submit-and-wait wall time. Each sample batches enough calls to last a minimum duration, candidates
//! are interleaved sample by sample (a noisy neighbour hits all alike), and the median is kept; tiny
//! shapes get more samples.
//!
//! **Budget** (`auto`). Classes are tuned in order of their share of the model's estimated cost
//! ([`model_linear_workload`]: FLOPs plus a weight-traffic term for the memory-bound decode shapes), and
//! a class is started only while the time spent plus the average class so far fits the budget
//! ([`AUTO_BUDGET_MS`] by default, on every adapter: on CPU adapters a base model does not fit in one
//! load). Classes left over keep the static choice for this load; every finished class is cached at
//! once, so the next load continues where this one stopped and, once all are cached, times nothing.
//! Compiling a candidate's pipeline is often the largest cost on a CPU adapter (seconds for an
//! unrolled kernel on lavapipe) and cannot be interrupted: a compile starts only while an average one
//! still fits before the deadline, and a class cut short this way caches its best so far together with
//! its untried candidates, which a later load times against it (at least two candidates per class and
//! load, so every load progresses; a load overruns the budget by at most one compile and one class's
//! timing).
//! Within a class the cost is bounded as well: candidates are first screened at a probe size sized from
//! the device's measured speed (a call of the fastest lasts about [`PROBE_CALL_MS`]); those slower than
//! [`SCREEN_FACTOR`] x the fastest cannot win and are dropped, those slower than [`BAN_FACTOR`] x are (kept in the cache, so in later loads too) not
//! timed again for classes of the same kind (GEMM or decode GEMV, same weight format) in this run; the
//! survivors are timed at a size whose calls last about [`TIMED_CALL_MS`] (rows capped, columns kept
//! where the weights' memory traffic matters). `exhaustive` has no budget, no screening and times every
//! candidate at the full shape with more samples.
//!
//! A broken cache never fails a load: it is reported as a [`TuneReport::warnings`] entry naming it
//! (`tuning cache ... is corrupt`) and the shapes are re-timed.
//!
//! To tune another op: give it an [`OpKind`](crate::gpu::registry::OpKind), a candidate list with
//! `supports`, and a [`ClassBench`]-like arm in `bench_for` that allocates operands for a (possibly
//! shrunk) shape and records one call of a named candidate; the budget, screening, timing and cache code
//! is shared.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, Gpu, Recorder, Tensor};
use crate::model::config::Florence2Config;
use crate::model::florence2::Florence2;
use crate::ops::matmul::{choose_linear_variant_for, linear_variant, Act, LinearVariant};
use crate::gpu::registry::{format_from_name, ShapeClass};

/// `tuning` option: `auto` (time what is not cached, within a time budget; the default), `off` (static
/// choices, no timing, no cache), `exhaustive` (ignore the cache, time every candidate at the full shape
/// with more repetitions, no budget, then write the cache).
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

/// Default time budget of `auto` per load, in milliseconds (the first-load target for base).
pub const AUTO_BUDGET_MS: f64 = 3000.0;

/// A source of milliseconds for the budget and for wall-time samples. Tests inject a fake one.
pub trait Clock: Send + Sync {
    fn now_ms(&self) -> f64;
}

/// The real clock: `Instant` natively, `performance.now()` in the browser.
#[derive(Clone, Copy, Debug, Default)]
pub struct WallClock;

impl Clock for WallClock {
    fn now_ms(&self) -> f64 {
        clock::now_ms()
    }
}

/// How candidate samples are timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Timer {
    /// GPU timestamps where the adapter has TIMESTAMP_QUERY, else wall time.
    #[default]
    Auto,
    /// Submit-and-wait wall time (on the [`TuneOptions::clock`]).
    Wall,
}

/// What one tuning run does.
#[derive(Clone)]
pub struct TuneOptions {
    pub mode: Tuning,
    /// Milliseconds `auto` may spend (`None`: no limit). `exhaustive` ignores it.
    pub budget_ms: Option<f64>,
    pub timer: Timer,
    /// Measures the budget (and wall-time samples).
    pub clock: std::sync::Arc<dyn Clock>,
}

impl std::fmt::Debug for TuneOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TuneOptions")
            .field("mode", &self.mode)
            .field("budget_ms", &self.budget_ms)
            .field("timer", &self.timer)
            .finish_non_exhaustive()
    }
}

impl TuneOptions {
    /// `mode` as a model load runs it: `auto` within [`AUTO_BUDGET_MS`], timestamps where available.
    pub fn new(mode: Tuning) -> Self {
        TuneOptions {
            mode,
            budget_ms: Some(AUTO_BUDGET_MS),
            timer: Timer::Auto,
            clock: std::sync::Arc::new(WallClock),
        }
    }

    /// `mode` without a time budget (benches, tests that need every class tuned).
    pub fn unbounded(mode: Tuning) -> Self {
        TuneOptions {
            budget_ms: None,
            ..Self::new(mode)
        }
    }

    pub fn with_budget_ms(mut self, budget_ms: Option<f64>) -> Self {
        self.budget_ms = budget_ms;
        self
    }

    pub fn with_timer(mut self, timer: Timer) -> Self {
        self.timer = timer;
        self
    }

    pub fn with_clock(mut self, clock: std::sync::Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
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

    /// Floating-point operations of one call.
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }

    /// Bytes of its weight matrix.
    pub fn weight_bytes(&self) -> f64 {
        (self.n * self.format.row_bytes(self.k)) as f64
    }

    /// The estimated cost of one call used to rank classes: its FLOPs plus [`BYTE_COST`] per weight
    /// byte (a decode step's GEMVs are bound by reading their weights, not by arithmetic).
    pub fn cost(&self) -> f64 {
        self.flops() + BYTE_COST * self.weight_bytes()
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

/// FLOPs one weight byte read is worth in [`LinearShape::cost`] (about a GPU's or CPU's arithmetic to
/// memory bandwidth ratio).
pub const BYTE_COST: f64 = 16.0;

/// Decode steps a request is assumed to run when weighing decode shapes against encoding ones.
pub const DECODE_STEPS_ESTIMATE: f64 = 32.0;

/// How a class ended in a tuning run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowStatus {
    /// Timed in this run (and cached).
    Timed,
    /// Taken from the cache.
    Cached,
    /// Not timed: the budget was spent; the static choice stays for this load and a later load times it.
    Skipped,
}

/// One timed, cached or skipped shape class.
#[derive(Clone, Debug)]
pub struct TuneRow {
    pub class: ShapeClass,
    /// The linear shape the survivors were timed at (`auto` shrinks large shapes, see the module docs);
    /// `None` for the other ops ([`TuneCase`]), which are timed at their full shape.
    pub timed_shape: Option<LinearShape>,
    /// Median milliseconds per call at `timed_shape` of each timed candidate; `None` when it failed.
    pub times_ms: Vec<(&'static str, Option<f64>)>,
    /// Candidates screened out (`auto`): how many times slower than the fastest they were at the probe
    /// size. Banned ones (see the module docs) are listed with `f64::INFINITY`.
    pub dropped: Vec<(&'static str, f64)>,
    /// The chosen variant; for a skipped row the static choice.
    pub chosen: &'static str,
    /// Taken from the cache (no timing this load).
    pub cached: bool,
    pub status: RowStatus,
    /// The class's share of the model's estimated cost (priority order), 0..1.
    pub share: f64,
    /// Milliseconds this run spent on the class (compiling, screening, timing).
    pub spent_ms: f64,
    /// Candidates left untried when the budget ran out within the class (`auto`): the next load times
    /// them against the best so far, which is installed meanwhile.
    pub untried: Vec<&'static str>,
}

/// What [`tune`] did.
#[derive(Clone, Debug, Default)]
pub struct TuneReport {
    pub rows: Vec<TuneRow>,
    /// Candidates timed this call, over all classes (0 when everything came from the cache, the budget
    /// was 0 or tuning is off).
    pub timings: usize,
    /// Samples taken this call, screening included.
    pub samples: usize,
    /// Classes left untimed because the budget was spent.
    pub skipped: usize,
    /// Milliseconds this call took (on its clock).
    pub elapsed_ms: f64,
    pub budget_ms: Option<f64>,
    /// "gpu timestamps" or "wall clock" (empty when nothing was timed).
    pub timer: &'static str,
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
            "{:<44} {:>6} {:>13}  {}\n",
            "op / shape class",
            "share",
            "chosen",
            "variants (ms per call; * = chosen; xN = screened out, N times slower)"
        ));
        for r in &self.rows {
            let mut times: Vec<String> = r
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
            times.extend(
                r.dropped
                    .iter()
                    .filter(|(n, _)| !r.times_ms.iter().any(|(t, _)| t == n))
                    .map(|(n, f)| {
                        if f.is_finite() {
                            format!("{n} x{f:.1}")
                        } else {
                            format!("{n} (lost earlier)")
                        }
                    }),
            );
            if !r.untried.is_empty() {
                times.push(format!("{} untried (next load)", r.untried.join("/")));
            }
            let times = match r.status {
                RowStatus::Cached if times.is_empty() => "(cached)".to_string(),
                RowStatus::Skipped => "(not timed: budget spent; static choice)".to_string(),
                _ => times.join(", "),
            };
            let at = if r.status == RowStatus::Timed {
                match r.timed_shape {
                    Some(t) => format!("  @M={} N={} ({:.0} ms)", t.m, t.n, r.spent_ms),
                    None => format!("  ({:.0} ms)", r.spent_ms),
                }
            } else {
                String::new()
            };
            s.push_str(&format!(
                "{:<44} {:>5.1}% {:>13}  {}{}{}\n",
                r.class.describe(),
                100.0 * r.share,
                r.chosen,
                times,
                at,
                if r.cached { "  [cache]" } else { "" }
            ));
        }
        let timed = self
            .rows
            .iter()
            .filter(|r| r.status == RowStatus::Timed)
            .count();
        let cached = self
            .rows
            .iter()
            .filter(|r| r.status == RowStatus::Cached)
            .count();
        s.push_str(&format!(
            "{timed} classes timed ({} candidates, {} samples, {}), {cached} from the cache, {} left for later loads; {:.0} ms{}\n",
            self.timings,
            self.samples,
            if self.timer.is_empty() { "-" } else { self.timer },
            self.skipped,
            self.elapsed_ms,
            match self.budget_ms {
                Some(b) => format!(" of a {b:.0} ms budget"),
                None => String::new(),
            }
        ));
        s
    }
}

/// In `auto`, shapes are never timed at more rows than this (the per-row cost of a GEMM is flat once
/// the grid fills the device); `exhaustive` times the full shape.
pub const AUTO_MAX_ROWS: usize = 2048;

/// `auto`: a probe call of the fastest candidate lasts about this long (ms)...
pub const PROBE_CALL_MS: f64 = 2.0;
/// ... and a timed call about this long (ms), from the measured speed of the device.
pub const TIMED_CALL_MS: f64 = 8.0;
/// Before any measurement, the probe has this many FLOPs.
const INITIAL_PROBE_FLOPS: f64 = 4.0e6;
/// Shrunk shapes keep at least this many rows (GEMM) ...
const MIN_ROWS: usize = 32;
/// ... this many output columns ...
const MIN_COLS: usize = 256;
/// ... and, for timed decode GEMVs, this many weight bytes (so the weights do not fit in a cache and
/// memory traffic is measured as in the model).
const MIN_GEMV_WEIGHT_BYTES: f64 = 16.0 * 1024.0 * 1024.0;

/// Screening: a candidate slower than this times the fastest at the probe size cannot win.
pub const SCREEN_FACTOR: f64 = 2.0;
/// Samples per candidate at the probe size (the fastest counts).
const SCREEN_SAMPLES: usize = 2;
/// A candidate slower than this times the fastest is not timed again for the same kind of class.
pub const BAN_FACTOR: f64 = 8.0;

/// A sample batches calls until it lasts at least this long (ms): GPU timestamps, wall time.
const MIN_SAMPLE_MS_GPU: f64 = 2.0;
const MIN_SAMPLE_MS_WALL: f64 = 8.0;
const MAX_CALLS_PER_SAMPLE: usize = 64;
/// Samples per timed candidate: enough for this many ms in all, within [min, max].
const AUTO_CANDIDATE_MS: f64 = 30.0;
const AUTO_REPS: (usize, usize) = (3, 9);
const EXHAUSTIVE_CANDIDATE_MS: f64 = 100.0;
const EXHAUSTIVE_REPS: (usize, usize) = (7, 15);

/// Version recorded in (and required of) the cache: a new package may bring new kernels.
const PACKAGE_VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Serialize, Deserialize)]
struct CacheFile {
    package: String,
    adapter: String,
    entries: Vec<CacheEntry>,
    /// Linear candidates that lost by more than [`BAN_FACTOR`] on this adapter, per regime and weight
    /// format: `auto` on a later load neither compiles nor times them (`exhaustive` times them and
    /// clears the list).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    banned: Vec<BanEntry>,
}

#[derive(Serialize, Deserialize, Clone, PartialEq, Eq)]
struct BanEntry {
    /// "gemv" (decode rows) or "gemm".
    regime: String,
    format: String,
    variant: String,
}

#[derive(Serialize, Deserialize, Clone)]
struct CacheEntry {
    op: String,
    format: String,
    dims: [usize; 3],
    variant: String,
    times_ms: BTreeMap<String, f64>,
    /// Candidates not tried yet (the budget ran out while compiling them): a later load times them
    /// against `variant`. Empty (absent in older files) = the class is done.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    untried: Vec<String>,
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

/// The linear shapes (patch-embedding convs included, as im2col GEMMs) Florence-2 runs for `cfg` on a
/// `height` x `width` image, with decode steps of 1 and `beams` rows and weights in `format`, one per
/// class, each with its estimated cost in one request ([`LinearShape::cost`] times its calls: layers,
/// blocks, and [`DECODE_STEPS_ESTIMATE`] decode steps). Prompt length varies; the encoder rows are taken
/// for a prompt of 16 tokens (rows are bucketed by powers of two, so nearby lengths share the class).
pub fn model_linear_workload(
    cfg: &Florence2Config,
    height: usize,
    width: usize,
    beams: usize,
    format: DType,
) -> Vec<(LinearShape, f64)> {
    let mut out: Vec<(LinearShape, f64)> = Vec::new();
    let mut push = |m: usize, n: usize, k: usize, calls: f64, format: DType| {
        // The loader keeps matrices whose rows are not whole quantization blocks in f16.
        let format = if format.qformat().is_some() && !k.is_multiple_of(crate::gpu::quant::QBLOCK) {
            DType::F16
        } else {
            format
        };
        let s = LinearShape { m, n, k, format };
        if m == 0 || n == 0 || k == 0 {
            return;
        }
        let cost = calls * s.cost();
        match out.iter_mut().find(|(o, _)| o.class() == s.class()) {
            Some((o, c)) => {
                o.m = o.m.max(m);
                *c += cost;
            }
            None => out.push((s, cost)),
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
        // 152 with an f32 weight: `conv::gemm_k`). Conv weights are f32 for fp32 models and f16
        // otherwise (`WeightDType::conv_dtype`).
        let cin = if s == 0 {
            v.in_channels
        } else {
            v.embed_dim[s - 1]
        };
        let kk = k * k * cin;
        let stored = if format == DType::F32 {
            DType::F32
        } else {
            DType::F16
        };
        let (kg, fg) = crate::ops::conv::gemm_k(kk, stored);
        push(h * w, c, kg, 1.0, fg);
        let hidden = (c as f64 * v.mlp_ratio) as usize;
        let rows = h * w;
        let wrows = h.div_ceil(ws) * w.div_ceil(ws) * ws * ws;
        // Each block: a spatial (window) and a channel attention, each with an MLP.
        let blocks = v.depths.get(s).copied().unwrap_or(1).max(1) as f64;
        push(wrows, 3 * c, c, blocks, format); // window attention qkv
        push(rows, c, c, 2.0 * blocks, format); // attention out projections
        push(rows, 3 * c, c, blocks, format); // channel attention qkv
        push(rows, hidden, c, 2.0 * blocks, format); // fc1 (GELU)
        push(rows, c, hidden, 2.0 * blocks, format); // fc2
    }
    let t = &cfg.text;
    let c_last = v.embed_dim.last().copied().unwrap_or(0);
    let image_tokens = h * w + 1;
    push(image_tokens, v.projection_dim, c_last, 1.0, format); // image_projection
    let seq = image_tokens + 16;
    let d = t.d_model;
    let (enc, dec) = (t.encoder_layers as f64, t.decoder_layers as f64);
    push(seq, d, d, 4.0 * enc + 2.0 * dec, format); // encoder q/k/v/o, decoder cross k/v
    push(seq, t.encoder_ffn_dim, d, enc, format);
    push(seq, d, t.encoder_ffn_dim, enc, format);
    let mut steps = vec![1];
    if beams > 1 {
        steps.push(beams);
    }
    let n = DECODE_STEPS_ESTIMATE;
    for &m in &steps {
        push(m, d, d, 6.0 * dec * n, format); // decoder q/k/v/o, cross q/o
        push(m, t.decoder_ffn_dim, d, dec * n, format);
        push(m, d, t.decoder_ffn_dim, dec * n, format);
        push(m, t.vocab_size, d, n, format); // LM head
    }
    out
}

/// The distinct linear shapes of [`model_linear_workload`], in its order.
pub fn model_linear_shapes(
    cfg: &Florence2Config,
    height: usize,
    width: usize,
    beams: usize,
    format: DType,
) -> Vec<LinearShape> {
    model_linear_workload(cfg, height, width, beams, format)
        .into_iter()
        .map(|(s, _)| s)
        .collect()
}

/// Tune the kernels for the shapes `model` runs on `height` x `width` images with decode steps of up to
/// `beams` rows, weights in the model's resident format: its linear layers and its attention calls.
pub async fn tune_model(
    model: &Florence2,
    height: usize,
    width: usize,
    beams: usize,
    opts: &TuneOptions,
    cache: &CacheLocation,
) -> Result<TuneReport> {
    let format = model.shared.dtype();
    let work = model_linear_workload(&model.config, height, width, beams.max(1), format);
    let cases = model_attention_workload(&model.config, height, width, beams.max(1));
    let cases: Vec<(&dyn TuneCase, f64)> = cases.iter().map(|(c, w)| (c.as_ref(), *w)).collect();
    tune_budgeted(model.gpu(), &work, &cases, opts, cache).await
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
    model_attention_workload(cfg, height, width, beams)
        .into_iter()
        .map(|(c, _)| c)
        .collect()
}

/// [`model_attention_cases`], each with its estimated cost in one request (FLOPs times its calls:
/// blocks, layers, [`DECODE_STEPS_ESTIMATE`] decode steps), for the tuner's priority order.
pub fn model_attention_workload(
    cfg: &Florence2Config,
    height: usize,
    width: usize,
    beams: usize,
) -> Vec<(Box<dyn TuneCase>, f64)> {
    use crate::ops::attention::AttnShape;
    use crate::ops::window_attn::WindowShape;
    let mut out: Vec<(Box<dyn TuneCase>, f64)> = Vec::new();
    let mut push = |case: Box<dyn TuneCase>, calls: f64| {
        let cost = calls * case.flops();
        match out.iter_mut().find(|o| o.0.class() == case.class()) {
            Some(o) => o.1 += cost,
            None => out.push((case, cost)),
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
        let blocks = v.depths.get(s).copied().unwrap_or(1).max(1) as f64;
        push(
            Box::new(WindowShape {
                windows,
                t: ws * ws,
                c,
                heads,
            }),
            blocks,
        );
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
    push(
        Box::new(enc(1, seq, 1, seq, t.encoder_attention_heads)),
        t.encoder_layers as f64,
    );
    let per_step = t.decoder_layers as f64 * DECODE_STEPS_ESTIMATE;
    let cache_len = t.max_position_embeddings.max(1);
    let mut steps = vec![1];
    if beams > 1 {
        steps.push(beams);
    }
    for &b in &steps {
        let heads = t.decoder_attention_heads;
        push(Box::new(enc(b, 1, b, cache_len, heads)), per_step); // self-attention over the cache
        push(Box::new(enc(b, 1, 1, seq, heads)), per_step); // cross-attention, K/V shared (Bk = 1)
    }
    out
}

/// Tune `shapes` on `gpu` without a time budget, each weighted by its own cost (see [`tune_budgeted`]).
pub async fn tune(
    gpu: &std::sync::Arc<Gpu>,
    shapes: &[LinearShape],
    mode: Tuning,
    cache: &CacheLocation,
) -> Result<TuneReport> {
    tune_with(gpu, shapes, &[], mode, cache).await
}

/// [`tune`] with the calls of other ops ([`TuneCase`]: attention, window attention) in the same cache
/// file and report; no time budget.
pub async fn tune_with(
    gpu: &std::sync::Arc<Gpu>,
    shapes: &[LinearShape],
    cases: &[&dyn TuneCase],
    mode: Tuning,
    cache: &CacheLocation,
) -> Result<TuneReport> {
    let work: Vec<(LinearShape, f64)> = shapes.iter().map(|s| (*s, s.cost())).collect();
    let cases: Vec<(&dyn TuneCase, f64)> = cases.iter().map(|c| (*c, c.flops())).collect();
    tune_budgeted(gpu, &work, &cases, &TuneOptions::unbounded(mode), cache).await
}

/// The regime a class is timed in: decode GEMV rows or GEMM rows. Speeds and bans are per regime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Regime {
    Gemv,
    Gemm,
}

fn regime(shape: &LinearShape) -> Regime {
    if shape.m <= crate::gpu::registry::EXACT_ROWS {
        Regime::Gemv
    } else {
        Regime::Gemm
    }
}

/// `shape` shrunk so one call has about `flops` FLOPs: rows first (GEMM, down to [`MIN_ROWS`], never
/// above [`AUTO_MAX_ROWS`]), then columns (down to [`MIN_COLS`]; for a decode GEMV's timed size not below
/// [`MIN_GEMV_WEIGHT_BYTES`] of weights when `keep_traffic`). Rows are multiples of 16 and columns of 64
/// unless the shape's own are smaller.
pub fn shrink(shape: &LinearShape, flops: f64, keep_traffic: bool) -> LinearShape {
    let LinearShape { m, n, k, format } = *shape;
    let per = |rows: usize, cols: usize| 2.0 * rows as f64 * cols as f64 * k as f64;
    let round = |x: usize, q: usize| x.div_ceil(q) * q;
    let mut rows = m;
    if regime(shape) == Regime::Gemm {
        let want = (flops / per(1, n)).ceil().max(1.0) as usize;
        rows = round(want, 16).clamp(MIN_ROWS.min(m), m.min(AUTO_MAX_ROWS));
    }
    let mut cols = n;
    if per(rows, n) > 2.0 * flops && n > MIN_COLS {
        let mut floor = MIN_COLS;
        if keep_traffic && regime(shape) == Regime::Gemv {
            let row_bytes = format.row_bytes(k).max(1) as f64;
            floor = floor.max((MIN_GEMV_WEIGHT_BYTES / row_bytes).ceil() as usize);
        }
        let want = (flops / per(rows, 1)).ceil().max(1.0) as usize;
        cols = round(want, 64).clamp(floor.min(n), n);
    }
    LinearShape {
        m: rows,
        n: cols,
        k,
        format,
    }
}

/// Calls per sample so a sample of a call lasting `call_ms` lasts at least `min_sample_ms`.
fn calls_for(call_ms: Option<f64>, min_sample_ms: f64) -> usize {
    match call_ms {
        Some(t) if t > 0.0 => ((min_sample_ms / t).ceil() as usize).clamp(1, MAX_CALLS_PER_SAMPLE),
        _ => 1,
    }
}

/// Samples per candidate so they add up to `total_ms`, within `[lo, hi]`.
fn reps_for(sample_ms: f64, total_ms: f64, (lo, hi): (usize, usize)) -> usize {
    if sample_ms <= 0.0 || !sample_ms.is_finite() {
        return hi;
    }
    ((total_ms / sample_ms).ceil() as usize).clamp(lo, hi)
}

/// Candidates that can still win after screening (`<= SCREEN_FACTOR` x the fastest) and those to ban
/// (`> BAN_FACTOR` x). `times` are ms per call; `None` = failed (neither kept nor banned).
fn screen<T: Copy>(times: &[(T, Option<f64>)]) -> (Vec<T>, Vec<(T, f64)>, Vec<T>) {
    let best = times
        .iter()
        .filter_map(|(_, t)| *t)
        .fold(f64::INFINITY, f64::min);
    let mut keep = Vec::new();
    let mut dropped = Vec::new();
    let mut ban = Vec::new();
    for &(v, t) in times {
        let Some(t) = t else { continue };
        let ratio = if best > 0.0 { t / best } else { 1.0 };
        if ratio <= SCREEN_FACTOR {
            keep.push(v);
        } else {
            dropped.push((v, ratio));
            if ratio > BAN_FACTOR {
                ban.push(v);
            }
        }
    }
    (keep, dropped, ban)
}

/// The budget: a class starts only while the time spent plus the average class cost so far fits.
struct Budget {
    start: f64,
    limit: Option<f64>,
    spent_on_classes: f64,
    classes: usize,
}

impl Budget {
    fn allows_another(&self, now: f64) -> bool {
        let Some(limit) = self.limit else {
            return true;
        };
        let avg = if self.classes == 0 {
            0.0
        } else {
            self.spent_on_classes / self.classes as f64
        };
        now - self.start + avg < limit
    }

    fn record(&mut self, ms: f64) {
        self.spent_on_classes += ms.max(0.0);
        self.classes += 1;
    }
}

/// One thing to tune: a linear shape (shrinkable) or another op's call ([`TuneCase`], full size).
#[derive(Clone, Copy)]
enum Job<'a> {
    Linear(LinearShape),
    Case(&'a dyn TuneCase),
}

impl Job<'_> {
    fn class(&self) -> ShapeClass {
        match self {
            Job::Linear(s) => s.class(),
            Job::Case(c) => c.class(),
        }
    }

    fn candidates(&self, caps: &Caps) -> Vec<&'static str> {
        match self {
            Job::Linear(s) => LinearVariant::ALL
                .into_iter()
                .filter(|v| v.supports(caps, s.m, s.k, s.format))
                .map(LinearVariant::name)
                .collect(),
            Job::Case(c) => c.candidates(caps),
        }
    }

    /// What runs with tuning off (other ops: their launcher's own rule, shown as "static").
    fn static_choice(&self, caps: &Caps) -> &'static str {
        match self {
            Job::Linear(s) => choose_linear_variant_for(caps, s.m, s.k, s.format).name(),
            Job::Case(_) => "static",
        }
    }

    /// Speeds and bans are kept per op, regime and weight format.
    fn kind(&self) -> (crate::gpu::registry::OpKind, Regime, DType) {
        let c = self.class();
        match self {
            Job::Linear(s) => (c.op, regime(s), c.format),
            Job::Case(_) => (c.op, Regime::Gemm, c.format),
        }
    }
}

/// Tune the (shape, cost) `work` and the (call, cost) `cases` on `gpu` as `opts` says (see the module
/// docs) and install the choices. With [`Tuning::Off`] the choice table is cleared (static choices) and
/// nothing is timed or cached.
pub async fn tune_budgeted(
    gpu: &std::sync::Arc<Gpu>,
    work: &[(LinearShape, f64)],
    cases: &[(&dyn TuneCase, f64)],
    opts: &TuneOptions,
    cache: &CacheLocation,
) -> Result<TuneReport> {
    let clock = opts.clock.clone();
    let t0 = clock.now_ms();
    let mode = opts.mode;
    let mut report = TuneReport {
        budget_ms: if mode == Tuning::Auto {
            opts.budget_ms
        } else {
            None
        },
        ..TuneReport::default()
    };
    if mode == Tuning::Off {
        gpu.choices.clear();
        return Ok(report);
    }
    // Distinct classes (a linear class keeps the largest row count seen as the one to time), costs
    // summed; most expensive first.
    let mut jobs: Vec<(Job, f64)> = Vec::new();
    for (s, c) in work {
        match jobs.iter_mut().find(|(o, _)| o.class() == s.class()) {
            Some((Job::Linear(o), oc)) => {
                o.m = o.m.max(s.m);
                *oc += c.max(0.0);
            }
            Some((_, oc)) => *oc += c.max(0.0),
            None => jobs.push((Job::Linear(*s), c.max(0.0))),
        }
    }
    for (case, c) in cases {
        match jobs.iter_mut().find(|(o, _)| o.class() == case.class()) {
            Some((_, oc)) => *oc += c.max(0.0),
            None => jobs.push((Job::Case(*case), c.max(0.0))),
        }
    }
    // Priority order matters only under a budget; otherwise the caller's order is kept.
    if mode == Tuning::Auto && opts.budget_ms.is_some() {
        jobs.sort_by(|a, b| b.1.total_cmp(&a.1));
    }
    let total_cost: f64 = jobs.iter().map(|c| c.1).sum::<f64>().max(f64::MIN_POSITIVE);

    let adapter = gpu.caps.adapter_key.clone();
    let name = cache_name(&adapter);
    let mut entries: Vec<CacheEntry> = Vec::new();
    let mut saved_bans: Vec<BanEntry> = Vec::new();
    if !matches!(cache, CacheLocation::None) {
        report.cache_path = Some(store::describe(cache, &name));
        match store::load(cache, &name).await {
            Ok(None) => {}
            Ok(Some(text)) => match serde_json::from_str::<CacheFile>(&text) {
                Ok(f) if f.package == PACKAGE_VERSION && f.adapter == adapter => {
                    entries = f.entries;
                    saved_bans = f.banned;
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

    let use_gpu_timer = opts.timer == Timer::Auto && gpu.caps.timestamp_query;
    let mut timer = SampleTimer {
        gpu: gpu.clone(),
        clock: clock.clone(),
        gpu_time: use_gpu_timer,
        samples: 0,
        warms: (0.0, 0),
    };
    let mut budget = Budget {
        start: t0,
        limit: report.budget_ms,
        spent_on_classes: 0.0,
        classes: 0,
    };
    // Measured FLOPs per ms of the fastest linear candidate, per regime; candidates banned per kind.
    let mut speed: std::collections::HashMap<Regime, f64> = Default::default();
    type Kind = (crate::gpu::registry::OpKind, Regime, DType);
    let mut banned: std::collections::HashSet<(Kind, &'static str)> = Default::default();
    let regime_name = |r: Regime| match r {
        Regime::Gemv => "gemv",
        Regime::Gemm => "gemm",
    };
    if mode == Tuning::Auto {
        for b in &saved_bans {
            let (Some(v), Some(f)) = (
                LinearVariant::from_name(&b.variant),
                format_from_name(&b.format),
            ) else {
                continue;
            };
            for r in [Regime::Gemv, Regime::Gemm] {
                if regime_name(r) == b.regime {
                    banned.insert(((crate::gpu::registry::OpKind::Linear, r, f), v.name()));
                }
            }
        }
    }
    let bans_before = banned.len();

    let mut dirty = false;
    for (job, cost) in &jobs {
        let job = *job;
        let class = job.class();
        let share = cost / total_cost;
        let candidates = job.candidates(&gpu.caps);
        if candidates.is_empty() {
            continue;
        }
        let linear_shape = match job {
            Job::Linear(s) => Some(s),
            Job::Case(_) => None,
        };
        let static_choice = job.static_choice(&gpu.caps);
        let by_name = |n: &str| candidates.iter().copied().find(|c| *c == n);
        let mut resume: Option<(&'static str, Vec<&'static str>)> = None;
        if mode == Tuning::Auto {
            let hit = entries.iter().find(|e| {
                e.op == class.op.name()
                    && format_from_name(&e.format) == Some(class.format)
                    && e.dims == class.dims
            });
            let best_so_far = hit.and_then(|e| by_name(&e.variant));
            let untried: Vec<&'static str> = hit
                .map(|e| e.untried.iter().filter_map(|n| by_name(n)).collect())
                .unwrap_or_default();
            if let Some(v) = best_so_far.filter(|_| !untried.is_empty()) {
                // A class a budget cut short: its best so far runs meanwhile; the rest is resumed below.
                gpu.choices.set(class, v);
                resume = Some((v, untried));
            } else if let Some(v) = best_so_far {
                gpu.choices.set(class, v);
                report.rows.push(TuneRow {
                    class,
                    timed_shape: linear_shape,
                    times_ms: Vec::new(),
                    dropped: Vec::new(),
                    chosen: v,
                    cached: true,
                    status: RowStatus::Cached,
                    share,
                    spent_ms: 0.0,
                    untried: Vec::new(),
                });
                continue;
            }
            if !budget.allows_another(clock.now_ms()) {
                report.skipped += 1;
                report.rows.push(TuneRow {
                    class,
                    timed_shape: linear_shape,
                    times_ms: Vec::new(),
                    dropped: Vec::new(),
                    chosen: resume.as_ref().map_or(static_choice, |r| r.0),
                    cached: false,
                    status: RowStatus::Skipped,
                    share,
                    spent_ms: 0.0,
                    untried: Vec::new(),
                });
                continue;
            }
        }
        let class_start = clock.now_ms();
        let kind = job.kind();
        // Static choice (or the best so far of a resumed class) first: it warms the operands' memory
        // for the others.
        let mut order: Vec<&'static str> = match &resume {
            Some((best, untried)) => std::iter::once(*best)
                .chain(untried.iter().copied())
                .collect(),
            None => candidates.clone(),
        };
        let first = resume.as_ref().map_or(static_choice, |r| r.0);
        order.sort_by_key(|v| *v != first);
        let outcome = if mode == Tuning::Exhaustive {
            match job {
                Job::Linear(s) => time_exhaustive(&mut timer, &s, &order).await?,
                Job::Case(c) => time_case(&mut timer, c, &order, None, true).await?,
            }
        } else {
            let mut dropped: Vec<(&'static str, f64)> = Vec::new();
            order.retain(|v| {
                let out = banned.contains(&(kind, *v));
                if out {
                    dropped.push((v, f64::INFINITY));
                }
                !out
            });
            let deadline = budget.limit.map(|l| budget.start + l);
            let mut o = match job {
                Job::Linear(s) => time_auto(&mut timer, &s, &order, &mut speed, deadline).await?,
                Job::Case(c) => time_case(&mut timer, c, &order, deadline, false).await?,
            };
            // Bans only among linear classes of one regime (attention shapes differ too much).
            if matches!(job, Job::Linear(_)) {
                for (v, f) in &o.dropped {
                    if *f > BAN_FACTOR {
                        banned.insert((kind, v));
                    }
                }
            }
            o.dropped.extend(dropped);
            o
        };
        let spent_ms = clock.now_ms() - class_start;
        budget.record(spent_ms);
        report.timings += outcome.times.iter().filter(|(_, t)| t.is_some()).count()
            + outcome
                .dropped
                .iter()
                .filter(|(n, f)| f.is_finite() && !outcome.times.iter().any(|(t, _)| t == n))
                .count();
        let best = outcome
            .times
            .iter()
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
            untried: outcome.untried.iter().map(|v| v.to_string()).collect(),
            times_ms: outcome
                .times
                .iter()
                .filter_map(|(v, t)| t.map(|t| (v.to_string(), t)))
                .collect(),
        });
        dirty = true;
        report.rows.push(TuneRow {
            class,
            timed_shape: outcome.shape,
            times_ms: outcome.times,
            dropped: outcome.dropped,
            chosen: best,
            cached: false,
            status: RowStatus::Timed,
            share,
            spent_ms,
            untried: outcome.untried,
        });
    }
    report.samples = timer.samples;
    if report.samples > 0 {
        report.timer = if timer.gpu_time {
            "gpu timestamps"
        } else {
            "wall clock"
        };
    }
    if (dirty || banned.len() != bans_before || mode == Tuning::Exhaustive)
        && !matches!(cache, CacheLocation::None)
    {
        let mut bans: Vec<BanEntry> = banned
            .iter()
            .map(|((_, r, f), v)| BanEntry {
                regime: regime_name(*r).to_string(),
                format: format!("{f:?}"),
                variant: v.to_string(),
            })
            .collect();
        // An exhaustive run timed every candidate again: it clears the bans (a ban from a noisy
        // screening is undone by `florence2 tune --tuning exhaustive`).
        if mode == Tuning::Exhaustive {
            bans.clear();
        }
        bans.sort_by(|a, b| {
            (&a.regime, &a.format, &a.variant).cmp(&(&b.regime, &b.format, &b.variant))
        });
        let file = CacheFile {
            package: PACKAGE_VERSION.to_string(),
            adapter,
            entries,
            banned: bans,
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
    report.elapsed_ms = clock.now_ms() - t0;
    Ok(report)
}

/// What timing one class gave: median ms per call (at `shape` for a linear) per timed candidate, the
/// screened-out ones, and those left untried.
struct Outcome {
    shape: Option<LinearShape>,
    times: Vec<(&'static str, Option<f64>)>,
    dropped: Vec<(&'static str, f64)>,
    /// Not compiled: the deadline passed first.
    untried: Vec<&'static str>,
}

/// Warm-up (compiles each pipeline; in the browser compiled asynchronously, so timing would include
/// it) of `order` in turn; past `deadline` the rest stays untried (at least two are always tried, so
/// every load progresses). Returns (ran, untried, failed).
async fn warm_all(
    timer: &mut SampleTimer,
    bench: &dyn Bench,
    order: &[&'static str],
    deadline: Option<f64>,
) -> (Vec<&'static str>, Vec<&'static str>, Vec<&'static str>) {
    let (mut alive, mut untried, mut failed) = (Vec::new(), Vec::new(), Vec::new());
    for (i, &v) in order.iter().enumerate() {
        // A compile cannot be interrupted: one is started only if an average one still fits.
        if i >= 2 && deadline.is_some_and(|d| timer.clock.now_ms() + timer.avg_warm_ms() >= d) {
            untried.push(v);
        } else if timer.warm(bench, v).await {
            alive.push(v);
        } else {
            failed.push(v);
        }
    }
    (alive, untried, failed)
}

/// [`SCREEN_SAMPLES`] interleaved samples of each candidate, the fastest kept: interference from other
/// work on the device (on a CPU adapter, other processes) only ever adds time, so one unlucky sample
/// must not drop a candidate.
async fn screen_samples(
    timer: &mut SampleTimer,
    bench: &dyn Bench,
    alive: &[&'static str],
    calls: usize,
) -> Vec<(&'static str, Option<f64>)> {
    let mut out: Vec<(&'static str, Option<f64>)> = alive.iter().map(|v| (*v, None)).collect();
    let mut failed = vec![false; alive.len()];
    for _ in 0..SCREEN_SAMPLES {
        for (i, &v) in alive.iter().enumerate() {
            if failed[i] {
                continue;
            }
            match timer.sample(bench, v, calls).await {
                Some(t) => out[i].1 = Some(out[i].1.map_or(t, |b: f64| b.min(t))),
                None => {
                    failed[i] = true;
                    out[i].1 = None;
                }
            }
        }
    }
    out
}

/// `auto`, linear: probe-size screening, then the survivors at the timed size.
async fn time_auto(
    timer: &mut SampleTimer,
    shape: &LinearShape,
    order: &[&'static str],
    speed: &mut std::collections::HashMap<Regime, f64>,
    deadline: Option<f64>,
) -> Result<Outcome> {
    let reg = regime(shape);
    let probe_flops = speed
        .get(&reg)
        .map_or(INITIAL_PROBE_FLOPS, |s| s * PROBE_CALL_MS);
    let probe = shrink(shape, probe_flops, false);
    let mut bench = Operands::new(&timer.gpu, &probe)?;
    let (alive, untried, failed) = warm_all(timer, &bench, order, deadline).await;
    // Size the screening samples from the speed measured so far, else from one call of the first
    // candidate (the static choice), so even the first class is screened on batched samples.
    let mut est_call = speed.get(&reg).map(|s| probe.flops() / s);
    if est_call.is_none() {
        if let Some(&v) = alive.first() {
            est_call = timer.sample(&bench, v, 1).await;
        }
    }
    let calls = calls_for(est_call, timer.min_sample_ms());
    let screen_times = screen_samples(timer, &bench, &alive, calls).await;
    let (keep, dropped, _) = screen(&screen_times);
    let best_probe = screen_times
        .iter()
        .filter_map(|(_, t)| *t)
        .fold(f64::INFINITY, f64::min);
    if best_probe.is_finite() && best_probe > 0.0 {
        speed.insert(reg, probe.flops() / best_probe);
    }
    let timed = match speed.get(&reg) {
        Some(s) => shrink(shape, s * TIMED_CALL_MS, true),
        None => probe,
    };
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); keep.len()];
    if timed != probe {
        drop(bench);
        bench = Operands::new(&timer.gpu, &timed)?;
        // Operands are new memory: one untimed call touches it.
        if let Some(&v) = keep.first() {
            timer.warm(&bench, v).await;
        }
    } else {
        // The screening sample is the first sample at this size.
        for (i, v) in keep.iter().enumerate() {
            if let Some((_, Some(t))) = screen_times.iter().find(|(w, _)| w == v) {
                samples[i].push(*t);
            }
        }
    }
    let est_call = speed.get(&reg).map(|s| timed.flops() / s);
    let calls = calls_for(est_call, timer.min_sample_ms());
    let sample_ms = est_call.map_or(f64::NAN, |t| t * calls as f64);
    let reps = reps_for(sample_ms, AUTO_CANDIDATE_MS, AUTO_REPS);
    let mut times = timer.interleaved(&bench, &keep, calls, reps, samples).await;
    if let Some(best) = times.iter().filter_map(|(_, t)| *t).reduce(f64::min) {
        if best > 0.0 {
            speed.insert(reg, timed.flops() / best);
        }
    }
    times.extend(failed.into_iter().map(|v| (v, None)));
    Ok(Outcome {
        shape: Some(timed),
        times,
        dropped,
        untried,
    })
}

/// `exhaustive`, linear: every candidate at the full shape, more samples.
async fn time_exhaustive(
    timer: &mut SampleTimer,
    shape: &LinearShape,
    order: &[&'static str],
) -> Result<Outcome> {
    let bench = Operands::new(&timer.gpu, shape)?;
    let mut o = time_full(timer, &bench, order, None, true).await;
    o.shape = Some(*shape);
    Ok(o)
}

/// Another op's call ([`TuneCase`]) at its full size: `auto` screens (within `deadline`), `exhaustive`
/// times every candidate with more samples.
async fn time_case(
    timer: &mut SampleTimer,
    case: &dyn TuneCase,
    order: &[&'static str],
    deadline: Option<f64>,
    exhaustive: bool,
) -> Result<Outcome> {
    let small = if exhaustive { None } else { case.auto_shape() };
    let timed: &dyn TuneCase = small.as_deref().unwrap_or(case);
    let bench = CaseBench(timed.prepare(&timer.gpu)?);
    Ok(time_full(timer, &bench, order, deadline, exhaustive).await)
}

/// Every candidate of `order` on one fixed-size `bench`.
async fn time_full(
    timer: &mut SampleTimer,
    bench: &dyn Bench,
    order: &[&'static str],
    deadline: Option<f64>,
    exhaustive: bool,
) -> Outcome {
    let (alive, untried, failed) = warm_all(timer, bench, order, deadline).await;
    let mut screened: Vec<(&'static str, Option<f64>)> = Vec::new();
    // One call of the first, to size the samples.
    let est = match alive.first() {
        Some(&v) => timer.sample(bench, v, 1).await,
        None => None,
    };
    let calls = calls_for(est, timer.min_sample_ms());
    let (keep, dropped, mut samples) = if exhaustive {
        (alive.clone(), Vec::new(), vec![Vec::new(); alive.len()])
    } else {
        let screen_times = screen_samples(timer, bench, &alive, calls).await;
        let (keep, dropped, _) = screen(&screen_times);
        // At full size the screening times of the dropped are real times per call: keep them.
        screened = screen_times
            .iter()
            .filter(|(v, _)| !keep.contains(v))
            .copied()
            .collect();
        let samples = keep
            .iter()
            .map(|v| {
                screen_times
                    .iter()
                    .find(|(w, _)| w == v)
                    .and_then(|(_, t)| *t)
                    .into_iter()
                    .collect()
            })
            .collect();
        (keep, dropped, samples)
    };
    let sample_ms = est.map_or(f64::NAN, |t| t * calls as f64);
    let reps = if exhaustive {
        reps_for(sample_ms, EXHAUSTIVE_CANDIDATE_MS, EXHAUSTIVE_REPS)
    } else {
        reps_for(sample_ms, AUTO_CANDIDATE_MS, AUTO_REPS)
    };
    if exhaustive {
        samples = vec![Vec::new(); keep.len()];
    }
    let mut times = timer.interleaved(bench, &keep, calls, reps, samples).await;
    times.extend(screened);
    times.extend(failed.into_iter().map(|v| (v, None)));
    Outcome {
        shape: None,
        times,
        dropped,
        untried,
    }
}

/// Records calls of a named candidate.
trait Bench {
    fn record(&self, rec: &mut Recorder, variant: &'static str, calls: usize) -> Result<()>;
}

/// Zero-filled operands of one linear shape (values do not change the work of these kernels).
struct Operands {
    x: Tensor,
    w: Tensor,
    b: Tensor,
    out: Tensor,
}

impl Operands {
    fn new(gpu: &std::sync::Arc<Gpu>, s: &LinearShape) -> Result<Operands> {
        Ok(Operands {
            x: Tensor::zeros(gpu, &[s.m, s.k], DType::F32, "tune.x")?,
            w: Tensor::zeros(gpu, &[s.n, s.k], s.format, "tune.w")?,
            b: Tensor::zeros(gpu, &[s.n], DType::F32, "tune.bias")?,
            out: Tensor::zeros(gpu, &[s.m, s.n], DType::F32, "tune.out")?,
        })
    }
}

impl Bench for Operands {
    fn record(&self, rec: &mut Recorder, variant: &'static str, calls: usize) -> Result<()> {
        let v = LinearVariant::from_name(variant)
            .ok_or_else(|| Error::shape("linear", format!("no variant {variant:?}")))?;
        for _ in 0..calls {
            linear_variant(
                rec,
                v,
                &self.x,
                &self.w,
                Some(&self.b),
                Act::None,
                &self.out,
            )?;
        }
        Ok(())
    }
}

/// A [`TuneCase`]'s prepared operands.
struct CaseBench(CaseRunner);

impl Bench for CaseBench {
    fn record(&self, rec: &mut Recorder, variant: &'static str, calls: usize) -> Result<()> {
        for _ in 0..calls {
            (self.0)(rec, variant)?;
        }
        Ok(())
    }
}

/// Takes samples: GPU timestamps or wall time; counts them.
struct SampleTimer {
    gpu: std::sync::Arc<Gpu>,
    clock: std::sync::Arc<dyn Clock>,
    gpu_time: bool,
    samples: usize,
    /// Total ms and count of warm-ups.
    warms: (f64, usize),
}

impl SampleTimer {
    fn min_sample_ms(&self) -> f64 {
        if self.gpu_time {
            MIN_SAMPLE_MS_GPU
        } else {
            MIN_SAMPLE_MS_WALL
        }
    }

    /// One untimed call (its first compiles the pipeline); false when the candidate fails (it is then
    /// left out).
    async fn warm(&mut self, bench: &dyn Bench, v: &'static str) -> bool {
        let t0 = self.clock.now_ms();
        let mut rec = Recorder::new(&self.gpu);
        let ok = bench.record(&mut rec, v, 1).is_ok() && rec.submit().is_ok();
        let ok = ok && finish(&self.gpu).await.is_ok();
        self.warms.0 += self.clock.now_ms() - t0;
        self.warms.1 += 1;
        ok
    }

    /// Average warm-up (mostly compile) time so far.
    fn avg_warm_ms(&self) -> f64 {
        if self.warms.1 == 0 {
            0.0
        } else {
            self.warms.0 / self.warms.1 as f64
        }
    }

    /// Ms per call over one sample of `calls` calls; `None` when it failed.
    async fn sample(&mut self, bench: &dyn Bench, v: &'static str, calls: usize) -> Option<f64> {
        self.samples += 1;
        let ms = if self.gpu_time {
            let mut rec = Recorder::new_timed(&self.gpu).ok()?;
            bench.record(&mut rec, v, calls).ok()?;
            rec.submit_timed().await.ok()?
        } else {
            let t0 = self.clock.now_ms();
            let mut rec = Recorder::new(&self.gpu);
            bench.record(&mut rec, v, calls).ok()?;
            rec.submit().ok()?;
            finish(&self.gpu).await.ok()?;
            self.clock.now_ms() - t0
        };
        Some(ms / calls as f64)
    }

    /// Samples of each of `cands`, interleaved, appended to `samples` until each has `reps`; the median
    /// per candidate (`None` when a sample failed).
    async fn interleaved(
        &mut self,
        bench: &dyn Bench,
        cands: &[&'static str],
        calls: usize,
        reps: usize,
        mut samples: Vec<Vec<f64>>,
    ) -> Vec<(&'static str, Option<f64>)> {
        let mut ok = vec![true; cands.len()];
        for _ in 0..reps {
            for (i, &v) in cands.iter().enumerate() {
                if !ok[i] || samples[i].len() >= reps {
                    continue;
                }
                match self.sample(bench, v, calls).await {
                    Some(t) => samples[i].push(t),
                    None => ok[i] = false,
                }
            }
        }
        cands
            .iter()
            .zip(samples)
            .zip(ok)
            .map(|((&v, mut s), ok)| {
                if !ok || s.is_empty() {
                    return (v, None);
                }
                s.sort_by(|a, b| a.total_cmp(b));
                (v, Some(s[s.len() / 2]))
            })
            .collect()
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ls(m: usize, n: usize, k: usize, format: DType) -> LinearShape {
        LinearShape { m, n, k, format }
    }

    #[test]
    fn shrink_sizes_by_flops() {
        // Big GEMM: rows shrink (multiples of 16, at least 32), then columns (at least 256).
        let s = ls(36864, 512, 128, DType::F32);
        let p = shrink(&s, 4.0e6, false);
        assert_eq!((p.m, p.k, p.format), (32, 128, DType::F32));
        assert!(
            p.n >= MIN_COLS && p.n.is_multiple_of(64) && p.n <= 512,
            "{p:?}"
        );
        let t = shrink(&s, 1.0e9, true);
        assert_eq!(
            (t.m, t.n),
            (AUTO_MAX_ROWS, 512),
            "capped rows, full columns"
        );
        let t = shrink(&s, 5.0e7, true);
        assert_eq!(t.n, 512);
        assert!(
            t.m.is_multiple_of(16) && t.m > 32 && t.m < AUTO_MAX_ROWS,
            "{t:?}"
        );
        // Small shapes stay as they are.
        let small = ls(9, 24, 21, DType::F16);
        assert_eq!(shrink(&small, 1.0, false), small);
        // Decode GEMV: rows stay; the probe shrinks columns, the timed size keeps 16 MiB of weights.
        let head = ls(1, 51328, 768, DType::F16);
        let p = shrink(&head, 1.0e5, false);
        assert_eq!((p.m, p.n), (1, MIN_COLS));
        let t = shrink(&head, 1.0e5, true);
        let bytes = t.n * DType::F16.row_bytes(768);
        assert!(
            bytes as f64 >= MIN_GEMV_WEIGHT_BYTES && t.n < 51328,
            "{t:?}"
        );
        assert_eq!(shrink(&head, 1.0e12, true), head);
    }

    #[test]
    fn screening_drops_and_bans() {
        let times = [
            ("a", Some(1.0)),
            ("b", Some(1.9)),
            ("c", Some(2.5)),
            ("d", Some(9.0)),
            ("e", None),
        ];
        let (keep, dropped, ban) = screen(&times);
        assert_eq!(keep, ["a", "b"]);
        assert_eq!(dropped.iter().map(|d| d.0).collect::<Vec<_>>(), ["c", "d"]);
        assert!((dropped[0].1 - 2.5).abs() < 1e-12);
        assert_eq!(ban, ["d"]);
    }

    #[test]
    fn samples_and_reps_follow_durations() {
        assert_eq!(calls_for(None, 2.0), 1);
        assert_eq!(calls_for(Some(0.1), 2.0), 20);
        assert_eq!(calls_for(Some(1e-6), 2.0), MAX_CALLS_PER_SAMPLE);
        assert_eq!(calls_for(Some(50.0), 2.0), 1);
        // Tiny samples get the most repetitions, long ones the fewest.
        assert_eq!(reps_for(2.0, AUTO_CANDIDATE_MS, AUTO_REPS), AUTO_REPS.1);
        assert_eq!(reps_for(100.0, AUTO_CANDIDATE_MS, AUTO_REPS), AUTO_REPS.0);
        assert_eq!(
            reps_for(f64::NAN, AUTO_CANDIDATE_MS, AUTO_REPS),
            AUTO_REPS.1
        );
    }

    #[test]
    fn budget_admits_while_the_average_class_fits() {
        let mut b = Budget {
            start: 100.0,
            limit: Some(50.0),
            spent_on_classes: 0.0,
            classes: 0,
        };
        assert!(b.allows_another(100.0));
        assert!(!b.allows_another(150.0));
        b.record(20.0);
        assert!(b.allows_another(120.0));
        assert!(
            !b.allows_another(131.0),
            "20 spent + 11 elapsed + 20 average > 50"
        );
        let unlimited = Budget { limit: None, ..b };
        assert!(unlimited.allows_another(1e12));
        let zero = Budget {
            start: 0.0,
            limit: Some(0.0),
            spent_on_classes: 0.0,
            classes: 0,
        };
        assert!(!zero.allows_another(0.0));
    }

    #[test]
    fn workload_weighs_layers_and_decode_steps() {
        let cfg = Florence2Config::from_json_str(include_str!(
            "../../tests/fixtures/models/tiny4/config.json"
        ))
        .unwrap();
        let w = model_linear_workload(&cfg, 64, 64, 3, DType::F32);
        let shapes = model_linear_shapes(&cfg, 64, 64, 3, DType::F32);
        assert_eq!(w.len(), shapes.len());
        let d = cfg.text.d_model;
        let cost_of = |m: usize, n: usize| {
            w.iter()
                .find(|(s, _)| s.m == m && s.n == n && s.k == d)
                .map(|x| x.1)
                .unwrap()
        };
        // The decoder's d x d class runs 6 times per layer per step, the LM head once per step.
        let dd = LinearShape {
            m: 1,
            n: d,
            k: d,
            format: DType::F32,
        };
        let want = 6.0 * cfg.text.decoder_layers as f64 * DECODE_STEPS_ESTIMATE * dd.cost();
        assert!((cost_of(1, d) - want).abs() < 1e-6 * want);
        let head = LinearShape {
            n: cfg.text.vocab_size,
            ..dd
        };
        let want = DECODE_STEPS_ESTIMATE * head.cost();
        assert!((cost_of(1, cfg.text.vocab_size) - want).abs() < 1e-6 * want);
        assert!(w.iter().all(|(_, c)| *c > 0.0));
    }
}
