//! The HTTP routes: `POST /v1/chat/completions`, `GET /v1/models`, `GET /health`, `GET /metrics`.
//!
//! A chat request goes through, in order: the API key (401), readiness (503 while loading or shutting
//! down), the body size (413, from `Content-Length` first and while reading), request validation (400),
//! admission (429 when `--max-queue` requests already wait and one runs), the remote image fetch with
//! `--allow-remote-images` (400 for each failure, see `remote.rs`), the queued-image budget (429 when the
//! decoded images of admitted requests would pass `--max-queued-image-bytes`; sized from the image
//! header before decoding), image decoding under the pixel limit (400), then the worker's queue. With
//! `--cors-origin` every route answers CORS requests (`cors.rs`). The answer is one JSON object, or with `"stream": true` an SSE
//! stream of `chat.completion.chunk` objects ending with `data: [DONE]`. A request whose `model` is not
//! the served one is a 404 (`model_not_found`, see `api.rs`); a prompt without a task marker runs
//! `--default-task` and the answer's `florence2_result.default_task` says so. Every request, whatever
//! its route and status, writes one access-log line (`access_log.rs`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use florence2_wasm::pipeline::StopReason;
use florence2_wasm::processor::image::{decode_image, ImageLimits, RgbImage};
use florence2_wasm::processor::prompt::Task;

use super::access_log::{self, Entry as LogEntry, LogFormat};
use super::api::{
    parse_chat_request, ChatRequest, DefaultTask, ImageSource, RequestLimits, Served,
};
use super::engine::Answer;
use super::error::ApiError;
use super::metrics::{Outcome, Phase};
use super::remote::{fetch_image, RemoteLimits};
use super::worker::{hold, Event, HoldPoint, Job, Shared, DOWNLOADING, FAILED};

/// Settings and shared state of the routes.
pub struct AppState {
    pub shared: Arc<Shared>,
    pub model_id: String,
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    pub max_image_bytes: usize,
    pub image_limits: ImageLimits,
    /// `--allow-remote-images` with its limits; `None`: remote URLs are refused.
    pub remote: Option<RemoteLimits>,
    /// `--cors-origin`; `None`: no CORS headers.
    pub cors: Option<super::cors::CorsOrigins>,
    /// `--max-queued-image-bytes`, and its budget: one permit per byte of decoded image held by an
    /// admitted request.
    pub max_queued_image_bytes: u64,
    pub image_budget: Arc<Semaphore>,
    /// `--max-queue` waiting + 1 running.
    pub capacity: usize,
    pub admission: Arc<Semaphore>,
    pub jobs: std::sync::Mutex<Option<std::sync::mpsc::Sender<Job>>>,
    pub started: u64,
    /// `--default-task`: what a prompt without a task marker runs.
    pub default_task: Task,
    /// `--log-format` of the access log.
    pub log_format: LogFormat,
}

impl AppState {
    /// The model clients may name and the default task.
    fn served(&self) -> Served {
        Served {
            model_id: self.model_id.clone(),
            default_task: self.default_task,
        }
    }
}

pub fn router(state: Arc<AppState>) -> Router {
    let cors = state.cors.clone();
    let log_format = state.log_format;
    let router = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(fallback)
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .with_state(state);
    let router = match cors {
        Some(origins) => router.layer(axum::middleware::from_fn_with_state(
            Arc::new(origins),
            super::cors::cors,
        )),
        None => router,
    };
    // Outermost: CORS preflights and every refusal are logged too.
    router.layer(axum::middleware::from_fn_with_state(
        log_format,
        access_log::access_log,
    ))
}

/// A share of the queued-image budget for the decoded size of `bytes` (width x height x 3, read from
/// the header), or 429 when the admitted requests' images already hold too much of it. `None` when the
/// header does not tell a size within the pixel limit: decoding then refuses the image.
fn reserve_image(state: &AppState, bytes: &[u8]) -> Result<Option<OwnedSemaphorePermit>, ApiError> {
    let dims = image::ImageReader::new(std::io::Cursor::new(bytes))
        .with_guessed_format()
        .ok()
        .and_then(|r| r.into_dimensions().ok());
    let Some((w, h)) = dims else {
        return Ok(None);
    };
    let pixels = u64::from(w) * u64::from(h);
    if pixels > state.image_limits.max_pixels {
        return Ok(None);
    }
    let need = u32::try_from(pixels * 3)
        .map_err(|_| ApiError::queued_images_full(state.max_queued_image_bytes))?;
    state
        .image_budget
        .clone()
        .try_acquire_many_owned(need)
        .map(Some)
        .map_err(|_| ApiError::queued_images_full(state.max_queued_image_bytes))
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Constant-time comparison of the bearer token with the key.
fn authorized(state: &AppState, headers: &HeaderMap) -> bool {
    let Some(key) = &state.api_key else {
        return true;
    };
    let Some(got) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    let (a, b) = (got.trim().as_bytes(), key.as_bytes());
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        diff |= usize::from(a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0));
    }
    diff == 0
}

fn check_auth(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    if authorized(state, headers) {
        Ok(())
    } else {
        state.shared.metrics.count(Outcome::Unauthorized);
        Err(ApiError::unauthorized())
    }
}

async fn fallback(req: Request) -> ApiError {
    ApiError::not_found(req.uri().path())
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    let shared = &state.shared;
    if shared.closing.load(Ordering::Relaxed) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "shutting_down"})),
        )
            .into_response();
    }
    match shared.state.load(Ordering::Acquire) {
        s if s == FAILED => {
            let err = shared.failure();
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"status": "failed", "error": err})),
            )
                .into_response()
        }
        s if s == DOWNLOADING => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "downloading", "progress": shared.download.json()})),
        )
            .into_response(),
        _ if shared.ready() => (
            StatusCode::OK,
            Json(json!({
                "status": "ok",
                "model": state.model_id,
                "dtype": shared.info().map(|i| i.dtype),
                "dtype_reason": shared.info().and_then(|i| i.dtype_reason),
                "tuning": shared.info().map(|i| i.tuning),
            })),
        )
            .into_response(),
        _ => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "loading"})),
        )
            .into_response(),
    }
}

async fn metrics(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = check_auth(&state, &headers) {
        return e.into_response();
    }
    let in_flight = state
        .capacity
        .saturating_sub(state.admission.available_permits());
    let mut body = state
        .shared
        .metrics
        .render(state.shared.ready(), state.capacity, in_flight);
    state.shared.download.render(&mut body);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// The model as /v1/models lists it, with `tasks`: the task markers it accepts (the 15 built-in ones,
/// then the model's own once it is loaded).
fn model_object(state: &AppState) -> Value {
    let mut tasks: Vec<&str> = Task::ALL.iter().map(|t| t.marker()).collect();
    let info = state.shared.info();
    if let Some(i) = &info {
        tasks.extend(i.tasks.markers());
    }
    json!({
        "id": state.model_id,
        "object": "model",
        "created": state.started,
        "owned_by": "florence2-wasm",
        "tasks": tasks,
    })
}

async fn models(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = check_auth(&state, &headers) {
        return e.into_response();
    }
    Json(json!({"object": "list", "data": [model_object(&state)]})).into_response()
}

async fn model(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    if let Err(e) = check_auth(&state, &headers) {
        return e.into_response();
    }
    if state.served().serves(&id) {
        Json(model_object(&state)).into_response()
    } else {
        ApiError::model_not_found(&id, &state.model_id).into_response()
    }
}

/// The body, refused with 413 beyond `limit` (from `Content-Length` before reading, else while reading).
async fn read_body(body: Body, headers: &HeaderMap, limit: usize) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::body_too_large(limit));
    }
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| ApiError::body_too_large(limit))
}

async fn chat(State(state): State<Arc<AppState>>, req: Request) -> Response {
    match chat_inner(&state, req).await {
        Ok(resp) => resp,
        Err(e) => {
            let outcome = match e.status {
                StatusCode::UNAUTHORIZED => None, // counted in check_auth
                StatusCode::PAYLOAD_TOO_LARGE => Some(Outcome::TooLarge),
                StatusCode::TOO_MANY_REQUESTS => Some(Outcome::QueueFull),
                StatusCode::SERVICE_UNAVAILABLE => Some(Outcome::Loading),
                s if s.is_client_error() => Some(Outcome::Invalid),
                _ => Some(Outcome::Error),
            };
            if let Some(o) = outcome {
                state.shared.metrics.count(o);
            }
            e.into_response()
        }
    }
}

async fn chat_inner(state: &Arc<AppState>, req: Request) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let log = parts.extensions.get::<Arc<LogEntry>>().cloned();
    check_auth(state, &parts.headers)?;
    let shared = &state.shared;
    let info = serving_info(shared)?;
    let bytes = read_body(body, &parts.headers, state.max_body_bytes).await?;
    let limits = RequestLimits {
        max_image_bytes: state.max_image_bytes,
        max_new_tokens: info.max_new_tokens,
        allow_remote_images: state.remote.is_some(),
    };
    let req = parse_chat_request(&bytes, &limits, &info.tasks, &state.served())?;
    drop(bytes);

    // Admission: a slot among `capacity`, held until the worker is done with the request.
    let permit = state
        .admission
        .clone()
        .try_acquire_owned()
        .map_err(|_| ApiError::queue_full(state.capacity))?;
    let admitted = Instant::now();
    // Armed from admission on: a client that leaves while its image is fetched or decoded (before the
    // worker can see its reply channel close) is counted too.
    let mut guard = DisconnectGuard {
        shared: shared.clone(),
        armed: true,
        queued: false,
    };

    let (stream, include_usage) = (req.stream, req.include_usage);
    let default_task = req.default_task.clone();
    let rx = match queue_job(state, req, admitted, permit).await {
        Ok(rx) => rx,
        // An answer (an error status) reaches the client: not a disconnect.
        Err(e) => {
            guard.armed = false;
            return Err(e);
        }
    };
    // From here on the worker counts the request's outcome.
    guard.queued = true;

    let id = format!("chatcmpl-{:016x}{:08x}", rand_u64(), unix_now() as u32);
    let meta = Meta {
        id,
        created: unix_now(),
        model: state.model_id.clone(),
        default_task,
        log,
    };
    if stream {
        Ok(sse_response(meta, rx, include_usage, guard))
    } else {
        completion_response(meta, rx, guard).await
    }
}

/// The model's info when the server takes requests: an error while it shuts down, after a failed
/// load, or while it loads.
fn serving_info(shared: &Shared) -> Result<super::engine::ModelInfo, ApiError> {
    if shared.closing.load(Ordering::Relaxed) {
        return Err(ApiError::shutting_down());
    }
    if shared.state.load(Ordering::Acquire) == FAILED {
        return Err(ApiError::unavailable(&shared.failure()));
    }
    shared
        .info()
        .filter(|_| shared.ready())
        .ok_or_else(ApiError::loading)
}

/// A non-streamed answer: the job's events awaited to its end (the guard armed while the client
/// waits, so that a client that leaves is counted).
async fn completion_response(
    meta: Meta,
    mut rx: UnboundedReceiver<Event>,
    mut guard: DisconnectGuard,
) -> Result<Response, ApiError> {
    loop {
        let event = rx.recv().await;
        guard.armed = false;
        match event {
            Some(Event::Step | Event::Text(_)) => guard.armed = true,
            Some(Event::Done(done)) => {
                return match *done {
                    Ok(answer) => {
                        meta.log_tokens(&answer);
                        Ok(Json(completion(&meta, &answer)).into_response())
                    }
                    Err(e) => Err(e),
                }
            }
            None => return Err(ApiError::shutting_down()),
        }
    }
}

/// An admitted request's image fetched (when remote) and decoded, then its job queued for the worker:
/// the receiver of its events.
async fn queue_job(
    state: &Arc<AppState>,
    req: ChatRequest,
    admitted: Instant,
    permit: OwnedSemaphorePermit,
) -> Result<UnboundedReceiver<Event>, ApiError> {
    let (req, image) = req.with_image(());
    let (image, permit) = image_bytes(state, image, permit).await?;
    let image_permit = reserve_image(state, &image)?;
    let rgb = decode(state, image).await?;
    let (tx, rx) = unbounded_channel();
    let job = Job {
        req: req.with_image(rgb).0,
        reply: tx,
        admitted,
        permit,
        image_permit,
    };
    let shared = &state.shared;
    let jobs = state
        .jobs
        .lock()
        .map_err(|_| ApiError::internal("job queue poisoned"))?;
    let sender = jobs.as_ref().ok_or_else(ApiError::shutting_down)?;
    shared.metrics.queued(1);
    if sender.send(job).is_err() {
        shared.metrics.queued(-1);
        return Err(ApiError::shutting_down());
    }
    Ok(rx)
}

/// The image's bytes: as sent, or fetched from its URL; with the admission permit, which travels
/// with the fetch.
async fn image_bytes(
    state: &AppState,
    image: ImageSource,
    permit: OwnedSemaphorePermit,
) -> Result<(Vec<u8>, OwnedSemaphorePermit), ApiError> {
    let (param, url) = match image {
        ImageSource::Inline(bytes) => return Ok((bytes, permit)),
        ImageSource::Remote { param, url } => (param, url),
    };
    let remote = state
        .remote
        .clone()
        .ok_or_else(|| ApiError::internal("remote images are off"))?;
    let t = Instant::now();
    // On a blocking thread, never on the GPU worker. The admission permit travels with the fetch, so a
    // client that leaves mid-fetch frees its slot only when the fetch (bounded by the time limit)
    // ends: at most `capacity` fetches at once.
    let (bytes, permit) =
        tokio::task::spawn_blocking(move || (fetch_image(&param, &url, &remote), permit))
            .await
            .map_err(|e| ApiError::internal(format!("image fetch task failed: {e}")))?;
    state
        .shared
        .metrics
        .observe(Phase::Fetch, t.elapsed().as_secs_f64());
    Ok((bytes?, permit))
}

/// The image decoded on a blocking thread, under the pixel limit.
async fn decode(state: &AppState, image: Vec<u8>) -> Result<RgbImage, ApiError> {
    let limits = state.image_limits;
    let t = Instant::now();
    let held = state.shared.clone();
    let rgb = tokio::task::spawn_blocking(move || {
        hold(&held, HoldPoint::Decode);
        decode_image(&image, &limits)
    })
    .await
    .map_err(|e| ApiError::internal(format!("image decoding task failed: {e}")))?
    .map_err(|e| ApiError::from_engine(&e))?;
    state
        .shared
        .metrics
        .observe(Phase::Decode, t.elapsed().as_secs_f64());
    Ok(rgb)
}

/// Counts a client that went away: dropped (by hyper, when the connection closes) while still armed.
/// A request dropped before it reached the worker's queue is also counted as cancelled (the worker,
/// which counts every queued request's outcome, never sees it).
struct DisconnectGuard {
    shared: Arc<Shared>,
    armed: bool,
    queued: bool,
}

impl Drop for DisconnectGuard {
    fn drop(&mut self) {
        if self.armed {
            self.shared.metrics.disconnect();
            if !self.queued {
                self.shared.metrics.count(Outcome::Cancelled);
            }
        }
    }
}

/// A request id: not a secret, only unique enough to tell responses apart in logs.
fn rand_u64() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

struct Meta {
    id: String,
    created: u64,
    model: String,
    /// The prompt had no task marker: `--default-task` ran.
    default_task: Option<DefaultTask>,
    /// The request's access-log line (`None` only outside the router's middleware).
    log: Option<Arc<LogEntry>>,
}

impl Meta {
    /// The generated tokens, for the access log.
    fn log_tokens(&self, a: &Answer) {
        if let Some(log) = &self.log {
            log.set_tokens(a.out.usage.generated_tokens);
        }
    }
}

fn finish_reason(a: &Answer) -> &'static str {
    match a.out.usage.stop {
        StopReason::Eos => "stop",
        StopReason::MaxTokens => "length",
    }
}

/// The usage block: the encoder's whole input (image features + prompt) counts as the prompt.
fn usage(a: &Answer) -> Value {
    let u = &a.out.usage;
    json!({
        "prompt_tokens": u.encoder_tokens,
        "completion_tokens": u.generated_tokens,
        "total_tokens": u.encoder_tokens + u.generated_tokens,
    })
}

/// `message.florence2_result`: the task, the post-processed result exactly as `florence2 run --json`
/// prints it (`{TASK: value}` with reference key names and float pixel coordinates), the raw generation
/// and its token ids, and the image size the coordinates refer to; `default_task` `{task, text_used}`
/// when the prompt had no task marker and `--default-task` ran in its place; `tiles` what a tiled run
/// (`florence2.tiles`) chose.
fn florence2_result(meta: &Meta, a: &Answer) -> Value {
    let o = &a.out;
    let mut v = json!({
        "task": o.marker,
        "result": o.result_json(),
        "generated_text": o.generated_text,
        "token_ids": o.token_ids,
        "image_size": [o.image_size.0, o.image_size.1],
    });
    if let Some(d) = &meta.default_task {
        v["default_task"] = json!({"task": d.marker, "text_used": d.text_used});
    }
    if let Some(t) = &a.tiles {
        v["tiles"] = t.clone();
    }
    v
}

fn completion(meta: &Meta, a: &Answer) -> Value {
    json!({
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [{
            "index": 0,
            "message": {
                "role": "assistant",
                "content": a.out.text,
                "refusal": null,
                "florence2_result": florence2_result(meta, a),
            },
            "logprobs": null,
            "finish_reason": finish_reason(a),
        }],
        "usage": usage(a),
    })
}

/// The part of the answer not streamed yet (all of it unless a greedy text task streamed a prefix).
fn remainder(a: &Answer) -> &str {
    a.out
        .text
        .strip_prefix(a.streamed.as_str())
        .unwrap_or(&a.out.text)
}

fn chunk(meta: &Meta, delta: Value, finish: Option<&str>) -> Value {
    json!({
        "id": meta.id,
        "object": "chat.completion.chunk",
        "created": meta.created,
        "model": meta.model,
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
    })
}

fn data(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

/// The SSE answer: a role chunk at once, an SSE comment per decode step, content deltas as a greedy text
/// answer grows, then the content chunk (the rest of the rendered answer: all of it for located answers
/// and beam search, whose post-processing needs the complete generation; plus `florence2_result`), the
/// finish chunk, a usage chunk when asked for, and `[DONE]`. A failure after the headers were sent is an
/// `{"error": ...}` event followed by `[DONE]`.
fn sse_response(
    meta: Meta,
    rx: UnboundedReceiver<Event>,
    include_usage: bool,
    guard: DisconnectGuard,
) -> Response {
    let first = data(&chunk(
        &meta,
        json!({"role": "assistant", "content": ""}),
        None,
    ));
    let events = stream::unfold(Some((rx, meta, guard)), move |st| async move {
        let (mut rx, meta, mut guard) = st?;
        let event = rx.recv().await;
        // Everything from here on is written in one go: the client did not leave mid-answer.
        guard.armed = false;
        let out: Vec<SseEvent> = match event {
            Some(Event::Step) => {
                guard.armed = true;
                return Some((
                    vec![SseEvent::default().comment("step")],
                    Some((rx, meta, guard)),
                ));
            }
            Some(Event::Text(delta)) => {
                guard.armed = true;
                let ev = data(&chunk(&meta, json!({ "content": delta }), None));
                return Some((vec![ev], Some((rx, meta, guard))));
            }
            Some(Event::Done(done)) => match *done {
                Ok(a) => answer_events(&meta, &a, include_usage),
                Err(e) => vec![data(&e.body())],
            },
            None => vec![data(&ApiError::shutting_down().body())],
        };
        let mut out = out;
        out.push(SseEvent::default().data("[DONE]"));
        Some((out, None))
    });
    let all = stream::iter(vec![first])
        .chain(events.flat_map(stream::iter))
        .map(Ok::<_, std::convert::Infallible>);
    sse(all)
}

/// A streamed answer's last chunks: the rest of its text with `florence2_result`, the finish reason,
/// and with `include_usage` the usage chunk.
fn answer_events(meta: &Meta, a: &Answer, include_usage: bool) -> Vec<SseEvent> {
    meta.log_tokens(a);
    let mut v = vec![
        data(&chunk(
            meta,
            json!({"content": remainder(a), "florence2_result": florence2_result(meta, a)}),
            None,
        )),
        data(&chunk(meta, json!({}), Some(finish_reason(a)))),
    ];
    if include_usage {
        v.push(data(&json!({
            "id": meta.id,
            "object": "chat.completion.chunk",
            "created": meta.created,
            "model": meta.model,
            "choices": [],
            "usage": usage(a),
        })));
    }
    v
}

fn sse<S>(s: S) -> Response
where
    S: Stream<Item = Result<SseEvent, std::convert::Infallible>> + Send + 'static,
{
    Sse::new(s)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(1)))
        .into_response()
}
