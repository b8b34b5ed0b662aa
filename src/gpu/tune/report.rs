//! What a tuning run did, and the table `florence2 tune` prints.

use crate::gpu::registry::{LinearShape, ShapeClass};

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
    /// `None` for the other ops ([`super::TuneCase`]), whose timed size is their own.
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

/// What a tuning run did.
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
    /// Non-fatal problems (corrupt or unwritable cache, a failed run).
    pub warnings: Vec<String>,
    /// Why the run failed, when it did (`Pipeline::tune` then falls back to the static choices and
    /// says so in [`TuneReport::warnings`]).
    pub failed: Option<String>,
    /// Why the cache could not be written, when it could not (also a warning: a load goes on with
    /// the choices it made; `florence2 tune`, whose product the cache is, fails).
    pub cache_error: Option<String>,
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
            s.push_str(&r.line());
        }
        s.push_str(&self.summary());
        s
    }

    /// The table's last line: how many classes were timed, cached and left, and the time spent.
    fn summary(&self) -> String {
        let count = |st: RowStatus| self.rows.iter().filter(|r| r.status == st).count();
        let (timed, cached) = (count(RowStatus::Timed), count(RowStatus::Cached));
        format!(
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
        )
    }
}

impl TuneRow {
    /// This row's line of [`TuneReport::table`].
    fn line(&self) -> String {
        let times = match self.status {
            RowStatus::Skipped => "(not timed: budget spent; static choice)".to_string(),
            _ => match self.candidate_times() {
                t if t.is_empty() && self.status == RowStatus::Cached => "(cached)".to_string(),
                t => t.join(", "),
            },
        };
        let at = if self.status == RowStatus::Timed {
            match self.timed_shape {
                Some(t) => format!("  @M={} N={} ({:.0} ms)", t.m, t.n, self.spent_ms),
                None => format!("  ({:.0} ms)", self.spent_ms),
            }
        } else {
            String::new()
        };
        format!(
            "{:<44} {:>5.1}% {:>13}  {}{}{}\n",
            self.class.describe(),
            100.0 * self.share,
            self.chosen,
            times,
            at,
            if self.cached { "  [cache]" } else { "" }
        )
    }

    /// Each candidate's entry: its time (or "failed"), its screening factor, the untried ones.
    fn candidate_times(&self) -> Vec<String> {
        let mut times: Vec<String> = self
            .times_ms
            .iter()
            .map(|(n, t)| {
                let mark = if *n == self.chosen { "*" } else { "" };
                match t {
                    Some(t) => format!("{mark}{n} {t:.3}"),
                    None => format!("{n} failed"),
                }
            })
            .collect();
        times.extend(
            self.dropped
                .iter()
                .filter(|(n, _)| !self.times_ms.iter().any(|(t, _)| t == n))
                .map(|(n, f)| {
                    if f.is_finite() {
                        format!("{n} x{f:.1}")
                    } else {
                        format!("{n} (lost earlier)")
                    }
                }),
        );
        if !self.untried.is_empty() {
            times.push(format!("{} untried (next load)", self.untried.join("/")));
        }
        times
    }
}
