//! Taking samples: GPU timestamps or wall time, calls batched per sample, candidates interleaved,
//! medians kept; screening and the sample counts.

use std::sync::Arc;

use super::clock::Clock;
use super::CaseRunner;
#[cfg(target_arch = "wasm32")]
use crate::error::Error;
use crate::error::Result;
use crate::gpu::{Device, Recorder};

/// `auto`: a probe call of the fastest candidate lasts about this long (ms)...
pub const PROBE_CALL_MS: f64 = 2.0;
/// ... and a timed call about this long (ms), from the measured speed of the device.
pub const TIMED_CALL_MS: f64 = 8.0;
/// Before any measurement, the probe has this many FLOPs.
pub(super) const INITIAL_PROBE_FLOPS: f64 = 4.0e6;

/// Screening: a candidate slower than this times the fastest at the probe size cannot win.
pub const SCREEN_FACTOR: f64 = 2.0;
/// Samples per candidate at the probe size (the fastest counts).
pub(super) const SCREEN_SAMPLES: usize = 2;
/// A candidate slower than this times the fastest is not timed again for cases of the same regime.
pub const BAN_FACTOR: f64 = 8.0;

/// A sample batches calls until it lasts at least this long (ms): GPU timestamps, wall time.
const MIN_SAMPLE_MS_GPU: f64 = 2.0;
const MIN_SAMPLE_MS_WALL: f64 = 8.0;
pub(super) const MAX_CALLS_PER_SAMPLE: usize = 64;
/// Samples per timed candidate: enough for this many ms in all, within [min, max].
pub(super) const AUTO_CANDIDATE_MS: f64 = 30.0;
pub(super) const AUTO_REPS: (usize, usize) = (3, 9);
pub(super) const EXHAUSTIVE_CANDIDATE_MS: f64 = 100.0;
pub(super) const EXHAUSTIVE_REPS: (usize, usize) = (7, 15);

/// Calls per sample so a sample of a call lasting `call_ms` lasts at least `min_sample_ms`.
pub(super) fn calls_for(call_ms: Option<f64>, min_sample_ms: f64) -> usize {
    match call_ms {
        Some(t) if t > 0.0 => ((min_sample_ms / t).ceil() as usize).clamp(1, MAX_CALLS_PER_SAMPLE),
        _ => 1,
    }
}

/// Samples per candidate so they add up to `total_ms`, within `[lo, hi]`.
pub(super) fn reps_for(sample_ms: f64, total_ms: f64, (lo, hi): (usize, usize)) -> usize {
    if sample_ms <= 0.0 || !sample_ms.is_finite() {
        return hi;
    }
    ((total_ms / sample_ms).ceil() as usize).clamp(lo, hi)
}

/// Candidates that can still win after screening (`<= SCREEN_FACTOR` x the fastest) and those to ban
/// (`> BAN_FACTOR` x). `times` are ms per call; `None` = failed (neither kept nor banned).
pub(super) fn screen<T: Copy>(times: &[(T, Option<f64>)]) -> (Vec<T>, Vec<(T, f64)>, Vec<T>) {
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

/// A case's prepared operands: records calls of a named candidate.
pub(super) struct Bench(pub(super) CaseRunner);

impl Bench {
    pub(super) fn record(
        &self,
        rec: &mut Recorder,
        variant: &'static str,
        calls: usize,
    ) -> Result<()> {
        for _ in 0..calls {
            (self.0)(rec, variant)?;
        }
        Ok(())
    }
}

/// Takes samples: GPU timestamps or wall time; counts them.
pub(super) struct SampleTimer {
    pub(super) gpu: Arc<Device>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) gpu_time: bool,
    pub(super) samples: usize,
    /// Total ms and count of warm-ups.
    warms: (f64, usize),
}

impl SampleTimer {
    pub(super) fn min_sample_ms(&self) -> f64 {
        if self.gpu_time {
            MIN_SAMPLE_MS_GPU
        } else {
            MIN_SAMPLE_MS_WALL
        }
    }

    /// One untimed call (its first compiles the kernel); false when the candidate fails (it is then
    /// left out).
    pub(super) async fn warm(&mut self, bench: &Bench, v: &'static str) -> bool {
        let t0 = self.clock.now_ms();
        let mut rec = Recorder::new(&self.gpu);
        let ok = bench.record(&mut rec, v, 1).is_ok() && rec.submit().is_ok();
        let ok = ok && finish(&self.gpu).await.is_ok();
        self.warms.0 += self.clock.now_ms() - t0;
        self.warms.1 += 1;
        ok
    }

    /// Average warm-up (mostly compile) time so far.
    pub(super) fn avg_warm_ms(&self) -> f64 {
        if self.warms.1 == 0 {
            0.0
        } else {
            self.warms.0 / self.warms.1 as f64
        }
    }

    /// Ms per call over one sample of `calls` calls; `None` when it failed.
    pub(super) async fn sample(
        &mut self,
        bench: &Bench,
        v: &'static str,
        calls: usize,
    ) -> Option<f64> {
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
    pub(super) async fn interleaved(
        &mut self,
        bench: &Bench,
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
async fn finish(gpu: &Device) -> Result<()> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        gpu.wait_idle()
    }
    #[cfg(target_arch = "wasm32")]
    {
        let (tx, rx) = futures_channel::oneshot::channel();
        gpu.wgpu()?.queue.on_submitted_work_done(move || {
            let _ = tx.send(());
        });
        rx.await
            .map_err(|_| Error::Gpu("work-done callback dropped".into()))?;
        gpu.check()
    }
}

impl SampleTimer {
    /// A timer on `gpu`: GPU timestamps when `gpu_time`, else wall time on `clock`.
    pub(super) fn new(gpu: &Arc<Device>, clock: Arc<dyn Clock>, gpu_time: bool) -> Self {
        SampleTimer {
            gpu: gpu.clone(),
            clock,
            gpu_time,
            samples: 0,
            warms: (0.0, 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
