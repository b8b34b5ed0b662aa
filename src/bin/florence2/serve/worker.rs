//! The one GPU worker: a plain thread that loads the model and then runs queued requests one at a time.
//!
//! Requests reach it through an unbounded channel whose length is bounded by the admission semaphore
//! (`--max-queue` waiting + 1 running; see `routes.rs`). Each job carries the sender of its reply channel;
//! the handler (or the SSE body) holds the receiver, so a client that disconnects drops the receiver and
//! `is_closed()` becomes true. The worker checks it before the encoder pass (a cancelled queued request
//! costs nothing) and the model's cancellation hook polls it before every decode step (a running request
//! stops within one step). Shutdown sets `abort`, which cancels the same way.
//!
//! Isolation: everything a request allocates on the GPU (pixels, encoder output, KV caches) is owned by the
//! engine call and dropped when it returns; the next request starts from the loaded weights alone.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use image::RgbImage;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::OwnedSemaphorePermit;

use florence2_wasm::estimate::DTypeRequest;
use florence2_wasm::gpu::tune::Tuning;
use florence2_wasm::pipeline::Device;
use florence2_wasm::processor::custom_tasks::AnyTaskPrompt;

use super::engine::{Answer, Engine, ModelInfo};
use super::error::ApiError;
use super::metrics::{Metrics, Outcome, Phase};

/// What the worker tells a request's handler.
#[derive(Debug)]
pub enum Event {
    /// More of a streamed text answer (greedy text tasks).
    Text(String),
    /// One decode step ran (streaming sends an SSE comment: progress, and a write that detects a
    /// disconnected client).
    Step,
    /// The answer, or why there is none.
    Done(Box<Result<Answer, ApiError>>),
}

/// One admitted request.
pub struct Job {
    pub prompt: AnyTaskPrompt,
    pub image: RgbImage,
    pub max_tokens: Option<usize>,
    pub num_beams: Option<usize>,
    pub stream: bool,
    pub reply: UnboundedSender<Event>,
    pub admitted: Instant,
    /// Released when the job is done (its slot in the queue capacity).
    pub permit: OwnedSemaphorePermit,
    /// The image's share of `--max-queued-image-bytes`, released with the image.
    pub image_permit: Option<OwnedSemaphorePermit>,
}

pub const LOADING: u8 = 0;
pub const READY: u8 = 1;
pub const FAILED: u8 = 2;

/// State shared by the worker, the handlers and `main`.
pub struct Shared {
    pub state: AtomicU8,
    pub info: Mutex<Option<ModelInfo>>,
    pub load_error: Mutex<Option<String>>,
    /// Set at shutdown after the grace period: running and queued requests are cancelled.
    pub abort: AtomicBool,
    /// Set at shutdown: new requests are refused with 503.
    pub closing: AtomicBool,
    pub metrics: Metrics,
    /// Test hook (`FLORENCE2_SERVE_HOLD_FILE`, unset in production): while this file exists and is empty
    /// the worker neither finishes loading nor starts the next request; while it contains `step` the
    /// worker pauses before each decode step instead; while it contains `oom` each request fails as a
    /// GPU out-of-memory error would. Tests use it to observe "loading", fill the queue, disconnect while
    /// queued or while decoding, and see the answer to memory exhaustion, deterministically.
    pub hold_file: Option<PathBuf>,
}

impl Shared {
    pub fn ready(&self) -> bool {
        self.state.load(Ordering::Acquire) == READY
    }

    /// Why the model cannot serve (a failed load, a lost device).
    pub fn failure(&self) -> String {
        self.load_error
            .lock()
            .ok()
            .and_then(|e| e.clone())
            .unwrap_or_default()
    }

    pub fn info(&self) -> Option<ModelInfo> {
        self.info.lock().ok().and_then(|i| i.clone())
    }
}

/// Where the worker may be held (see [`Shared::hold_file`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum HoldPoint {
    /// Before finishing the load and before each request (hold file empty).
    Request,
    /// Before each decode step (hold file says `step`).
    Step,
}

/// Wait while the hold file holds `point` (bounded: 10 minutes), unless aborting.
fn hold(shared: &Shared, point: HoldPoint) {
    let Some(path) = &shared.hold_file else {
        return;
    };
    let holds = || match std::fs::read_to_string(path) {
        Ok(s) if s.trim() == "step" => point == HoldPoint::Step,
        Ok(s) if s.trim() == "oom" => false,
        Ok(_) => point == HoldPoint::Request,
        Err(_) => false,
    };
    let t = Instant::now();
    while holds() && !shared.abort.load(Ordering::Relaxed) && t.elapsed() < Duration::from_secs(600)
    {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether the hold file says `oom` (see [`Shared::hold_file`]).
fn injected_oom(shared: &Shared) -> bool {
    shared
        .hold_file
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .is_some_and(|s| s.trim() == "oom")
}

/// The worker thread: load, report, then serve jobs until the channel closes.
pub fn run(
    dir: PathBuf,
    (dtype, tuning, device): (DTypeRequest, Tuning, Device),
    shared: Arc<Shared>,
    jobs: std::sync::mpsc::Receiver<Job>,
    loaded: tokio::sync::oneshot::Sender<Result<(), String>>,
) {
    let engine = match Engine::load(Path::new(&dir), dtype, tuning, device) {
        Ok(engine) => engine,
        Err(e) => {
            if let Ok(mut slot) = shared.load_error.lock() {
                *slot = Some(e.clone());
            }
            shared.state.store(FAILED, Ordering::Release);
            let _ = loaded.send(Err(e));
            return;
        }
    };
    hold(&shared, HoldPoint::Request);
    if let Ok(mut info) = shared.info.lock() {
        *info = Some(engine.info());
    }
    shared.state.store(READY, Ordering::Release);
    let _ = loaded.send(Ok(()));

    while let Ok(job) = jobs.recv() {
        shared.metrics.queued(-1);
        hold(&shared, HoldPoint::Request);
        serve_one(&engine, &shared, job);
    }
}

fn serve_one(engine: &Engine, shared: &Shared, job: Job) {
    let m = &shared.metrics;
    m.observe(Phase::Queue, job.admitted.elapsed().as_secs_f64());
    let reply = &job.reply;
    let cancelled = || reply.is_closed() || shared.abort.load(Ordering::Relaxed);
    // Cancelled while queued: no encoder pass.
    if cancelled() {
        m.count(Outcome::Cancelled);
        return;
    }
    m.set_running(true);
    let on_step = || {
        if job.stream {
            let _ = reply.send(Event::Step);
        }
        hold(shared, HoldPoint::Step);
        let stop = cancelled();
        if !stop {
            m.decode_step();
        }
        stop
    };
    // The library does not panic on any input; should a bug make it, this request fails with a 500 and
    // the worker goes on serving (a dead worker would leave every later request unanswered).
    let on_text = |delta: &str| {
        let _ = reply.send(Event::Text(delta.to_string()));
    };
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if injected_oom(shared) {
            return Err(florence2_wasm::Error::OutOfMemory(
                "injected by the test hook".into(),
            ));
        }
        engine.run(
            &job.image,
            &job.prompt,
            job.max_tokens,
            job.num_beams,
            &on_step,
            job.stream.then_some(&on_text as &dyn Fn(&str)),
        )
    }));
    m.set_running(false);
    let out = match out {
        Ok(out) => out,
        Err(_) => {
            m.count(Outcome::Error);
            drop((job.permit, job.image, job.image_permit));
            let e = ApiError::internal("the engine panicked while running this request");
            let _ = job.reply.send(Event::Done(Box::new(Err(e))));
            return;
        }
    };
    let result = match out {
        Ok(answer) => {
            m.observe(Phase::Encode, answer.encode_s);
            m.observe(Phase::Generate, answer.generate_s);
            m.add_tokens(answer.out.usage.generated_tokens as u64);
            m.count(Outcome::Ok);
            Ok(answer)
        }
        Err(e) => {
            if matches!(e, florence2_wasm::Error::DeviceLost(_)) {
                // Nothing will run on this device again: /health turns 503 "failed" (a load balancer
                // or supervisor takes the server out) and new requests get 503.
                if let Ok(mut slot) = shared.load_error.lock() {
                    *slot = Some(e.to_string());
                }
                shared.state.store(FAILED, Ordering::Release);
            }
            let api = ApiError::from_engine(&e);
            let outcome = if reply.is_closed() {
                Outcome::Cancelled
            } else if api.status.is_client_error() {
                Outcome::Invalid
            } else {
                Outcome::Error
            };
            m.count(outcome);
            Err(api)
        }
    };
    m.observe(Phase::Total, job.admitted.elapsed().as_secs_f64());
    // The slot is free before the answer leaves: a client that sends its next request as soon as it has
    // the answer finds room.
    drop((job.permit, job.image, job.image_permit));
    let _ = job.reply.send(Event::Done(Box::new(result)));
}
