//! The one GPU worker: a plain thread that loads the model and then runs queued requests in a continuous
//! batch (`--max-batch`): between decode steps, queued requests are prepared (image, prompt, encoder) and
//! join the batch; one decoder step runs for all of them per submit
//! ([`florence2_wasm::pipeline::DecodeBatch`]); each leaves when it is done. Answers equal unbatched ones.
//!
//! Requests reach it through an unbounded channel whose length is bounded by the admission semaphore
//! (`--max-queue` waiting + 1 running; see `routes.rs`). Each job carries the sender of its reply channel;
//! the handler (or the SSE body) holds the receiver, so a client that disconnects drops the receiver and
//! `is_closed()` becomes true. The worker checks it before the encoder pass (a cancelled queued request
//! costs nothing) and the model's cancellation hook polls it before every decode step (a running request
//! stops within one step). Shutdown sets `abort`, which cancels the same way.
//!
//! Isolation: everything a request allocates on the GPU (pixels, encoder output, KV caches) is owned by its
//! batch entry and dropped when it leaves; the batch shares only the loaded weights and a scratch the
//! step overwrites.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use image::RgbImage;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::OwnedSemaphorePermit;

use florence2_wasm::estimate::DTypeRequest;
use florence2_wasm::gpu::tune::Tuning;
use florence2_wasm::pipeline::tiles::Tiles;
use florence2_wasm::pipeline::{
    BatchEvent, Callbacks, DecodeBatch, DeviceChoice, EncodedImage, Image, Prepared, TaskOptions,
};

use super::api::ChatRequest;
use super::engine::{Answer, Engine, ModelInfo, Request, TextStream};
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
    /// The request with its image decoded; `florence2.tiles`: a tiled job runs alone
    /// ([`Batcher::run_tiled`]).
    pub req: ChatRequest<RgbImage>,
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
/// A hub model is being downloaded (before `LOADING`; see `download.rs`).
pub const DOWNLOADING: u8 = 3;

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
    /// The hub model's download progress (empty for a model directory).
    pub download: super::download::Progress,
    /// Test hook (`FLORENCE2_SERVE_HOLD_FILE`, unset in production): while this file exists and is empty
    /// the worker neither finishes loading nor starts the next request; while it contains `step` the
    /// worker pauses before each decode step instead; while it contains `decode` a request handler
    /// pauses while it decodes its image (before its job is queued); while it contains `oom` each
    /// request fails as a GPU out-of-memory error would. Tests use it to observe "loading", fill the queue, disconnect while
    /// queued or while decoding, and see the answer to memory exhaustion, deterministically.
    pub hold_file: Option<PathBuf>,
}

impl Shared {
    /// The state at start: downloading a hub model (`hub`) or loading a local one; the test hook
    /// `FLORENCE2_SERVE_HOLD_FILE` read from the environment.
    pub fn new(hub: bool) -> Shared {
        Shared {
            state: AtomicU8::new(if hub { DOWNLOADING } else { LOADING }),
            info: Mutex::new(None),
            load_error: Mutex::new(None),
            abort: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            metrics: Metrics::new(),
            download: super::download::Progress::default(),
            hold_file: std::env::var_os("FLORENCE2_SERVE_HOLD_FILE").map(PathBuf::from),
        }
    }

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
pub(super) enum HoldPoint {
    /// Before finishing the load and before each request (hold file empty).
    Request,
    /// Before each decode step (hold file says `step`).
    Step,
    /// In a request handler, before its image is decoded (hold file says `decode`).
    Decode,
}

/// Wait while the hold file holds `point` (bounded: 10 minutes), unless aborting.
pub(super) fn hold(shared: &Shared, point: HoldPoint) {
    let Some(path) = &shared.hold_file else {
        return;
    };
    let holds = || match std::fs::read_to_string(path) {
        Ok(s) if s.trim() == "step" => point == HoldPoint::Step,
        Ok(s) if s.trim() == "decode" => point == HoldPoint::Decode,
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
    (dtype, tuning, device): (DTypeRequest, Tuning, DeviceChoice),
    max_batch: usize,
    shared: Arc<Shared>,
    jobs: std::sync::mpsc::Receiver<Job>,
    loaded: tokio::sync::oneshot::Sender<Result<(), String>>,
) {
    fix_allocator_thresholds();
    shared.state.store(LOADING, Ordering::Release);
    let engine = match Engine::load(Path::new(&dir), dtype, tuning, device) {
        Ok(engine) => engine,
        Err(e) => return fail(&shared, loaded, e),
    };
    hold(&shared, HoldPoint::Request);
    if let Ok(mut info) = shared.info.lock() {
        *info = Some(engine.info());
    }
    shared.state.store(READY, Ordering::Release);
    let _ = loaded.send(Ok(()));
    Batcher {
        engine: &engine,
        shared: &shared,
        max_batch: max_batch.max(1),
        live: HashMap::new(),
        next_id: 0,
    }
    .serve(&jobs);
}

/// The model cannot be served (a failed download or load): `/health` says so and `main` exits with `e`.
pub fn fail(shared: &Shared, loaded: tokio::sync::oneshot::Sender<Result<(), String>>, e: String) {
    if let Ok(mut slot) = shared.load_error.lock() {
        *slot = Some(e.clone());
    }
    shared.state.store(FAILED, Ordering::Release);
    let _ = loaded.send(Err(e));
}

/// A request in the running batch: what its answer needs besides the batch's own state.
struct Live {
    reply: UnboundedSender<Event>,
    stream: bool,
    text: Option<TextStream>,
    admitted: Instant,
    /// Seconds its image took through the vision tower (its share of a batch).
    image_s: f64,
    /// Released when the request is answered (its slot in the admission capacity).
    permit: OwnedSemaphorePermit,
}

impl Live {
    /// What stays of a job once its image is encoded: the pixels and their share of
    /// `--max-queued-image-bytes` go back now.
    fn of(job: Job, text: Option<TextStream>, image_s: f64) -> Live {
        let Job {
            req,
            reply,
            admitted,
            permit,
            image_permit,
        } = job;
        let stream = req.stream;
        drop((req, image_permit));
        Live {
            reply,
            stream,
            text,
            admitted,
            image_s,
            permit,
        }
    }
}

/// The batching loop: requests join the running batch between decode steps (up to `max_batch`), each
/// prepared (image, prompt, encoder) as it joins, and leave when they finish or are cancelled.
struct Batcher<'e> {
    engine: &'e Engine,
    shared: &'e Shared,
    max_batch: usize,
    live: HashMap<u64, Live>,
    next_id: u64,
}

impl<'e> Batcher<'e> {
    fn serve(&mut self, jobs: &std::sync::mpsc::Receiver<Job>) {
        let mut batch = DecodeBatch::new(self.engine.pipeline());
        loop {
            // Wait for work when there is none; otherwise take what is queued, up to the batch size.
            let mut joining = Vec::new();
            if batch.is_empty() {
                let job = jobs.try_recv().or_else(|_| {
                    // Idle: what the last requests freed goes back to the system before the wait.
                    release_free_memory();
                    self.shared.metrics.set_idle(true);
                    let job = jobs.recv();
                    self.shared.metrics.set_idle(false);
                    job
                });
                match job {
                    Ok(job) => joining.push(job),
                    Err(_) => return,
                }
            }
            while batch.len() + joining.len() < self.max_batch {
                match jobs.try_recv() {
                    Ok(job) => joining.push(job),
                    Err(_) => break,
                }
            }
            if !joining.is_empty() {
                self.admit(&mut batch, joining);
            }
            if !batch.is_empty() {
                self.step(&mut batch);
            }
        }
    }

    fn cancelled(&self, l: &Live) -> bool {
        l.reply.is_closed() || self.shared.abort.load(Ordering::Relaxed)
    }

    /// Take jobs off the queue: their images through the vision tower together, then each prepared
    /// (prompt, encoder) and added to the batch, or answered why not.
    fn admit(&mut self, batch: &mut DecodeBatch<'e, u64>, jobs: Vec<Job>) {
        let ready = self.dequeue(jobs);
        if ready.is_empty() {
            return;
        }
        let Some((jobs, images)) = self.encode(ready) else {
            return;
        };
        // The prompts of the jobs whose images were encoded, through the encoder together.
        let engine = self.engine;
        let requests: Vec<Request> = jobs
            .iter()
            .zip(&images)
            .map(|(job, image)| Request {
                image,
                prompt: &job.req.prompt,
                limits: (job.req.max_tokens, job.req.num_beams),
                stream: job.req.stream,
            })
            .collect();
        let prepared = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            engine.prepare_batch(&requests)
        }));
        drop(requests);
        let Ok(prepared) = prepared else {
            for job in jobs {
                self.panicked(Live::of(job, None, 0.0));
            }
            return;
        };
        for ((job, image), p) in jobs.into_iter().zip(images).zip(prepared) {
            let image_s = (image.preprocess_ms() + image.vision_ms()) / 1e3;
            drop(image);
            self.admit_one(batch, job, p.map(|(p, text)| (p, text, image_s)));
        }
    }

    /// Jobs taken off the queue (counted and timed): a cancelled one answered, a tiled one run alone;
    /// the others, to join the batch.
    fn dequeue(&mut self, jobs: Vec<Job>) -> Vec<Job> {
        let (shared, m) = (self.shared, &self.shared.metrics);
        let mut ready = Vec::with_capacity(jobs.len());
        for job in jobs {
            m.queued(-1);
            hold(shared, HoldPoint::Request);
            m.observe(Phase::Queue, job.admitted.elapsed().as_secs_f64());
            // Cancelled while queued: no encoder pass.
            if job.reply.is_closed() || shared.abort.load(Ordering::Relaxed) {
                m.count(Outcome::Cancelled);
            } else if job.req.tiles != Tiles::Off {
                self.run_tiled(job);
            } else {
                ready.push(job);
            }
        }
        ready
    }

    /// The jobs' images through the vision tower together: the jobs whose images were encoded, with
    /// them; each other job answered with its error. `None`: the library panicked and every job was
    /// answered with a 500.
    fn encode(&mut self, ready: Vec<Job>) -> Option<(Vec<Job>, Vec<EncodedImage>)> {
        // The library does not panic on any input; should a bug make it, these requests fail with a
        // 500 and the worker goes on serving (a dead worker would leave every later request
        // unanswered).
        let (engine, shared) = (self.engine, self.shared);
        let encoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if injected_oom(shared) {
                let oom = || florence2_wasm::Error::OutOfMemory("injected by the test hook".into());
                return ready.iter().map(|_| Err(oom())).collect();
            }
            let images: Vec<&image::RgbImage> = ready.iter().map(|j| &j.req.image).collect();
            engine.encode_images(&images)
        }));
        let Ok(encoded) = encoded else {
            for job in ready {
                self.panicked(Live::of(job, None, 0.0));
            }
            return None;
        };
        let mut jobs = Vec::with_capacity(ready.len());
        let mut images = Vec::with_capacity(ready.len());
        for (job, image) in ready.into_iter().zip(encoded) {
            match image {
                Ok(image) => {
                    jobs.push(job);
                    images.push(image);
                }
                Err(e) => self.done(Live::of(job, None, 0.0), Err(e)),
            }
        }
        Some((jobs, images))
    }

    /// A tiled job, run to its end: its views decode as one batch of their own while the running batch
    /// waits (a tiled run is up to 17 views: joining them to the shared batch view by view would not
    /// make it finish sooner).
    fn run_tiled(&mut self, job: Job) {
        let pipeline = self.engine.pipeline();
        let abort = &self.shared.abort;
        let cancel = || job.reply.is_closed() || abort.load(Ordering::Relaxed);
        let options = TaskOptions {
            max_new_tokens: job.req.max_tokens,
            num_beams: job.req.num_beams,
            ..TaskOptions::default()
        };
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pollster::block_on(pipeline.run_tiled_prompt(
                Image::Rgb(&job.req.image),
                job.req.prompt.clone(),
                &options,
                job.req.tiles,
                &cancel,
                &Callbacks::default(),
            ))
        }));
        let Ok(out) = out else {
            self.panicked(Live::of(job, None, 0.0));
            return;
        };
        let out = out.map(|t| {
            let tiles = Some(t.tiles_json());
            let image_s = t.output.timings.vision_ms / 1e3;
            Answer {
                tiles,
                ..Answer::new(t.output, image_s, String::new())
            }
        });
        self.done(Live::of(job, None, 0.0), out);
    }

    /// Add one prepared job to the batch, or answer why not.
    fn admit_one(
        &mut self,
        batch: &mut DecodeBatch<'e, u64>,
        job: Job,
        prepared: florence2_wasm::Result<(Prepared, Option<TextStream>, f64)>,
    ) {
        let shared = self.shared;
        let added = match prepared {
            Err(e) => Err(Some(e)),
            Ok((prepared, text, image_s)) => {
                let id = self.next_id;
                self.next_id += 1;
                match batch.add(id, prepared) {
                    Ok(()) => {
                        self.live.insert(id, Live::of(job, text, image_s));
                        shared.metrics.set_running(batch.len());
                        return;
                    }
                    Err(e) => Err(Some(e)),
                }
            }
        };
        let live = Live::of(job, None, 0.0);
        match added {
            Err(None) => self.panicked(live),
            Err(Some(e)) => self.done(live, Err(e)),
            Ok(()) => {}
        }
    }

    /// Remove the requests whose clients went away (or all, at shutdown).
    fn sweep_cancelled(&mut self, batch: &mut DecodeBatch<'e, u64>) {
        let live = &self.live;
        let gone = batch.cancel(|id| live.get(id).is_none_or(|l| self.cancelled(l)));
        for id in gone {
            // As a running request's cancellation always ends: a disconnected client counts as
            // cancelled; one still there (shutdown) is told so.
            if let Some(l) = self.live.remove(&id) {
                self.done(l, Err(florence2_wasm::Error::Cancelled));
            }
        }
    }

    /// One decode step of the batch, and what it means for each request. Each streamed request hears
    /// of the step first (an SSE comment: a write that detects a disconnected client); cancellations
    /// are polled right before the step runs.
    fn step(&mut self, batch: &mut DecodeBatch<'e, u64>) {
        let m = &self.shared.metrics;
        for l in self.live.values().filter(|l| l.stream) {
            let _ = l.reply.send(Event::Step);
        }
        hold(self.shared, HoldPoint::Step);
        self.sweep_cancelled(batch);
        m.set_running(batch.len());
        if batch.is_empty() {
            return;
        }
        m.observe_batch(batch.len(), batch.rows());
        for _ in self.live.values() {
            m.decode_step();
        }
        let events = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pollster::block_on(batch.step())
        }));
        let Ok(events) = events else {
            // A bug in the shared step: every request in the batch fails, and a fresh batch goes on.
            *batch = DecodeBatch::new(self.engine.pipeline());
            for (_, l) in self.live.drain().collect::<Vec<_>>() {
                self.panicked(l);
            }
            m.set_running(0);
            return;
        };
        for ev in events {
            match ev {
                BatchEvent::Tokens(id, pieces) => {
                    let Some(l) = self.live.get_mut(&id) else {
                        continue;
                    };
                    if let Some(text) = &mut l.text {
                        for (piece, _) in &pieces {
                            if let Some(delta) = text.push(piece) {
                                let _ = l.reply.send(Event::Text(delta));
                            }
                        }
                    }
                }
                BatchEvent::Done(id, out) => {
                    if let Some(mut l) = self.live.remove(&id) {
                        let streamed = l.text.take().map(TextStream::emitted).unwrap_or_default();
                        let out = (*out).map(|o| Answer::new(o, l.image_s, streamed));
                        self.done(l, out);
                    }
                }
            }
        }
        m.set_running(batch.len());
    }

    fn panicked(&self, l: Live) {
        self.shared.metrics.count(Outcome::Error);
        let Live { reply, permit, .. } = l;
        drop(permit);
        let e = ApiError::internal("the engine panicked while running this request");
        let _ = reply.send(Event::Done(Box::new(Err(e))));
    }

    /// Answer a request.
    fn done(&self, l: Live, out: florence2_wasm::Result<Answer>) {
        let (shared, m) = (self.shared, &self.shared.metrics);
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
                    // Nothing will run on this device again: /health turns 503 "failed" (a load
                    // balancer or supervisor takes the server out) and new requests get 503.
                    if let Ok(mut slot) = shared.load_error.lock() {
                        *slot = Some(e.to_string());
                    }
                    shared.state.store(FAILED, Ordering::Release);
                }
                let api = ApiError::from_engine(&e);
                let outcome = if l.reply.is_closed() {
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
        m.observe(Phase::Total, l.admitted.elapsed().as_secs_f64());
        // The slot is free before the answer leaves: a client that sends its next request as soon as it
        // has the answer finds room.
        let Live { reply, permit, .. } = l;
        drop(permit);
        let _ = reply.send(Event::Done(Box::new(result)));
    }
}

/// Hand the heap pages freed by finished requests back to the system. glibc's allocator keeps freed
/// memory in its arenas (one per thread that allocated: the worker, the CPU backend's pool, the
/// handlers); `malloc_trim` returns the free pages inside every arena and the free top of the main
/// one (not the free top of a thread's arena: see [`fix_allocator_thresholds`]). Elsewhere the
/// allocator decides.
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The largest value glibc's dynamic mmap threshold reaches (`DEFAULT_MMAP_THRESHOLD_MAX`: 32 MiB on
/// 64-bit): an allocation at least this large gets a mapping of its own, unmapped when freed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int =
    4 * 1024 * 1024 * std::mem::size_of::<libc::c_long>() as libc::c_int;

/// glibc's starting trim threshold: once the free top of an arena is this large, a free returns it.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: libc::c_int = 128 * 1024;

/// Keep glibc's trim threshold at its starting 128 KiB instead of letting it follow the largest block
/// freed (up to 64 MiB). Left dynamic, the model load's large temporary buffers raise it, and from then
/// on the free top of the worker thread's arena (where a request's encoder output, KV caches and, on
/// the CPU backend, activations live) stays resident: neither a free nor `malloc_trim` (which trims
/// only the main arena's top) returns it. The idle server stayed 4-16% above its baseline after 32
/// requests of the demo model on the CPU backend beside two busy processes (the worker's arena grew by
/// 2-4 MB with its bytes in use unchanged); with the trim threshold fixed, +0.4% to +1.6%.
///
/// Fixing one threshold stops glibc's adjustment of both, so the mmap threshold is set to the dynamic
/// one's ceiling, toward which large freed blocks drive it: blocks below it keep coming from the
/// arenas, reused without page faults. At glibc's
/// starting 128 KiB instead, every larger block would be a fresh mapping: 1500 page faults per request
/// of the demo model instead of ~65, and 14% less throughput; at 32 MiB the cost is 3% (release build,
/// 96 requests by 8 clients, medians of 6). Thresholds the user sets (`MALLOC_MMAP_THRESHOLD_`,
/// `MALLOC_TRIM_THRESHOLD_`, `GLIBC_TUNABLES`) are kept.
fn fix_allocator_thresholds() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
        let user = ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"]
            .iter()
            .any(|v| std::env::var_os(v).is_some());
        if user || tunables.contains("_threshold") {
            return;
        }
        // SAFETY: mallopt only sets the allocator's parameters; it takes no pointers.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        }
    }
}
