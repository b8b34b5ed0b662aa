//! The JS facade (the npm package's API): a `Florence2` class.
//!
//! ```js
//! import init, { Florence2 } from "florence2-wasm";
//! await init();
//! const model = await Florence2.load("https://host/Florence-2-base-ft/", { onProgress });
//! const out = await model.runTask(imageBitmap, "<OD>");
//! if (out.task === "<OD>") out.result["<OD>"].bboxes;
//! ```
//!
//! - `Florence2.load(source, options)` streams every safetensors file from `fetch()` into GPU buffers
//!   ([`fetch`]), parses the JSON files, and builds the model (the same Rust model as natively).
//! - `runTask(image, prompt, options)` and `encodeImage(image)` are adapters over the library's
//!   [`Pipeline`] (the same sequence as `florence2 run`): this file only reads JS options and images
//!   ([`image`]) and writes the JS answer. `runTask` on an `EncodedImage` skips the vision tower.
//! - Calls are queued FIFO ([`queue`]); wasm-bindgen methods cannot hold `&self` across an await, so the
//!   state lives in an `Rc` that each call's future clones. A failed or aborted call leaves the model
//!   usable (GPU state is per call). Errors reject with a JS `Error` whose `name` is [`Error::name`]
//!   (`Florence2LoadError`, `Florence2PromptError`, `AbortError`, ...; the `Florence2ErrorName` union,
//!   [`errors`]). No panic is reachable from JS by design; `console_error_panic_hook` only makes a bug's
//!   panic readable in the console.
//! - GPU failures ([`recover`]): each request runs inside error scopes, so an allocation that fails
//!   rejects that request with `GpuOutOfMemoryError` and leaves the model usable; a lost device rejects
//!   the calls in flight with `DeviceLostError` and the model loads itself again (from the Cache API) on
//!   the next call or on `reload()`. `Florence2.isSupported()` probes WebGPU ([`support`]).

mod cache;
mod errors;
mod estimate;
mod fetch;
mod image;
mod js;
mod profile;
mod queue;
mod recover;
mod remote_files;
mod source;
mod support;
mod tasks;
mod tiles;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use js_sys::{Function, Promise, Reflect};
use serde::Serialize;
use wasm_bindgen::prelude::*;

use crate::error::{Error, Result};
use crate::estimate::DTypeRequest;
use crate::gpu::tune::{TuneOptions, Tuning};
use crate::gpu::{Device, DeviceOptions, MemReport};
use crate::model::generate::MAX_BEAMS;
use crate::pipeline::{
    cpu_device, decide_device, open_device_decided, open_on_observed, AdapterProbe, Backend,
    Callbacks, DeviceChoice, DeviceDecision, EncodedImage, OpenObserver, OpenOptions, Pipeline,
    PipelineOptions, Stopwatch, TaskInput, TaskOptions, Tiles,
};
use crate::postprocess::{MarkedTask, TaskResult};
use crate::processor::custom_tasks::CustomTasks;
use crate::processor::image::ImageLimits;
use crate::weights::{DTypePlan, LoadOptions};

pub use cache::CACHE_NAME;
pub use errors::is_florence2_error;
pub use fetch::{looks_like_html, PIECE_BYTES};
use js::{
    call2, check_signal, js_error, opt_bool, opt_fn, opt_get, opt_signal, opt_uint, promise, to_js,
};
pub use source::Source;

pub use crate::pipeline::DEFAULT_MAX_NEW_TOKENS;
/// Largest safe integer of a JS number.
const MAX_SAFE: f64 = 9_007_199_254_740_991.0;

#[wasm_bindgen(typescript_custom_section)]
const TS_TYPES: &str = include_str!("wasm/api.d.ts");

/// How a model was loaded: what `reload()` and the recovery from a lost device load again.
struct LoadArgs {
    source: Source,
    /// Task markers from the `tasks` option (the model's own are read from its files at each load).
    tasks: CustomTasks,
    use_cache: bool,
    /// `revalidate`: check cached files of branch revisions against the server (see `fetch`).
    revalidate: bool,
    limits: ImageLimits,
    tuning: Tuning,
    /// `dtype`: a format, or `auto` (chosen at each open, for the device opened).
    dtype: DTypeRequest,
    /// `adapterLimits`: what `auto` judges the device by, over the adapter's own limits.
    adapter_limits: estimate::LimitsOverride,
    /// `device`: auto (WebGPU on a hardware adapter, else the CPU backend), webgpu or cpu.
    device: DeviceChoice,
    /// `fetch`: what fetches the model files instead of the global `fetch` (Node's entry passes one that
    /// reads `file:` URLs).
    fetch: Option<Function>,
}

/// The state shared by a model's calls.
struct Inner {
    /// `None` once disposed; replaced by `reload()` and after a lost device.
    pipeline: RefCell<Option<Rc<Pipeline>>>,
    /// The model's live `EncodedImage`s by id (an `EncodedImage` removes itself on `dispose()` or when
    /// it is garbage-collected).
    images: Rc<RefCell<HashMap<u32, Rc<EncodedImage>>>>,
    /// Ids of `EncodedImage`s whose device was replaced by `reload()` or a recovery.
    stale_images: RefCell<HashSet<u32>>,
    lock: Rc<queue::FifoLock>,
    /// The current model's device (kept after `dispose()` for `adapterInfo`).
    gpu: RefCell<Arc<Device>>,
    /// The kernel tuner's table from the last load (`tuning` option).
    tuning_table: RefCell<String>,
    args: LoadArgs,
    auto_recover: bool,
    /// Test hook ([`recover`]): extra bytes the next request allocates with its activations.
    debug_extra_bytes: std::cell::Cell<u64>,
}

/// A Florence-2 model on the GPU.
#[wasm_bindgen(js_name = Florence2)]
pub struct JsFlorence2 {
    inner: Rc<Inner>,
}

/// An image encoded once (`model.encodeImage(image)`): its vision features stay on the GPU and every
/// `runTask` on it skips the vision tower. `dispose()` (or `using`) frees them.
#[wasm_bindgen(js_name = EncodedImage)]
pub struct JsEncodedImage {
    id: u32,
    size: (u32, u32),
    images: Rc<RefCell<HashMap<u32, Rc<EncodedImage>>>>,
}

/// Ids of `EncodedImage`s (wasm is single-threaded).
static NEXT_IMAGE_ID: AtomicU32 = AtomicU32::new(1);

/// The JS property an `EncodedImage` is recognised by.
const ENCODING_ID: &str = "encodingId";

#[wasm_bindgen(js_class = EncodedImage)]
impl JsEncodedImage {
    /// Identifies this encoding (unique in the page).
    #[wasm_bindgen(getter, js_name = encodingId)]
    pub fn encoding_id(&self) -> u32 {
        self.id
    }

    /// Width of the original image in pixels.
    #[wasm_bindgen(getter)]
    pub fn width(&self) -> u32 {
        self.size.0
    }

    /// Height of the original image in pixels.
    #[wasm_bindgen(getter)]
    pub fn height(&self) -> u32 {
        self.size.1
    }

    /// Free the GPU memory now; later `runTask` calls on it reject with `Florence2InputError`.
    pub fn dispose(&self) {
        self.images.borrow_mut().remove(&self.id);
    }

    /// Whether `dispose()` was called (or the model was disposed).
    #[wasm_bindgen(getter)]
    pub fn disposed(&self) -> bool {
        !self.images.borrow().contains_key(&self.id)
    }
}

impl Drop for JsEncodedImage {
    fn drop(&mut self) {
        if let Ok(mut m) = self.images.try_borrow_mut() {
            m.remove(&self.id);
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Output<'a> {
    task: &'a str,
    text: &'a str,
    result: BTreeMap<&'a str, &'a TaskResult>,
    generated_text: &'a str,
    token_ids: &'a [u32],
    timings: Timings,
    memory: MemoryInfo,
    #[serde(skip_serializing_if = "Option::is_none")]
    profile: Option<profile::RunProfile>,
    /// What a tiled run chose (only with the `tiles` option other than off).
    #[serde(skip_serializing_if = "Option::is_none")]
    tiles: Option<serde_json::Value>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MemoryInfo {
    dtype: String,
    /// "webgpu" or "cpu": the device the model runs on.
    device: &'static str,
    weights_bytes: u64,
    activations_bytes: u64,
    current_bytes: u64,
    peak_bytes: u64,
    peak_activations_bytes: u64,
    allocations: u64,
}

impl MemoryInfo {
    fn of(m: MemReport, dtype: DTypePlan, gpu: &Device) -> Self {
        MemoryInfo {
            dtype: dtype.label(),
            device: if gpu.is_host() { "cpu" } else { "webgpu" },
            weights_bytes: m.weights_bytes,
            activations_bytes: m.activations_bytes,
            current_bytes: m.current_bytes,
            peak_bytes: m.peak_bytes,
            peak_activations_bytes: m.peak_activations_bytes,
            allocations: m.allocations,
        }
    }
}

#[derive(Serialize)]
struct Timings {
    preprocess: f64,
    encode: f64,
    decode: f64,
    total: f64,
}

#[wasm_bindgen(js_class = Florence2)]
impl JsFlorence2 {
    /// Load a model: `source` is a base URL or `{fileName: url}`; see `LoadOptions`.
    pub async fn load(
        #[wasm_bindgen(unchecked_param_type = "ModelSource")] source: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "LoadOptions")] options: JsValue,
    ) -> Result<JsFlorence2, JsValue> {
        console_error_panic_hook::set_once();
        load_impl(&source, &options).await.map_err(|e| js_error(&e))
    }

    /// Run one task on an image or an `EncodedImage`; resolves to
    /// `{task, text, result, generatedText, tokenIds, timings}`.
    #[wasm_bindgen(js_name = runTask, unchecked_return_type = "Promise<TaskOutput>")]
    pub fn run_task(
        &self,
        #[wasm_bindgen(unchecked_param_type = "ImageInput | EncodedImage")] image: JsValue,
        prompt: String,
        #[wasm_bindgen(unchecked_optional_param_type = "RunTaskOptions")] options: JsValue,
    ) -> Promise {
        let inner = self.inner.clone();
        // The model is taken now: a call made before `dispose()` completes.
        let pipeline = self.inner.pipeline.borrow().clone();
        promise(async move {
            let pipeline = pipeline.ok_or(Error::Disposed)?;
            run_impl(inner, pipeline, image, prompt, options).await
        })
    }

    /// Encode an image once for several tasks: resolves to an `EncodedImage` to pass to `runTask`.
    #[wasm_bindgen(js_name = encodeImage, unchecked_return_type = "Promise<EncodedImage>")]
    pub fn encode_image(
        &self,
        #[wasm_bindgen(unchecked_param_type = "ImageInput")] image: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "EncodeImageOptions")] options: JsValue,
    ) -> Promise {
        let inner = self.inner.clone();
        let pipeline = self.inner.pipeline.borrow().clone();
        promise(async move {
            let pipeline = pipeline.ok_or(Error::Disposed)?;
            encode_impl(inner, pipeline, image, options)
                .await
                .map(JsValue::from)
        })
    }

    /// Post-process a raw generation (decoded with special tokens kept) for `task` (a marker such as
    /// `"<OD>"` or a whole prompt) and the image size: `{[task]: answer}`.
    #[wasm_bindgen(js_name = postProcess, unchecked_return_type = "TaskResult")]
    pub fn post_process(
        text: &str,
        task: &str,
        width: u32,
        height: u32,
    ) -> Result<JsValue, JsValue> {
        post_process_impl(text, task, width, height).map_err(|e| js_error(&e))
    }

    /// Release the GPU memory (the device is destroyed once the calls made before `dispose()` have
    /// settled). Later calls reject with `Florence2DisposedError`.
    pub fn dispose(&self) {
        let Some(pipeline) = self.inner.pipeline.borrow_mut().take() else {
            return;
        };
        drop(pipeline);
        self.inner.images.borrow_mut().clear();
        let inner = self.inner.clone();
        // Destroy the device after every call queued before this one has settled.
        wasm_bindgen_futures::spawn_local(async move {
            let _guard = inner.lock.acquire().await;
            inner.gpu.borrow().destroy();
        });
    }

    /// Whether `dispose()` was called.
    #[wasm_bindgen(getter)]
    pub fn disposed(&self) -> bool {
        self.inner.pipeline.borrow().is_none()
    }

    /// The kernel choices made at load: per op and shape class, each variant's time and the chosen one
    /// (empty with `tuning: "off"`).
    #[wasm_bindgen(getter, js_name = tuningTable)]
    pub fn tuning_table(&self) -> String {
        self.inner.tuning_table.borrow().clone()
    }

    /// GPU memory held by the model's tensors: `{dtype, weightsBytes, activationsBytes, currentBytes,
    /// peakBytes, peakActivationsBytes, allocations}`.
    #[wasm_bindgen(unchecked_return_type = "MemoryInfo")]
    pub fn memory(&self) -> Result<JsValue, JsValue> {
        let pipeline = self
            .inner
            .pipeline
            .borrow()
            .clone()
            .ok_or_else(|| js_error(&Error::Disposed))?;
        to_js(&MemoryInfo::of(
            pipeline.memory(),
            pipeline.weight_dtype(),
            pipeline.gpu(),
        ))
        .map_err(|e| js_error(&e))
    }

    /// The GPU adapter in use (name, backend, limits).
    #[wasm_bindgen(getter, js_name = adapterInfo)]
    pub fn adapter_info(&self) -> String {
        self.inner.gpu.borrow().describe()
    }
}

async fn load_impl(source: &JsValue, options: &JsValue) -> Result<JsFlorence2> {
    let source = Source::from_js(source, options)?;
    let use_cache = opt_bool(options, "cache")?.unwrap_or(true);
    let revalidate = opt_bool(options, "revalidate")?.unwrap_or(true);
    if opt_bool(options, "persist")?.unwrap_or(false) {
        // The browser's answer shows in `cacheInfo().storage.persisted`; a refusal is not an error.
        cache::request_persist().await;
    }
    let auto_recover = opt_bool(options, "autoRecover")?.unwrap_or(true);
    let signal = opt_signal(options, "signal")?;
    let on_progress = opt_fn(options, "onProgress")?;
    let tuning = match opt_get(options, "tuning") {
        None => Tuning::Auto,
        Some(v) => v
            .as_string()
            .ok_or_else(|| {
                Error::InvalidInput(
                    "option tuning must be \"auto\", \"off\" or \"exhaustive\"".into(),
                )
            })?
            .parse::<Tuning>()?,
    };
    let dtype = estimate::dtype_option(options)?;
    let adapter_limits = estimate::LimitsOverride::from_options(options)?;
    let device = estimate::device_option(options)?;
    let mut limits = ImageLimits::default();
    if let Some(l) = opt_get(options, "limits") {
        if let Some(p) = opt_uint(&l, "maxImagePixels", MAX_SAFE)? {
            limits.max_pixels = p;
        }
    }
    let mut args = LoadArgs {
        source,
        tasks: tasks::option_tasks(options)?,
        use_cache,
        revalidate,
        limits,
        tuning,
        dtype,
        adapter_limits,
        device,
        fetch: opt_fn(options, "fetch")?,
    };
    let (pipeline, tuning_table) = open_pipeline(&args, signal, on_progress).await?;
    // A reload after a lost device reuses the tuner's cached choices instead of timing everything again.
    if args.tuning == Tuning::Exhaustive {
        args.tuning = Tuning::Auto;
    }
    let gpu = pipeline.gpu().clone();
    Ok(JsFlorence2 {
        inner: Rc::new(Inner {
            pipeline: RefCell::new(Some(Rc::new(pipeline))),
            images: Rc::new(RefCell::new(HashMap::new())),
            stale_images: RefCell::new(HashSet::new()),
            lock: Rc::new(queue::FifoLock::default()),
            gpu: RefCell::new(gpu),
            tuning_table: RefCell::new(tuning_table),
            args,
            auto_recover,
            debug_extra_bytes: Default::default(),
        }),
    })
}

/// Fetch (or read from the cache) every file of `args.source`, open a device and build the model on it.
/// Weight uploads run inside error scopes: a failed allocation is a `GpuOutOfMemoryError`.
async fn open_pipeline(
    args: &LoadArgs,
    signal: Option<web_sys::AbortSignal>,
    on_progress: Option<Function>,
) -> Result<(Pipeline, String)> {
    let f = fetch::Fetcher::new(
        args.source.clone(),
        args.use_cache,
        args.fetch.clone(),
        signal,
        on_progress,
    )
    .await?
    .with_revalidate(args.revalidate);
    f.check_abort("loading")?;
    let (gpu, device) = open_js_device(args.device).await?;
    // The resident format: as asked, or what fits this device (estimated from the files' sizes and
    // headers before any weight is downloaded), then the load and the kernel tuning for this device at
    // the processor's image size (cached in the Cache API: a later load of the same package on the same
    // adapter times nothing; a failure only costs speed).
    let opts = OpenOptions {
        device: args.device,
        dtype: args.dtype,
        tuning: TuneOptions::new(args.tuning),
        limits: Some(estimate::limits_of(&gpu, args.adapter_limits)),
        pipeline: PipelineOptions {
            weights: LoadOptions::default(),
            tasks: args.tasks.clone(),
            limits: args.limits,
        },
        ..OpenOptions::default()
    };
    let files = remote_files::RemoteFiles { fetcher: &f };
    let opened = open_on_observed(gpu, device, &f, &files, &opts, &LoadEvents(&f)).await?;
    let tuning_table = match (&opened.tuning.failed, args.tuning) {
        (Some(e), _) => format!("tuning failed: {e}"),
        (None, Tuning::Off) => String::new(),
        (None, _) => opened.tuning.table(),
    };
    let pipeline = opened.pipeline;
    f.progress("ready", "", 0, 0, false);
    Ok((pipeline, tuning_table))
}

/// The device `choice` asks for, and why. Without `navigator.gpu` (Node.js, browsers without WebGPU)
/// `auto` does not ask wgpu at all; `gpu` fails with the reason WebGPU is missing.
async fn open_js_device(choice: DeviceChoice) -> Result<(Arc<Device>, DeviceDecision)> {
    match choice {
        DeviceChoice::Gpu => support::check_webgpu().await?,
        DeviceChoice::Auto if !support::webgpu_exposed() => {
            let why = AdapterProbe::Missing("WebGPU is not exposed".into());
            let decision = decide_device(DeviceChoice::Auto, &why);
            log::info!("device auto: {}", decision.reason);
            if decision.backend == Backend::Cpu {
                return Ok((cpu_device(), decision));
            }
        }
        _ => {}
    }
    open_device_decided(choice, DeviceOptions::default()).await
}

/// A load's progress events between [`open_on_observed`]'s steps.
struct LoadEvents<'a>(&'a fetch::Fetcher);

impl OpenObserver for LoadEvents<'_> {
    fn dtype_chosen(&self, reason: &str) {
        self.0.set_dtype_reason(reason.to_string());
    }

    fn tuning(&self) {
        self.0.progress("tuning", "", 0, 0, false);
    }
}

/// An `AbortSignal` as the pipeline's cancel check; a cancellation becomes `AbortError`.
fn aborted(e: Error, what: &str) -> Error {
    match e {
        Error::Cancelled => Error::Aborted(format!("{what}: aborted")),
        e => e,
    }
}

/// The `EncodedImage` `value` refers to, `None` when it is not one; an error when it was disposed or
/// belongs to another model.
fn encoded_of(inner: &Inner, value: &JsValue) -> Result<Option<Rc<EncodedImage>>> {
    if !value.is_object() {
        return Ok(None);
    }
    let id = match Reflect::get(value, &JsValue::from_str(ENCODING_ID)) {
        Ok(v) => match v.as_f64() {
            Some(id) => id,
            None => return Ok(None),
        },
        // The getter throws once the object was freed (`[Symbol.dispose]` / `free()`).
        Err(_) => return Err(Error::InvalidInput("the EncodedImage was disposed".into())),
    };
    if inner.stale_images.borrow().contains(&(id as u32)) {
        return Err(Error::DeviceLost(
            "this EncodedImage was encoded on a GPU device that has since been replaced (lost device \
             or reload()): encode the image again"
                .into(),
        ));
    }
    let found = inner.images.borrow().get(&(id as u32)).cloned();
    found.map(Some).ok_or_else(|| {
        Error::InvalidInput("the EncodedImage was disposed or was made by another model".into())
    })
}

async fn encode_impl(
    inner: Rc<Inner>,
    pipeline: Rc<Pipeline>,
    image: JsValue,
    options: JsValue,
) -> Result<JsEncodedImage> {
    let signal = opt_signal(&options, "signal")?;
    let abort = || check_signal(signal.as_ref(), "encodeImage");
    abort()?;
    let _guard = inner.lock.acquire().await;
    abort()?;
    // After a lost device: the model loaded again (or DeviceLostError).
    let pipeline = recover::current(&inner, pipeline).await?;
    let js = image::image_from_js(&image, pipeline.limits(), &abort).await?;
    abort()?;
    let encoded = recover::gpu_step(pipeline.gpu(), async {
        let _extra = recover::debug_allocation(&inner, pipeline.gpu())?;
        pipeline.encode_image_async(js.as_image()).await
    })
    .await?;
    let id = NEXT_IMAGE_ID.fetch_add(1, Ordering::Relaxed);
    let size = encoded.image_size();
    inner.images.borrow_mut().insert(id, Rc::new(encoded));
    Ok(JsEncodedImage {
        id,
        size,
        images: inner.images.clone(),
    })
}

async fn run_impl(
    inner: Rc<Inner>,
    pipeline: Rc<Pipeline>,
    image: JsValue,
    prompt: String,
    options: JsValue,
) -> Result<JsValue> {
    let signal = opt_signal(&options, "signal")?;
    let abort = || check_signal(signal.as_ref(), "runTask");
    let opts = task_options(&options)?;
    let on_token = opt_fn(&options, "onToken")?;
    let want_profile = opt_bool(&options, "profile")?.unwrap_or(false);
    let encoded = encoded_of(&inner, &image)?;
    let parsed = pipeline.tasks().parse(&prompt)?;
    let tiling = tiles::opt_tiles(&options, &parsed, encoded.is_some())?;
    abort()?;

    // One call at a time, in call order.
    let _guard = inner.lock.acquire().await;
    abort()?;
    // After a lost device: the model loaded again (or DeviceLostError).
    let pipeline = if encoded.is_some() {
        pipeline
    } else {
        recover::current(&inner, pipeline).await?
    };

    pipeline.gpu().reset_peak_memory();
    let t = Stopwatch::start();
    let js = match encoded {
        Some(_) => None,
        None => Some(image::image_from_js(&image, pipeline.limits(), &abort).await?),
    };
    let read_ms = t.ms();
    abort()?;
    let input = match (&encoded, &js) {
        (Some(e), _) => TaskInput::Encoded(e),
        (None, Some(js)) => TaskInput::Image(js.as_image()),
        (None, None) => return Err(Error::InvalidInput("no image".into())),
    };
    let cancel = || signal.as_ref().is_some_and(|s| s.aborted());
    let emit = |piece: &str, id: u32| {
        if let Some(f) = &on_token {
            call2(f, &JsValue::from_str(piece), &JsValue::from(id));
        }
    };
    let callbacks = Callbacks {
        on_stage: None,
        on_token: Some(&emit),
    };
    let session = profile::start(pipeline.gpu(), want_profile).await;
    // The GPU work runs inside error scopes (see `recover::gpu_step`).
    let out = recover::gpu_step(pipeline.gpu(), async {
        let _extra = recover::debug_allocation(&inner, pipeline.gpu())?;
        match (tiling, input) {
            (Tiles::Grid { .. } | Tiles::Auto, TaskInput::Image(img)) => {
                let t = pipeline
                    .run_tiled(img, &prompt, &opts, tiling, &cancel, &callbacks)
                    .await?;
                Ok((Some(t.tiles_json()), t.output))
            }
            _ => pipeline
                .run_task(input, &prompt, &opts, &cancel, &callbacks)
                .await
                .map(|o| (None, o)),
        }
    })
    .await;
    let profile = profile::finish(pipeline.gpu(), session, out.is_ok()).await;
    let (tiles, out) = out.map_err(|e| aborted(e, "runTask"))?;
    drop(js);

    output_js(&out, read_ms, &pipeline, profile, tiles)
}

/// `runTask`'s generation options: `maxNewTokens`, `numBeams`.
fn task_options(options: &JsValue) -> Result<TaskOptions> {
    Ok(TaskOptions {
        max_new_tokens: opt_uint(options, "maxNewTokens", MAX_SAFE)?
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        num_beams: opt_uint(options, "numBeams", MAX_BEAMS as f64)?.map(|n| n as usize),
        ..TaskOptions::default()
    })
}

/// `runTask`'s answer: the task's output with the image read's time (`read_ms`) counted in.
fn output_js(
    out: &crate::pipeline::TaskOutput,
    read_ms: f64,
    pipeline: &Pipeline,
    profile: Option<profile::RunProfile>,
    tiles: Option<serde_json::Value>,
) -> Result<JsValue> {
    let t = &out.timings;
    let mut result = BTreeMap::new();
    result.insert(out.marker.as_str(), &out.result);
    to_js(&Output {
        task: &out.marker,
        text: &out.text,
        result,
        generated_text: &out.generated_text,
        token_ids: &out.token_ids,
        timings: Timings {
            preprocess: read_ms + t.preprocess_ms,
            encode: t.vision_ms + t.encoder_ms,
            decode: t.decode_ms,
            total: read_ms + t.total_ms(),
        },
        memory: MemoryInfo::of(out.memory, pipeline.weight_dtype(), pipeline.gpu()),
        profile,
        tiles,
    })
}

fn post_process_impl(text: &str, task: &str, width: u32, height: u32) -> Result<JsValue> {
    if width == 0 || height == 0 {
        return Err(Error::InvalidInput(format!(
            "image size must be positive, got {width}x{height}"
        )));
    }
    let task = MarkedTask::parse(task)?;
    let result = task.post_process(text, (width, height))?;
    let mut map = BTreeMap::new();
    map.insert(task.marker.as_str(), &result);
    to_js(&map)
}
