//! Measuring one class: warm-ups within the deadline, screening, then the survivors' samples, at the
//! case's own size or, for a [`Resizable`] case, at sizes picked from the device's measured speed.

use std::collections::HashMap;

use super::timing::*;
use super::{Resizable, TuneCase};
use crate::error::Result;
use crate::gpu::registry::LinearShape;

/// What timing one class gave: median ms per call (at `shape` for a linear) per timed candidate, the
/// screened-out ones, and those left untried.
pub(super) struct Outcome {
    pub(super) shape: Option<LinearShape>,
    pub(super) times: Vec<(&'static str, Option<f64>)>,
    pub(super) dropped: Vec<(&'static str, f64)>,
    /// Not compiled: the deadline passed first.
    pub(super) untried: Vec<&'static str>,
}

/// Warm-up (compiles each kernel; in the browser compiled asynchronously, so timing would include
/// it) of `order` in turn; past `deadline` the rest stays untried (at least two are always tried, so
/// every load progresses). Returns (ran, untried, failed).
pub(super) async fn warm_all(
    timer: &mut SampleTimer,
    bench: &Bench,
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
pub(super) async fn screen_samples(
    timer: &mut SampleTimer,
    bench: &Bench,
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

/// Measured FLOPs per ms of the fastest candidate, per regime ([`Resizable::regime`]).
pub(super) type Speeds = HashMap<&'static str, f64>;

/// `auto`, a resizable case: screening at a probe size, then the survivors at the timed size.
pub(super) async fn time_resizable(
    timer: &mut SampleTimer,
    case: &dyn Resizable,
    order: &[&'static str],
    speed: &mut Speeds,
    deadline: Option<f64>,
) -> Result<Outcome> {
    let reg = case.regime();
    let probe_flops = speed
        .get(reg)
        .map_or(INITIAL_PROBE_FLOPS, |s| s * PROBE_CALL_MS);
    let probe = case.resized(probe_flops, false);
    let probe_bench = Bench(probe.prepare(&timer.gpu)?);
    let screened = screen_probe(
        timer,
        &probe_bench,
        probe.as_ref(),
        order,
        speed,
        reg,
        deadline,
    )
    .await;
    let resized = speed
        .get(reg)
        .map(|s| case.resized(s * TIMED_CALL_MS, true))
        .filter(|t| !same_size(t.as_ref(), probe.as_ref()));
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); screened.keep.len()];
    let (timed, bench) = match &resized {
        Some(t) => {
            drop(probe_bench);
            let bench = Bench(t.prepare(&timer.gpu)?);
            // Operands are new memory: one untimed call touches it.
            if let Some(&v) = screened.keep.first() {
                timer.warm(&bench, v).await;
            }
            (t.as_ref(), bench)
        }
        None => {
            // The screening sample is the first sample at this size.
            for (i, v) in screened.keep.iter().enumerate() {
                if let Some((_, Some(t))) = screened.times.iter().find(|(w, _)| w == v) {
                    samples[i].push(*t);
                }
            }
            (probe.as_ref(), probe_bench)
        }
    };
    let est_call = speed.get(reg).map(|s| timed.flops() / s);
    let calls = calls_for(est_call, timer.min_sample_ms());
    let sample_ms = est_call.map_or(f64::NAN, |t| t * calls as f64);
    let reps = reps_for(sample_ms, AUTO_CANDIDATE_MS, AUTO_REPS);
    let mut times = timer
        .interleaved(&bench, &screened.keep, calls, reps, samples)
        .await;
    if let Some(best) = times.iter().filter_map(|(_, t)| *t).reduce(f64::min) {
        if best > 0.0 {
            speed.insert(reg, timed.flops() / best);
        }
    }
    times.extend(screened.failed.into_iter().map(|v| (v, None)));
    Ok(Outcome {
        shape: timed.timed_shape(),
        times,
        dropped: screened.dropped,
        untried: screened.untried,
    })
}

/// Whether two sizes of one case are the same call.
fn same_size(a: &dyn TuneCase, b: &dyn TuneCase) -> bool {
    a.flops() == b.flops() && a.timed_shape() == b.timed_shape()
}

/// What screening at the probe size left.
struct Screened {
    /// Screening samples (the fastest per candidate).
    times: Vec<(&'static str, Option<f64>)>,
    keep: Vec<&'static str>,
    dropped: Vec<(&'static str, f64)>,
    untried: Vec<&'static str>,
    failed: Vec<&'static str>,
}

/// Warm-ups and screening samples of `order` at the probe size; records the speed of the fastest.
async fn screen_probe(
    timer: &mut SampleTimer,
    bench: &Bench,
    probe: &dyn TuneCase,
    order: &[&'static str],
    speed: &mut Speeds,
    reg: &'static str,
    deadline: Option<f64>,
) -> Screened {
    let (alive, untried, failed) = warm_all(timer, bench, order, deadline).await;
    // Size the screening samples from the speed measured so far, else from one call of the first
    // candidate (the static choice), so even the first class is screened on batched samples.
    let mut est_call = speed.get(reg).map(|s| probe.flops() / s);
    if est_call.is_none() {
        if let Some(&v) = alive.first() {
            est_call = timer.sample(bench, v, 1).await;
        }
    }
    let calls = calls_for(est_call, timer.min_sample_ms());
    let times = screen_samples(timer, bench, &alive, calls).await;
    let (keep, dropped, _) = screen(&times);
    let best_probe = times
        .iter()
        .filter_map(|(_, t)| *t)
        .fold(f64::INFINITY, f64::min);
    if best_probe.is_finite() && best_probe > 0.0 {
        speed.insert(reg, probe.flops() / best_probe);
    }
    Screened {
        times,
        keep,
        dropped,
        untried,
        failed,
    }
}

/// A case at its full size (at its [`TuneCase::auto_shape`] in `auto`): `auto` screens (within
/// `deadline`), `exhaustive` times every candidate with more samples.
pub(super) async fn time_case(
    timer: &mut SampleTimer,
    case: &dyn TuneCase,
    order: &[&'static str],
    deadline: Option<f64>,
    exhaustive: bool,
) -> Result<Outcome> {
    let small = if exhaustive { None } else { case.auto_shape() };
    let timed: &dyn TuneCase = small.as_deref().unwrap_or(case);
    let bench = Bench(timed.prepare(&timer.gpu)?);
    let mut o = time_full(timer, &bench, order, deadline, exhaustive).await;
    o.shape = timed.timed_shape();
    Ok(o)
}

/// Every candidate of `order` on one fixed-size `bench`.
pub(super) async fn time_full(
    timer: &mut SampleTimer,
    bench: &Bench,
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
