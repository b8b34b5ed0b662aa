//! The run over classes: distinct classes in priority order, cache hits installed, the budget checked
//! before each class, bans applied and learnt, the winners installed and cached.

use std::collections::HashSet;
use std::sync::Arc;

use super::clock::Clock;
use super::measure::{time_case, time_resizable, Outcome, Speeds};
use super::report::{RowStatus, TuneReport, TuneRow};
use super::store::{BanEntry, Cache, CacheEntry};
use super::timing::{SampleTimer, BAN_FACTOR};
use super::{CacheLocation, Timer, TuneCase, TuneOptions, Tuning};
use crate::error::Result;
use crate::gpu::registry::{format_from_name, ShapeClass};
use crate::gpu::{DType, Device};

/// Tune the (case, cost) `cases` on `gpu` as `opts` says (see the module docs) and install the
/// choices. Cases of one class are timed once, at the largest call, their costs summed. With
/// [`Tuning::Off`] the choice table is cleared (static choices) and nothing is timed or cached.
pub async fn tune_cases(
    gpu: &Arc<Device>,
    cases: &[(&dyn TuneCase, f64)],
    opts: &TuneOptions,
    cache: &CacheLocation,
) -> Result<TuneReport> {
    let clock = opts.clock.clone();
    let t0 = clock.now_ms();
    let mut report = TuneReport {
        budget_ms: if opts.mode == Tuning::Auto {
            opts.budget_ms
        } else {
            None
        },
        ..TuneReport::default()
    };
    if opts.mode == Tuning::Off {
        gpu.choices.clear();
        return Ok(report);
    }
    // Priority order matters only under a budget; otherwise the caller's order is kept.
    let jobs = distinct_classes(cases, opts.mode == Tuning::Auto && opts.budget_ms.is_some());
    let total_cost: f64 = jobs.iter().map(|c| c.1).sum::<f64>().max(f64::MIN_POSITIVE);
    let store = Cache::read(cache, &gpu.caps.adapter_key, &mut report.warnings).await;
    report.cache_path = store.describe();
    for w in &report.warnings {
        log::warn!("{w}");
    }
    let gpu_time = opts.timer == Timer::Auto && gpu.caps.timestamp_query;
    let mut run = Run {
        gpu,
        mode: opts.mode,
        clock: clock.clone(),
        timer: SampleTimer::new(gpu, clock.clone(), gpu_time),
        budget: Budget {
            start: t0,
            limit: report.budget_ms,
            spent_on_classes: 0.0,
            classes: 0,
        },
        speed: Speeds::default(),
        banned: HashSet::new(),
        store,
        dirty: false,
        report,
    };
    if opts.mode == Tuning::Auto {
        run.banned = saved_bans(&run.store.banned);
    }
    let bans_before = run.banned.len();
    for (case, cost) in &jobs {
        run.class(*case, cost / total_cost).await?;
    }
    let mut report = run.finish(bans_before).await;
    report.elapsed_ms = clock.now_ms() - t0;
    Ok(report)
}

/// One case per class (the largest call), with the summed costs; most expensive first when `sort`.
fn distinct_classes<'a>(
    cases: &[(&'a dyn TuneCase, f64)],
    sort: bool,
) -> Vec<(&'a dyn TuneCase, f64)> {
    let mut jobs: Vec<(&dyn TuneCase, f64)> = Vec::new();
    for &(case, c) in cases {
        match jobs.iter_mut().find(|(o, _)| o.class() == case.class()) {
            Some((o, oc)) => {
                if case.flops() > o.flops() {
                    *o = case;
                }
                *oc += c.max(0.0);
            }
            None => jobs.push((case, c.max(0.0))),
        }
    }
    if sort {
        jobs.sort_by(|a, b| b.1.total_cmp(&a.1));
    }
    jobs
}

/// A candidate banned for cases of a regime in a weight format: (regime, format, variant).
type Ban = (String, DType, String);

/// The cache's bans whose format is known.
fn saved_bans(saved: &[BanEntry]) -> HashSet<Ban> {
    saved
        .iter()
        .filter_map(|b| {
            Some((
                b.regime.clone(),
                format_from_name(&b.format)?,
                b.variant.clone(),
            ))
        })
        .collect()
}

/// The budget: a class starts only while the time spent plus the average class cost so far fits. A
/// positive budget always admits a load's first class, whatever the clock says: time spent before it
/// (reading the cache, a busy machine) cannot stop a load from progressing. A budget of 0 admits none.
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
        if self.classes == 0 && limit > 0.0 {
            return true;
        }
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

    /// When a compile may no longer start.
    fn deadline(&self) -> Option<f64> {
        self.limit.map(|l| self.start + l)
    }
}

/// Where a class starts: the cache's best so far, and the candidates it left untried.
type Resume = Option<(&'static str, Vec<&'static str>)>;

/// One tuning run's state.
struct Run<'a> {
    gpu: &'a Arc<Device>,
    mode: Tuning,
    clock: Arc<dyn Clock>,
    timer: SampleTimer,
    budget: Budget,
    speed: Speeds,
    banned: HashSet<Ban>,
    store: Cache<'a>,
    dirty: bool,
    report: TuneReport,
}

impl Run<'_> {
    /// Look up, time or skip one class with `share` of the total cost.
    async fn class(&mut self, case: &dyn TuneCase, share: f64) -> Result<()> {
        let candidates = case.candidates(&self.gpu.caps);
        if candidates.is_empty() {
            return Ok(());
        }
        let mut resume: Resume = None;
        if self.mode == Tuning::Auto {
            match self.cached(case, &candidates) {
                Cached::Done(v) => {
                    self.gpu.choices.set(case.class(), v);
                    self.push_row(case, v, RowStatus::Cached, share);
                    return Ok(());
                }
                Cached::Partial(v, untried) => {
                    // A class a budget cut short: its best so far runs meanwhile; the rest is resumed.
                    self.gpu.choices.set(case.class(), v);
                    resume = Some((v, untried));
                }
                Cached::No => {}
            }
            if !self.budget.allows_another(self.clock.now_ms()) {
                self.report.skipped += 1;
                let chosen = resume
                    .as_ref()
                    .map_or(case.static_choice(&self.gpu.caps), |r| r.0);
                self.push_row(case, chosen, RowStatus::Skipped, share);
                return Ok(());
            }
        }
        let class_start = self.clock.now_ms();
        let outcome = self.measure(case, &candidates, resume).await?;
        let spent_ms = self.clock.now_ms() - class_start;
        self.budget.record(spent_ms);
        self.report.timings += timed_count(&outcome);
        self.install(case, outcome, share, spent_ms);
        Ok(())
    }

    /// What the cache holds for `case` among `candidates`.
    fn cached(&self, case: &dyn TuneCase, candidates: &[&'static str]) -> Cached {
        let class = case.class();
        let by_name = |n: &str| candidates.iter().copied().find(|c| *c == n);
        let hit = self.store.entries.iter().find(|e| e.is_for(&class));
        let Some(best) = hit.and_then(|e| by_name(&e.variant)) else {
            return Cached::No;
        };
        let untried: Vec<&'static str> = hit
            .map(|e| e.untried.iter().filter_map(|n| by_name(n)).collect())
            .unwrap_or_default();
        if untried.is_empty() {
            Cached::Done(best)
        } else {
            Cached::Partial(best, untried)
        }
    }

    /// Time `candidates` (or a resumed class's best and untried ones) of `case`.
    async fn measure(
        &mut self,
        case: &dyn TuneCase,
        candidates: &[&'static str],
        resume: Resume,
    ) -> Result<Outcome> {
        // Static choice (or the best so far of a resumed class) first: it warms the operands' memory
        // for the others.
        let first = resume
            .as_ref()
            .map_or(case.static_choice(&self.gpu.caps), |r| r.0);
        let mut order: Vec<&'static str> = match resume {
            Some((best, untried)) => std::iter::once(best).chain(untried).collect(),
            None => candidates.to_vec(),
        };
        order.sort_by_key(|v| *v != first);
        if self.mode == Tuning::Exhaustive {
            return time_case(&mut self.timer, case, &order, None, true).await;
        }
        let deadline = self.budget.deadline();
        let Some(resizable) = case.resizable() else {
            return time_case(&mut self.timer, case, &order, deadline, false).await;
        };
        let (regime, format) = (resizable.regime(), case.class().format);
        let ban = |v: &str| (regime.to_string(), format, v.to_string());
        let mut banned: Vec<(&'static str, f64)> = Vec::new();
        order.retain(|v| {
            let out = self.banned.contains(&ban(v));
            if out {
                banned.push((v, f64::INFINITY));
            }
            !out
        });
        let mut o = time_resizable(
            &mut self.timer,
            resizable,
            &order,
            &mut self.speed,
            deadline,
        )
        .await?;
        for (v, f) in &o.dropped {
            if *f > BAN_FACTOR {
                self.banned.insert(ban(v));
            }
        }
        o.dropped.extend(banned);
        Ok(o)
    }

    /// Install and cache the fastest of `outcome` (nothing ran: the static choice stays).
    fn install(&mut self, case: &dyn TuneCase, outcome: Outcome, share: f64, spent_ms: f64) {
        let best = outcome
            .times
            .iter()
            .filter_map(|(v, t)| t.map(|t| (*v, t)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let Some((best, _)) = best else {
            return;
        };
        let class = case.class();
        self.gpu.choices.set(class, best);
        self.store.put(&class, cache_entry(&class, best, &outcome));
        self.dirty = true;
        self.report.rows.push(TuneRow {
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

    /// A row of a class not timed in this run (cached or skipped).
    fn push_row(
        &mut self,
        case: &dyn TuneCase,
        chosen: &'static str,
        status: RowStatus,
        share: f64,
    ) {
        self.report.rows.push(TuneRow {
            class: case.class(),
            timed_shape: case.timed_shape(),
            times_ms: Vec::new(),
            dropped: Vec::new(),
            chosen,
            cached: status == RowStatus::Cached,
            status,
            share,
            spent_ms: 0.0,
            untried: Vec::new(),
        });
    }

    /// Note the timer and write the cache when anything changed (an exhaustive run always writes,
    /// and clears the bans: a ban from a noisy screening is undone by `--tuning exhaustive`).
    async fn finish(mut self, bans_before: usize) -> TuneReport {
        self.report.samples = self.timer.samples;
        if self.report.samples > 0 {
            self.report.timer = if self.timer.gpu_time {
                "gpu timestamps"
            } else {
                "wall clock"
            };
        }
        let exhaustive = self.mode == Tuning::Exhaustive;
        if !(self.dirty || self.banned.len() != bans_before || exhaustive) {
            return self.report;
        }
        let bans: Vec<BanEntry> = match exhaustive {
            true => Vec::new(),
            false => self
                .banned
                .iter()
                .map(|(regime, f, v)| BanEntry {
                    regime: regime.clone(),
                    format: format!("{f:?}"),
                    variant: v.clone(),
                })
                .collect(),
        };
        self.report.cache_error = self.store.write(bans, &mut self.report.warnings).await;
        self.report
    }
}

/// What the cache holds for a class.
enum Cached {
    No,
    /// Done: this variant.
    Done(&'static str),
    /// Cut short by a budget: the best so far and the candidates left.
    Partial(&'static str, Vec<&'static str>),
}

/// Candidates timed for `o`: those with a time, and those screened out on a real time.
fn timed_count(o: &Outcome) -> usize {
    o.times.iter().filter(|(_, t)| t.is_some()).count()
        + o.dropped
            .iter()
            .filter(|(n, f)| f.is_finite() && !o.times.iter().any(|(t, _)| t == n))
            .count()
}

fn cache_entry(class: &ShapeClass, best: &'static str, o: &Outcome) -> CacheEntry {
    CacheEntry {
        op: class.op.name().to_string(),
        format: format!("{:?}", class.format),
        dims: class.dims,
        variant: best.to_string(),
        untried: o.untried.iter().map(|v| v.to_string()).collect(),
        times_ms: o
            .times
            .iter()
            .filter_map(|(v, t)| t.map(|t| (v.to_string(), t)))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_admits_while_the_average_class_fits() {
        let mut b = Budget {
            start: 100.0,
            limit: Some(50.0),
            spent_on_classes: 0.0,
            classes: 0,
        };
        assert!(b.allows_another(100.0));
        assert!(
            b.allows_another(1e6),
            "the first class starts even past the limit"
        );
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
}
