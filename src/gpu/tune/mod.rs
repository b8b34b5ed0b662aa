//! The on-device tuner. It knows only tune cases ([`TuneCase`]: a registry class, the candidate kernels
//! the op owns, and how to record one call of a candidate): for each distinct class it times the
//! candidates on this adapter and records the fastest in the device's
//! [`Choices`](crate::gpu::registry::Choices). Which cases a model runs is the model's business
//! (`model::workloads`); each op's candidates live beside its launcher in `ops/`. The result is cached
//! per adapter and package version: natively in `$XDG_CACHE_HOME/florence2-wasm/` (else
//! `~/.cache/florence2-wasm/`, `%LOCALAPPDATA%`), in the browser in the Cache API. A later load with a
//! cache hit does no timing.
//!
//! It sits in `gpu/` because it needs only the runtime (devices, recorders, the registry) while every
//! op implements its trait: the ops point down to it, never the other way.
//!
//! - `engine`: the run over classes (cache hits, budget, bans, installing choices);
//! - `measure`: one class: warm-ups, screening, the sizes it is timed at;
//! - `timing`: samples (GPU timestamps or wall time), batching, medians;
//! - `store`: the cache file and where it lives;
//! - `report`: what a run did, and the table `florence2 tune` prints;
//! - `clock`: the clock the budget and wall-time samples read.
//!
//! **Timing.** Where the adapter has TIMESTAMP_QUERY, a sample is the GPU time between the first
//! dispatch's beginning and the last one's end ([`Recorder::new_timed`](crate::gpu::Recorder::new_timed)):
//! submit and readback latency, which dominate tiny shapes and differ nothing between candidates, are
//! left out. Otherwise a sample is submit-and-wait wall time. Each sample batches enough calls to last a
//! minimum duration, candidates are interleaved sample by sample (a noisy neighbour hits all alike), and
//! the median is kept; tiny shapes get more samples.
//!
//! **Budget** (`auto`). Classes are tuned in order of their share of the workload's estimated cost, and
//! a class is started only while the time spent plus the average class so far fits the budget (a load's
//! first class to time always starts, however long reading the cache took on a busy machine)
//! ([`AUTO_BUDGET_MS`] by default, on every adapter: on CPU adapters a base model does not fit in one
//! load). Classes left over keep the static choice for this load; every finished class is cached at
//! once, so the next load continues where this one stopped and, once all are cached, times nothing.
//! Compiling a candidate's kernel is often the largest cost on a CPU adapter (seconds for an
//! unrolled kernel on lavapipe) and cannot be interrupted: a compile starts only while an average one
//! still fits before the deadline, and a class cut short this way caches its best so far together with
//! its untried candidates, which a later load times against it (at least two candidates per class and
//! load, so every load progresses; a load overruns the budget by at most one compile and one class's
//! timing).
//! Within a class the cost is bounded as well: candidates are first screened; those slower than
//! [`SCREEN_FACTOR`] x the fastest cannot win and are dropped. A [`Resizable`] case (linear) is screened
//! at a probe size sized from the device's measured speed (a call of the fastest lasts about
//! [`PROBE_CALL_MS`]), and candidates slower than [`BAN_FACTOR`] x are (kept in the cache, so in later
//! loads too) not timed again for cases of the same regime (GEMM or decode GEMV, same weight format) in
//! this run; the survivors are timed at a size whose calls last about [`TIMED_CALL_MS`]. Other cases are
//! timed at their [`TuneCase::auto_shape`]. `exhaustive` has no budget, no screening and times every
//! candidate at the full shape with more samples.
//!
//! A broken cache never fails a load: it is reported as a [`TuneReport::warnings`] entry naming it
//! (`tuning cache ... is corrupt`) and the shapes are re-timed.
//!
//! To tune another op: give it an [`OpKind`](crate::gpu::registry::OpKind) and implement [`TuneCase`]
//! for its call shape beside its launcher (candidates from its variant list with `supports`, operands in
//! `prepare`); the budget, screening, timing, cache and report are shared.

mod clock;
mod engine;
mod measure;
mod report;
mod store;
mod timing;

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gpu::registry::{LinearShape, ShapeClass};
use crate::gpu::{Caps, Device, Recorder};

pub use clock::{Clock, WallClock};
pub use engine::tune_cases;
pub use report::{RowStatus, TuneReport, TuneRow};
pub use timing::{BAN_FACTOR, PROBE_CALL_MS, SCREEN_FACTOR, TIMED_CALL_MS};

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
    pub clock: Arc<dyn Clock>,
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
            clock: Arc::new(WallClock),
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

    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
}

/// One call shape of an op with variants: what the tuner times. The op implements it beside its
/// launcher (`ops/linear_tune.rs`, `ops::attention::AttnShape`, `ops::window_attn::WindowShape`).
pub trait TuneCase {
    /// The registry class the choice is stored under.
    fn class(&self) -> ShapeClass;
    /// Names of the variants that can run this shape on an adapter with `caps`.
    fn candidates(&self, caps: &Caps) -> Vec<&'static str>;
    /// What runs with tuning off, as the report names it (default "static": the launcher's own rule).
    fn static_choice(&self, _caps: &Caps) -> &'static str {
        "static"
    }
    /// Floating-point work of one call (sizes the calls per timed submit; a class is timed at its
    /// largest call).
    fn flops(&self) -> f64;
    /// Allocate zero-filled operands on `gpu`; the returned function records one call of a variant.
    fn prepare(&self, gpu: &Arc<Device>) -> Result<CaseRunner>;
    /// The smaller shape timed in `auto` (fewer query rows or windows, whose cost per row or window is
    /// flat once the grid fills the device), or `None` to time the full shape. Not asked of a
    /// [`Resizable`] case, which the tuner sizes itself.
    fn auto_shape(&self) -> Option<Box<dyn TuneCase>> {
        None
    }
    /// `Some` for a case the tuner may shrink to sizes it picks from the measured speed (linear).
    fn resizable(&self) -> Option<&dyn Resizable> {
        None
    }
    /// The matrix shape of this call, for the report (`TuneRow::timed_shape`); `None` for other ops.
    fn timed_shape(&self) -> Option<LinearShape> {
        None
    }
}

/// The usual [`TuneCase::auto_shape`]: the smaller case when `shrink` holds, else `None` (time the
/// full shape).
pub fn shrunk<C: TuneCase + 'static>(
    shrink: bool,
    smaller: impl FnOnce() -> C,
) -> Option<Box<dyn TuneCase>> {
    shrink.then(|| Box::new(smaller()) as Box<dyn TuneCase>)
}

/// A case the tuner shrinks in `auto`: screened at a probe size, timed at a larger one, both sized
/// from the speed measured on earlier cases of the same regime.
pub trait Resizable {
    /// Cases of one regime share a measured speed and bans (linear: "gemv" for decode rows, "gemm").
    fn regime(&self) -> &'static str;
    /// This call shrunk so one call has about `flops` FLOPs; `keep_traffic` keeps enough weight bytes
    /// that memory traffic is measured as in the model.
    fn resized(&self, flops: f64, keep_traffic: bool) -> Box<dyn TuneCase>;
}

/// Records one call of the named variant (see [`TuneCase::prepare`]).
pub type CaseRunner = Box<dyn Fn(&mut Recorder, &'static str) -> Result<()>>;

/// Tune `shapes` on `gpu` without a time budget, each weighted by its own cost (see [`tune_budgeted`]).
pub async fn tune(
    gpu: &Arc<Device>,
    shapes: &[LinearShape],
    mode: Tuning,
    cache: &CacheLocation,
) -> Result<TuneReport> {
    tune_with(gpu, shapes, &[], mode, cache).await
}

/// [`tune`] with the calls of other ops (attention, window attention) in the same cache file and
/// report; no time budget.
pub async fn tune_with(
    gpu: &Arc<Device>,
    shapes: &[LinearShape],
    cases: &[&dyn TuneCase],
    mode: Tuning,
    cache: &CacheLocation,
) -> Result<TuneReport> {
    let work: Vec<(LinearShape, f64)> = shapes.iter().map(|s| (*s, s.cost())).collect();
    let cases: Vec<(&dyn TuneCase, f64)> = cases.iter().map(|c| (*c, c.flops())).collect();
    tune_budgeted(gpu, &work, &cases, &TuneOptions::unbounded(mode), cache).await
}

/// Tune the (linear shape, cost) `work` and the (case, cost) `cases` on `gpu` as `opts` says (see the
/// module docs and [`tune_cases`]).
pub async fn tune_budgeted(
    gpu: &Arc<Device>,
    work: &[(LinearShape, f64)],
    cases: &[(&dyn TuneCase, f64)],
    opts: &TuneOptions,
    cache: &CacheLocation,
) -> Result<TuneReport> {
    let all: Vec<(&dyn TuneCase, f64)> = work
        .iter()
        .map(|(s, c)| (s as &dyn TuneCase, *c))
        .chain(cases.iter().copied())
        .collect();
    tune_cases(gpu, &all, opts, cache).await
}
