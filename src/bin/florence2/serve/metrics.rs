//! Server metrics in the Prometheus text format (version 0.0.4): requests by outcome, queue depth and
//! capacity, readiness, generated tokens, and phase latencies as histograms.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Invalid,
    Unauthorized,
    TooLarge,
    QueueFull,
    Loading,
    Cancelled,
    Error,
}

impl Outcome {
    const ALL: [Outcome; 8] = [
        Outcome::Ok,
        Outcome::Invalid,
        Outcome::Unauthorized,
        Outcome::TooLarge,
        Outcome::QueueFull,
        Outcome::Loading,
        Outcome::Cancelled,
        Outcome::Error,
    ];

    fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Invalid => "invalid",
            Outcome::Unauthorized => "unauthorized",
            Outcome::TooLarge => "too_large",
            Outcome::QueueFull => "queue_full",
            Outcome::Loading => "unavailable",
            Outcome::Cancelled => "cancelled",
            Outcome::Error => "error",
        }
    }
}

/// Phases timed per request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Admission to the worker picking the request up.
    Queue,
    /// Remote image fetch (`--allow-remote-images`, on a blocking thread of the HTTP runtime).
    Fetch,
    /// Image decoding (in the HTTP handler).
    Decode,
    /// Preprocess + vision tower + encoder (the worker's encode call).
    Encode,
    /// Generation.
    Generate,
    /// Admission to answer.
    Total,
}

impl Phase {
    const ALL: [Phase; 6] = [
        Phase::Queue,
        Phase::Fetch,
        Phase::Decode,
        Phase::Encode,
        Phase::Generate,
        Phase::Total,
    ];

    fn label(self) -> &'static str {
        match self {
            Phase::Queue => "queue",
            Phase::Fetch => "image_fetch",
            Phase::Decode => "image_decode",
            Phase::Encode => "encode",
            Phase::Generate => "generate",
            Phase::Total => "total",
        }
    }
}

/// Histogram bucket upper bounds, seconds.
const BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

#[derive(Default, Clone)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// All counters; shared by the handlers and the worker.
pub struct Metrics {
    outcomes: [AtomicU64; 8],
    generated_tokens: AtomicU64,
    decode_steps: AtomicU64,
    disconnects: AtomicU64,
    queue_depth: AtomicU64,
    running: AtomicU64,
    batch_rows: AtomicU64,
    /// 1 while the worker waits for work, its freed memory handed back.
    idle: AtomicU64,
    phases: Mutex<[Histogram; 6]>,
    /// Requests per decode step.
    batch: Mutex<BatchHistogram>,
}

/// Upper bounds of the batch-size histogram's buckets (requests per decode step).
const BATCH_BUCKETS: [u64; 8] = [1, 2, 4, 8, 16, 32, 64, 128];

#[derive(Default, Clone)]
struct BatchHistogram {
    counts: [u64; BATCH_BUCKETS.len()],
    count: u64,
    sum: u64,
}

impl Metrics {
    pub fn new() -> Self {
        Metrics {
            outcomes: Default::default(),
            generated_tokens: AtomicU64::new(0),
            decode_steps: AtomicU64::new(0),
            disconnects: AtomicU64::new(0),
            queue_depth: AtomicU64::new(0),
            running: AtomicU64::new(0),
            batch_rows: AtomicU64::new(0),
            idle: AtomicU64::new(0),
            phases: Mutex::new(Default::default()),
            batch: Mutex::new(Default::default()),
        }
    }

    pub fn count(&self, outcome: Outcome) {
        let i = Outcome::ALL.iter().position(|&o| o == outcome).unwrap_or(0);
        self.outcomes[i].fetch_add(1, Ordering::Relaxed);
    }

    pub fn add_tokens(&self, n: u64) {
        self.generated_tokens.fetch_add(n, Ordering::Relaxed);
    }

    /// One decode step polled (before it runs).
    pub fn decode_step(&self) {
        self.decode_steps.fetch_add(1, Ordering::Relaxed);
    }

    /// A client went away before its answer was complete.
    pub fn disconnect(&self) {
        self.disconnects.fetch_add(1, Ordering::Relaxed);
    }

    pub fn queued(&self, delta: i64) {
        if delta >= 0 {
            self.queue_depth.fetch_add(delta as u64, Ordering::Relaxed);
        } else {
            self.queue_depth
                .fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
        }
    }

    /// Requests in the running batch.
    pub fn set_running(&self, running: usize) {
        self.running.store(running as u64, Ordering::Relaxed);
    }

    /// The worker waits for work (`true`, set after it hands freed memory back) or has taken some.
    /// Sequentially consistent: a scrape that sees every request answered and then `1` sees the wait
    /// after the last of them.
    pub fn set_idle(&self, idle: bool) {
        self.idle.store(u64::from(idle), Ordering::SeqCst);
    }

    /// One decode step ran for `requests` requests with `rows` decoder rows (beams) in all.
    pub fn observe_batch(&self, requests: usize, rows: usize) {
        self.batch_rows.store(rows as u64, Ordering::Relaxed);
        if let Ok(mut h) = self.batch.lock() {
            for (b, c) in BATCH_BUCKETS.iter().zip(h.counts.iter_mut()) {
                if requests as u64 <= *b {
                    *c += 1;
                }
            }
            h.count += 1;
            h.sum += requests as u64;
        }
    }

    pub fn observe(&self, phase: Phase, seconds: f64) {
        let i = Phase::ALL.iter().position(|&p| p == phase).unwrap_or(0);
        if let Ok(mut phases) = self.phases.lock() {
            let h = &mut phases[i];
            for (b, c) in BUCKETS.iter().zip(h.counts.iter_mut()) {
                if seconds <= *b {
                    *c += 1;
                }
            }
            h.count += 1;
            h.sum += seconds;
        }
    }

    /// The Prometheus text exposition.
    /// `in_flight`: admitted requests not yet answered (running, queued or decoding their image).
    pub fn render(&self, ready: bool, capacity: usize, in_flight: usize) -> String {
        let mut s = String::new();
        self.render_outcomes(&mut s);
        self.render_scalars(&mut s, ready, capacity, in_flight);
        self.render_phases(&mut s);
        self.render_batch(&mut s);
        s
    }

    fn render_batch(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "# HELP florence2_batch_size Requests per decode step (continuous batching).\n\
             # TYPE florence2_batch_size histogram"
        );
        let h = self
            .batch
            .lock()
            .map(|h| h.clone())
            .unwrap_or_else(|h| h.into_inner().clone());
        for (b, c) in BATCH_BUCKETS.iter().zip(h.counts.iter()) {
            let _ = writeln!(s, "florence2_batch_size_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(
            s,
            "florence2_batch_size_bucket{{le=\"+Inf\"}} {}\n\
             florence2_batch_size_sum {}\n\
             florence2_batch_size_count {}",
            h.count, h.sum, h.count
        );
    }

    fn render_outcomes(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "# HELP florence2_requests_total Chat-completion requests by outcome.\n\
             # TYPE florence2_requests_total counter"
        );
        for (o, c) in Outcome::ALL.iter().zip(&self.outcomes) {
            let _ = writeln!(
                s,
                "florence2_requests_total{{outcome=\"{}\"}} {}",
                o.label(),
                c.load(Ordering::Relaxed)
            );
        }
    }

    /// The gauges and counters that are one number each, in exposition order.
    fn render_scalars(&self, s: &mut String, ready: bool, capacity: usize, in_flight: usize) {
        for (name, help, v) in self.scalars(ready, capacity, in_flight) {
            // A counter's name ends in `_total` (the Prometheus naming rule); every other is a gauge.
            let kind = if name.ends_with("_total") {
                "counter"
            } else {
                "gauge"
            };
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
        }
    }

    /// Each one-number family: (name, help, value).
    fn scalars(
        &self,
        ready: bool,
        capacity: usize,
        in_flight: usize,
    ) -> [(&'static str, &'static str, u64); 10] {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            (
                "florence2_queue_depth",
                "Requests admitted and waiting for the GPU worker.",
                load(&self.queue_depth),
            ),
            (
                "florence2_queue_capacity",
                "Requests that may be admitted at once (running + waiting).",
                capacity as u64,
            ),
            (
                "florence2_in_flight",
                "Admitted requests not yet answered (decoding their image, queued or running).",
                in_flight as u64,
            ),
            (
                "florence2_running",
                "Requests in the GPU worker's running batch (at most --max-batch).",
                load(&self.running),
            ),
            (
                "florence2_batch_rows",
                "Decoder rows (beams of every request) of the last decode step.",
                load(&self.batch_rows),
            ),
            (
                "florence2_worker_idle",
                "1 while the GPU worker waits for work, the memory its requests freed handed back.",
                self.idle.load(Ordering::SeqCst),
            ),
            (
                "florence2_ready",
                "1 once the model is loaded.",
                u64::from(ready),
            ),
            (
                "florence2_generated_tokens_total",
                "Tokens generated (decoder start token excluded).",
                load(&self.generated_tokens),
            ),
            (
                "florence2_decode_steps_total",
                "Decode steps started (each polls for cancellation first).",
                load(&self.decode_steps),
            ),
            (
                "florence2_client_disconnects_total",
                "Clients that went away before their answer was complete.",
                load(&self.disconnects),
            ),
        ]
    }

    fn render_phases(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "# HELP florence2_phase_seconds Request phase latencies.\n\
             # TYPE florence2_phase_seconds histogram"
        );
        let phases = self
            .phases
            .lock()
            .map(|p| p.clone())
            .unwrap_or_else(|p| p.into_inner().clone());
        for (p, h) in Phase::ALL.iter().zip(phases.iter()) {
            let l = p.label();
            for (b, c) in BUCKETS.iter().zip(h.counts.iter()) {
                let _ = writeln!(
                    s,
                    "florence2_phase_seconds_bucket{{phase=\"{l}\",le=\"{b}\"}} {c}"
                );
            }
            let _ = writeln!(
                s,
                "florence2_phase_seconds_bucket{{phase=\"{l}\",le=\"+Inf\"}} {}\n\
                 florence2_phase_seconds_sum{{phase=\"{l}\"}} {}\n\
                 florence2_phase_seconds_count{{phase=\"{l}\"}} {}",
                h.count, h.sum, h.count
            );
        }
    }
}
