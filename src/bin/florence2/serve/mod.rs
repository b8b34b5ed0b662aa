//! `florence2 serve`: an OpenAI-compatible HTTP server (chat completions) over the native engine.
//!
//! ```text
//! florence2 serve --model DIR [--dtype fp16|auto|...] [--tuning auto] [--cpu-dot auto|int8|exact] [--host 127.0.0.1] [--port 8000] [--model-id NAME] [--max-queue 16] [--max-batch 8]
//!                 [--default-task <MORE_DETAILED_CAPTION>] [--log-format text|json]
//!                 [--api-key KEY | env FLORENCE2_API_KEY] [--max-body-bytes N] [--max-image-bytes N]
//!                 [--max-image-pixels N] [--shutdown-timeout SECS]
//!                 [--allow-remote-images [--remote-image-timeout SECS] [--max-remote-redirects N]
//!                  [--allow-private-remote-images]] [--cors-origin ORIGIN ...] [--max-queued-image-bytes N]
//! ```
//!
//! One GPU worker thread owns the library `Pipeline` (`engine.rs`, `worker.rs`); HTTP runs on tokio + axum (`routes.rs`); requests
//! are validated in `api.rs`; errors have the OpenAI shape (`error.rs`); `/metrics` is Prometheus text
//! (`metrics.rs`); `--cors-origin` adds CORS headers (`cors.rs`); remote image fetches connect only to
//! public addresses (`remote.rs`, `guard.rs`). The listening address is printed on stdout as `listening on http://ADDR` once bound
//! (`--port 0` picks a free port). SIGINT / SIGTERM: stop accepting, let running and queued requests
//! finish for `--shutdown-timeout` seconds, then cancel them, and exit 0. A hub id is downloaded after
//! binding, on the worker thread before its load (`download.rs`: `/health` says `downloading` with
//! progress; SIGTERM does not wait for it).

mod access_log;
mod api;
mod cors;
mod download;
mod engine;
mod error;
mod guard;
mod media;
mod metrics;
mod remote;
mod routes;
mod tiles;
mod worker;

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
use tokio::sync::Semaphore;

use florence2_wasm::estimate::DTypeRequest;
use florence2_wasm::gpu::tune::Tuning;
use florence2_wasm::pipeline::DeviceChoice;
use florence2_wasm::processor::image::ImageLimits;

use routes::AppState;
use worker::{Shared, DOWNLOADING};

/// OpenAI-compatible HTTP server: POST /v1/chat/completions, GET /v1/models, /health, /metrics. The
/// address is printed on stdout as 'listening on http://ADDR' once bound.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Model directory or hub id org/name[@revision] (as for `florence2 run`). A hub id downloads after
    /// the server listens: /health answers 503 {"status": "downloading", "progress": {...}} meanwhile,
    /// then "loading", then 200 "ok"; a failed download ends the server as a failed load does
    #[arg(long, value_name = "DIR|ORG/NAME")]
    model: PathBuf,
    /// Resident weight format, as for `florence2 run`: fp32, fp16 (half the bytes, f32 arithmetic), q8 or
    /// q4 (block-quantized); any checkpoint converts on load; auto: the best of fp16, q8, q4 that fits
    /// the device (the choice on stderr and in /health)
    #[arg(long, value_name = "auto|fp32|fp16|q8|q4|PART=FORMAT,..", default_value = "fp16", value_parser = super::parse_dtype_request)]
    dtype: DTypeRequest,
    /// Kernel tuning at load, as for `florence2 run`: auto (time what the per-adapter cache lacks,
    /// within a time budget; later starts continue), off (static kernel choices), exhaustive
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = super::tune::parse_tuning)]
    tuning: Tuning,
    /// Device: auto (a hardware GPU, else the CPU backend, also when the only adapter is a software
    /// one), gpu (any wgpu adapter), or cpu (the CPU backend, on all cores)
    #[arg(long, value_name = "auto|gpu|cpu", default_value = "auto", value_parser = crate::cli::parse_device)]
    device: DeviceChoice,
    /// How the CPU backend's decode steps dot q8/q4 weights, as for `florence2 run`: int8 (integer
    /// dots, about twice as fast), exact (the GPU's results), or auto (int8 for q4, exact for q8)
    /// [default: FLORENCE2_CPU_QUANT_DOT, else auto]
    #[arg(long, value_name = "auto|int8|exact", value_parser = crate::cli::parse_cpu_dot)]
    cpu_dot: Option<florence2_wasm::cpu::qdot_int8::QuantDot>,
    /// Address to bind; keep the loopback default behind a reverse proxy (see docs/server.md)
    #[arg(long, value_name = "IP", default_value = "127.0.0.1")]
    host: std::net::IpAddr,
    /// Port; 0 picks a free one
    #[arg(long, value_name = "N", default_value_t = 8000)]
    port: u16,
    /// Model id reported by /v1/models and in responses [default: the directory's name]
    #[arg(long, value_name = "NAME", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    model_id: Option<String>,
    /// Requests that may wait for the GPU worker (besides those in its running batch); beyond that: 429
    #[arg(long, value_name = "N", default_value_t = 16)]
    max_queue: usize,
    /// Requests decoded together (continuous batching: queued requests join the running batch between
    /// decode steps); 1 runs one request at a time. Answers are the same either way
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=256))]
    max_batch: u64,
    /// Require 'Authorization: Bearer KEY' on /v1/* and /metrics
    #[arg(
        long,
        value_name = "KEY",
        env = "FLORENCE2_API_KEY",
        hide_env_values = true
    )]
    api_key: Option<String>,
    /// Largest request body; beyond that: 413
    #[arg(long, value_name = "N", default_value_t = 32 << 20, value_parser = positive)]
    max_body_bytes: usize,
    /// Largest image (decoded from its data URL, checked before decoding; or fetched, checked while reading)
    #[arg(long, value_name = "N", default_value_t = 20 << 20, value_parser = positive)]
    max_image_bytes: usize,
    /// Largest width x height (checked from the image header before decoding the pixels)
    #[arg(long, value_name = "N", default_value_t = 25_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    max_image_pixels: u64,
    /// Seconds in-flight requests may take to finish after SIGINT/SIGTERM before they are cancelled
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    shutdown_timeout: u64,
    /// Fetch http(s) image URLs (off by default: they are refused with a 400). Only behind an
    /// egress-restricted network: the server fetches whatever host a client names (see docs/server.md)
    #[arg(long)]
    allow_remote_images: bool,
    /// Total time for one remote image fetch (connect, redirects, body), in seconds
    #[arg(long, value_name = "SECS", default_value_t = 10.0, value_parser = positive_secs)]
    remote_image_timeout: f64,
    /// Redirects followed by a remote image fetch (only to http/https URLs)
    #[arg(long, value_name = "N", default_value_t = 5)]
    max_remote_redirects: u32,
    /// Let remote image fetches connect to loopback, private, link-local, unique-local and cloud-metadata
    /// addresses (refused by default, after resolving each hop's host)
    #[arg(long, requires = "allow_remote_images")]
    allow_private_remote_images: bool,
    /// Allow browser pages on this origin (https://app.example.com) to call the server; repeat for
    /// several, or '*' for any
    #[arg(long = "cors-origin", value_name = "ORIGIN", value_parser = cors::parse_origin)]
    cors_origins: Vec<String>,
    /// Bytes of decoded images (width x height x 3) that admitted requests may hold together while they
    /// wait or run; a request beyond it gets 429. At least 3 x --max-image-pixels
    #[arg(long, value_name = "N", default_value_t = 512 << 20, value_parser = clap::value_parser!(u64).range(1..))]
    max_queued_image_bytes: u64,
    /// The task a prompt without a task marker runs (a generic client's plain question, or an image
    /// alone): a built-in task's name or marker; one that takes text gets the prompt as its input
    #[arg(long, value_name = "TASK", default_value = "<MORE_DETAILED_CAPTION>", value_parser = api::parse_default_task)]
    default_task: florence2_wasm::processor::prompt::Task,
    /// Access log on stderr, one line per request (method, path, status, tokens, ms): text or json
    #[arg(long, value_name = "text|json", default_value = "text", value_parser = access_log::parse_format)]
    log_format: access_log::LogFormat,
}

fn positive_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 && x <= 3600.0 => Ok(x),
        _ => Err(format!("takes seconds in (0, 3600], got {s:?}")),
    }
}

fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("takes a positive integer, got {s:?}")),
    }
}

/// Parsed options.
#[derive(Debug)]
struct ServeOptions {
    model: PathBuf,
    /// `model` is a hub id, downloaded after binding (`download.rs`).
    hub: bool,
    dtype: DTypeRequest,
    tuning: Tuning,
    device: DeviceChoice,
    addr: SocketAddr,
    model_id: String,
    max_queue: usize,
    max_batch: usize,
    api_key: Option<String>,
    max_body_bytes: usize,
    max_image_bytes: usize,
    max_image_pixels: u64,
    shutdown_timeout: Duration,
    remote: Option<remote::RemoteLimits>,
    cors: Option<cors::CorsOrigins>,
    max_queued_image_bytes: u64,
    default_task: florence2_wasm::processor::prompt::Task,
    log_format: access_log::LogFormat,
}

impl From<ServeArgs> for ServeOptions {
    fn from(a: ServeArgs) -> Self {
        let model_id = a.model_id.unwrap_or_else(|| {
            a.model
                .canonicalize()
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_else(|| "florence-2".into())
        });
        ServeOptions {
            addr: SocketAddr::new(a.host, a.port),
            hub: !a.model.is_dir(),
            model: a.model,
            dtype: a.dtype,
            tuning: a.tuning,
            device: a.device,
            model_id,
            max_queue: a.max_queue,
            max_batch: a.max_batch as usize,
            api_key: a.api_key.filter(|k| !k.is_empty()),
            max_body_bytes: a.max_body_bytes,
            max_image_bytes: a.max_image_bytes,
            max_image_pixels: a.max_image_pixels,
            shutdown_timeout: Duration::from_secs(a.shutdown_timeout),
            remote: a.allow_remote_images.then(|| remote::RemoteLimits {
                max_bytes: a.max_image_bytes,
                timeout: Duration::from_secs_f64(a.remote_image_timeout),
                max_redirects: a.max_remote_redirects,
                allow_private: a.allow_private_remote_images,
                hosts: test_hosts(),
            }),
            cors: cors::CorsOrigins::from_args(&a.cors_origins),
            max_queued_image_bytes: a.max_queued_image_bytes,
            default_task: a.default_task,
            log_format: a.log_format,
        }
    }
}

/// Test hook (`FLORENCE2_SERVE_TEST_RESOLVE=name=ip,...`, unset in production): fixed answers of the
/// remote image fetcher's resolver, so tests reach a loopback origin under a name of their choosing.
/// The address guard judges these addresses like any other.
fn test_hosts() -> guard::Hosts {
    let hosts = std::env::var("FLORENCE2_SERVE_TEST_RESOLVE")
        .ok()
        .and_then(|s| guard::parse_hosts(&s).ok())
        .unwrap_or_default();
    std::sync::Arc::new(hosts)
}

/// Run the server until SIGINT/SIGTERM (exit 0) or a failed model load (an error).
pub fn main(mut args: ServeArgs) -> Result<(), String> {
    if !args.model.is_dir() {
        let id = args.model.to_string_lossy().trim().to_owned();
        if florence2_wasm::hub_cache::ModelId::parse(&id).is_none() {
            // Neither a directory nor a hub id: the error `run` gives, before binding.
            args.model = super::model_dir(&args.model).map_err(|f| match f {
                super::Failure::Usage(m) | super::Failure::Run(m) => m,
            })?;
        } else {
            // A hub id, downloaded after binding; it names the served model by default.
            args.model = PathBuf::from(&id);
            let repo = id.split('@').next().unwrap_or(&id).to_owned();
            args.model_id.get_or_insert(repo);
        }
    }
    if let Some(d) = args.cpu_dot {
        florence2_wasm::cpu::qdot_int8::set_quant_dot(d);
    }
    let opts = ServeOptions::from(args);
    // One image of the largest size must fit in the queued-image budget.
    let largest = opts.max_image_pixels.saturating_mul(3);
    if opts.max_queued_image_bytes < largest {
        return Err(format!(
            "--max-queued-image-bytes {} is below one image of --max-image-pixels {} (x 3 bytes = {largest}); \
             raise it or lower --max-image-pixels",
            opts.max_queued_image_bytes, opts.max_image_pixels
        ));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("florence2-http")
        .build()
        .map_err(|e| format!("starting the async runtime: {e}"))?;
    let result = rt.block_on(serve(opts));
    // A worker still loading a model must not hold the exit up.
    rt.shutdown_timeout(Duration::from_secs(1));
    result
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

/// The GPU worker thread: downloads the model first when it is a hub id, then loads it and runs the
/// batching loop on `jobs`; `loaded` hears how the load went.
fn spawn_worker(
    opts: &ServeOptions,
    shared: Arc<Shared>,
    jobs: std::sync::mpsc::Receiver<worker::Job>,
    loaded: tokio::sync::oneshot::Sender<Result<(), String>>,
) -> Result<std::thread::JoinHandle<()>, String> {
    let (dir, hub, max_batch) = (opts.model.clone(), opts.hub, opts.max_batch);
    let model = (opts.dtype, opts.tuning, opts.device);
    std::thread::Builder::new()
        .name("florence2-gpu".into())
        .spawn(move || {
            let dir = match hub.then(|| download::fetch(&dir, &shared)) {
                Some(Ok(snapshot)) => snapshot,
                Some(Err(e)) => return worker::fail(&shared, loaded, e),
                None => dir,
            };
            worker::run(dir, model, max_batch, shared, jobs, loaded)
        })
        .map_err(|e| format!("starting the GPU worker: {e}"))
}

async fn serve(opts: ServeOptions) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(opts.addr)
        .await
        .map_err(|e| format!("binding {}: {e}", opts.addr))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("reading the bound address: {e}"))?;

    let shared = Arc::new(Shared::new(opts.hub));
    let (jobs_tx, jobs_rx) = std::sync::mpsc::channel();
    let (loaded_tx, loaded_rx) = tokio::sync::oneshot::channel();
    let worker = spawn_worker(&opts, shared.clone(), jobs_rx, loaded_tx)?;
    let state = Arc::new(app_state(&opts, shared.clone(), jobs_tx));
    announce(addr, &opts, state.capacity);

    // Stop on a signal (exit 0) or a failed load (an error).
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let stopper = spawn_stopper(shared.clone(), loaded_rx, stop_tx);
    let app = routes::router(state.clone());
    let graceful = async move {
        let _ = stop_rx.wait_for(|s| *s).await;
    };
    let server = tokio::spawn(
        axum::serve(listener, app)
            .with_graceful_shutdown(graceful)
            .into_future(),
    );
    let reason = wait_for_stop(&opts, &shared, stopper, server).await?;
    shut_down(&shared, state, worker).await;
    match reason {
        None => {
            eprintln!("florence2 serve: stopped");
            Ok(())
        }
        Some(msg) => Err(msg),
    }
}

/// The stopper's reason to stop (`None`: a signal; `Some`: a failed load), once the server has
/// stopped taking requests and drained the ones in flight; an error when the server itself failed.
async fn wait_for_stop(
    opts: &ServeOptions,
    shared: &Shared,
    mut stopper: tokio::task::JoinHandle<Option<String>>,
    mut server: tokio::task::JoinHandle<std::io::Result<()>>,
) -> Result<Option<String>, String> {
    let mut server_done = false;
    let reason = tokio::select! {
        biased;
        r = &mut stopper => r.unwrap_or(None),
        r = &mut server => {
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(format!("server error: {e}")),
                Err(e) => return Err(format!("server task failed: {e}")),
            }
            // The server stops gracefully only after the stopper said so: take its reason.
            server_done = true;
            stopper.await.unwrap_or(None)
        }
    };
    if !server_done {
        drain(opts, shared, server).await;
    }
    Ok(reason)
}

/// Cancels the running and queued requests, closes the worker's queue and waits (10 s at most) for
/// the worker to end.
async fn shut_down(shared: &Shared, state: Arc<AppState>, worker: std::thread::JoinHandle<()>) {
    shared.abort.store(true, Ordering::Relaxed);
    if let Ok(mut jobs) = state.jobs.lock() {
        jobs.take(); // the worker's channel closes: it ends after draining (cancelling) what is left
    }
    drop(state);
    // A download in progress is not waited for: it ends with the process, its partial blob kept for
    // the next start to resume.
    if shared.state.load(Ordering::Acquire) != DOWNLOADING {
        let joined = tokio::task::spawn_blocking(move || worker.join());
        let _ = tokio::time::timeout(Duration::from_secs(10), joined).await;
    }
}

/// The state every route shares; `jobs` feeds the GPU worker.
fn app_state(
    opts: &ServeOptions,
    shared: Arc<Shared>,
    jobs: std::sync::mpsc::Sender<worker::Job>,
) -> AppState {
    let capacity = opts.max_queue.saturating_add(opts.max_batch);
    AppState {
        shared,
        model_id: opts.model_id.clone(),
        api_key: opts.api_key.clone(),
        max_body_bytes: opts.max_body_bytes,
        max_image_bytes: opts.max_image_bytes,
        image_limits: ImageLimits {
            max_pixels: opts.max_image_pixels,
            ..ImageLimits::default()
        },
        remote: opts.remote.clone(),
        cors: opts.cors.clone(),
        max_queued_image_bytes: opts.max_queued_image_bytes,
        image_budget: Arc::new(Semaphore::new(
            usize::try_from(opts.max_queued_image_bytes)
                .unwrap_or(usize::MAX)
                .min(Semaphore::MAX_PERMITS),
        )),
        capacity,
        admission: Arc::new(Semaphore::new(capacity)),
        jobs: Mutex::new(Some(jobs)),
        started: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        default_task: opts.default_task,
        log_format: opts.log_format,
    }
}

/// The bound address on stdout (clients wait for it), the configuration on stderr.
fn announce(addr: SocketAddr, opts: &ServeOptions, capacity: usize) {
    println!("florence2 serve: listening on http://{addr}");
    eprintln!(
        "florence2 serve: model {} (id {:?}, {} weights) {}; {} request(s) admitted at once; API key {}",
        opts.model.display(),
        opts.model_id,
        opts.dtype.label(),
        if opts.hub { "downloading" } else { "loading" },
        capacity,
        if opts.api_key.is_some() {
            "required"
        } else {
            "not required"
        }
    );
}

/// A task that waits for a shutdown signal (reason `None`) or a failed model load (its message), then
/// marks the server closing and tells the HTTP server to stop.
fn spawn_stopper(
    shared: Arc<Shared>,
    loaded: tokio::sync::oneshot::Receiver<Result<(), String>>,
    stop: tokio::sync::watch::Sender<bool>,
) -> tokio::task::JoinHandle<Option<String>> {
    let load_failed = async {
        match loaded.await {
            Ok(Err(msg)) => msg,
            Ok(Ok(())) => {
                eprintln!("florence2 serve: model loaded, ready");
                std::future::pending().await
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::spawn(async move {
        let reason = tokio::select! {
            _ = shutdown_signal() => None,
            msg = load_failed => Some(msg),
        };
        shared.closing.store(true, Ordering::Relaxed);
        let _ = stop.send(true);
        reason
    })
}

/// Let in-flight requests finish for the grace period, then cancel them (each stops within one decode
/// step), then give the connections a moment to flush their 503s.
async fn drain<T>(opts: &ServeOptions, shared: &Shared, mut server: tokio::task::JoinHandle<T>) {
    eprintln!(
        "florence2 serve: shutting down (finishing in-flight requests for up to {:?})",
        opts.shutdown_timeout
    );
    if tokio::time::timeout(opts.shutdown_timeout, &mut server)
        .await
        .is_err()
    {
        shared.abort.store(true, Ordering::Relaxed);
        if tokio::time::timeout(Duration::from_secs(5), &mut server)
            .await
            .is_err()
        {
            server.abort();
        }
    }
}
