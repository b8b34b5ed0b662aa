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
//! - `runTask(image, prompt, options)` mirrors `florence2 run` (src/bin/florence2.rs): prompt -> ids,
//!   image -> pixels ([`image`]), encode, generate (the model's generation_config.json: beam search with 3
//!   beams for Florence-2; `numBeams` overrides), decode with special tokens kept, post-process with
//!   the original image size, render.
//! - Calls are queued FIFO ([`queue`]); wasm-bindgen methods cannot hold `&self` across an await, so the
//!   state lives in an `Rc` that each call's future clones. A failed or aborted call leaves the model
//!   usable (GPU state is per call). Errors reject with a JS `Error` whose `name` is [`Error::name`]
//!   (`Florence2LoadError`, `Florence2PromptError`, `AbortError`, ...). No panic is reachable from JS
//!   by design; `console_error_panic_hook` only makes a bug's panic readable in the console.

mod fetch;
mod image;
mod js;
mod queue;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use js_sys::{Function, Promise};
use serde::Serialize;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use crate::error::{Error, Result};
use crate::gpu::{Gpu, GpuOptions, Tensor};
use crate::model::config::Florence2Config;
use crate::model::florence2::Florence2;
use crate::model::generate::{GenerateOptions, MAX_BEAMS};
use crate::postprocess::{post_process_generation, TaskResult};
use crate::processor::image::{ImageLimits, ImageProcessorConfig};
use crate::processor::prompt::{parse_task_prompt, Task};
use crate::processor::tokenizer::{Florence2Tokenizer, MAX_TOKENIZER_JSON_BYTES};
use crate::render::render;
use crate::weights::load::{CONFIG_FILE, INDEX_FILE, SINGLE_FILE};
use crate::weights::{detect_layout, Assembler, CheckpointIndex, LoadOptions};

pub use fetch::{Source, CACHE_NAME, PIECE_BYTES};
use js::{
    call2, check_signal, js_error, opt_bool, opt_fn, opt_get, opt_signal, opt_uint, perf_now, to_js,
};

/// The model card's `max_new_tokens` (also bounded by the decoder's position table).
pub const DEFAULT_MAX_NEW_TOKENS: usize = 1024;
/// Cap on the small JSON files (config, preprocessor/generation configs).
const MAX_JSON_BYTES: u64 = 4 << 20;
/// Largest safe integer of a JS number.
const MAX_SAFE: f64 = 9_007_199_254_740_991.0;

#[wasm_bindgen(typescript_custom_section)]
const TS_TYPES: &'static str = r#"
/** A Florence-2 task marker. */
export type TaskMarker =
  | "<CAPTION>" | "<DETAILED_CAPTION>" | "<MORE_DETAILED_CAPTION>" | "<OCR>" | "<OCR_WITH_REGION>"
  | "<OD>" | "<DENSE_REGION_CAPTION>" | "<REGION_PROPOSAL>" | "<CAPTION_TO_PHRASE_GROUNDING>"
  | "<REFERRING_EXPRESSION_SEGMENTATION>" | "<REGION_TO_SEGMENTATION>" | "<OPEN_VOCABULARY_DETECTION>"
  | "<REGION_TO_CATEGORY>" | "<REGION_TO_DESCRIPTION>" | "<REGION_TO_OCR>";

/** `[x1, y1, x2, y2]` in original-image pixels. */
export type Box = [number, number, number, number];
/** `[x1, y1, x2, y2, x3, y3, x4, y4]` in original-image pixels. */
export type QuadBox = [number, number, number, number, number, number, number, number];
/** A flat `[x, y, x, y, ...]` polygon in original-image pixels. */
export type Polygon = number[];

/** `<OCR_WITH_REGION>`. */
export interface OcrResult { quad_boxes: QuadBox[]; labels: string[]; }
/** `<OD>`, `<DENSE_REGION_CAPTION>`, `<REGION_PROPOSAL>`, `<CAPTION_TO_PHRASE_GROUNDING>`. */
export interface BoxesResult { bboxes: Box[]; labels: string[]; }
/** `<REFERRING_EXPRESSION_SEGMENTATION>`, `<REGION_TO_SEGMENTATION>`: polygons per instance. */
export interface PolygonsResult { polygons: Polygon[][]; labels: string[]; }
/** `<OPEN_VOCABULARY_DETECTION>`: boxes or polygons. */
export interface BoxesOrPolygonsResult {
  bboxes: Box[]; bboxes_labels: string[]; polygons: Polygon[][]; polygons_labels: string[];
}

/** The post-processed answer type of each task. */
export interface TaskResultTypes {
  "<CAPTION>": string;
  "<DETAILED_CAPTION>": string;
  "<MORE_DETAILED_CAPTION>": string;
  "<OCR>": string;
  "<OCR_WITH_REGION>": OcrResult;
  "<OD>": BoxesResult;
  "<DENSE_REGION_CAPTION>": BoxesResult;
  "<REGION_PROPOSAL>": BoxesResult;
  "<CAPTION_TO_PHRASE_GROUNDING>": BoxesResult;
  "<REFERRING_EXPRESSION_SEGMENTATION>": PolygonsResult;
  "<REGION_TO_SEGMENTATION>": PolygonsResult;
  "<OPEN_VOCABULARY_DETECTION>": BoxesOrPolygonsResult;
  "<REGION_TO_CATEGORY>": string;
  "<REGION_TO_DESCRIPTION>": string;
  "<REGION_TO_OCR>": string;
}

/** Exactly `post_process_generation`'s value: `{ [task]: answer }`, e.g. `{"<OD>": {bboxes, labels}}`. */
export type TaskResultOf<T extends TaskMarker> = { [K in T]: TaskResultTypes[K] };
/** The result of any task (discriminate on the output's `task`). */
export type TaskResult = { [T in TaskMarker]: TaskResultOf<T> }[TaskMarker];

/** Milliseconds spent per stage of one `runTask` call. */
export interface TaskTimings {
  /** Image read/decode + resize + normalise, prompt tokenization. */
  preprocess: number;
  /** Recording and submitting the vision tower, projector and encoder (the GPU runs them asynchronously). */
  encode: number;
  /** Decoding (greedy or beam search) until the last token was read back (includes waiting for the
   * encoder). */
  decode: number;
  total: number;
}

/** What `runTask` resolves to for task `T`. */
export interface TaskOutputOf<T extends TaskMarker> {
  task: T;
  /** A human-readable rendering of `result`. */
  text: string;
  result: TaskResultOf<T>;
  /** The generation decoded with special tokens kept. */
  generatedText: string;
  /** Generated ids, decoder start token first (as the reference's `generate`). */
  tokenIds: number[];
  timings: TaskTimings;
}
/** What `runTask` resolves to: a union discriminated by `task`. */
export type TaskOutput = { [T in TaskMarker]: TaskOutputOf<T> }[TaskMarker];

/** Any image `runTask` accepts. A `Blob` is an encoded PNG or JPEG file (decoded by the package itself). */
export type ImageInput =
  | ImageBitmap | ImageData | HTMLImageElement | HTMLCanvasElement | OffscreenCanvas | Blob;

/** A model directory URL (`config.json`, `tokenizer.json`, `model.safetensors` or
 * `model.safetensors.index.json` + shards, optional `preprocessor_config.json`, `generation_config.json`),
 * or an object mapping each file name to its URL. */
export type ModelSource = string | Record<string, string>;

/** A download progress event (shaped like transformers.js's). */
export interface ProgressEvent {
  status: "initiate" | "download" | "progress" | "done" | "ready";
  /** The model source (base URL). */
  name: string;
  /** The file this event is about (empty for `ready`). */
  file: string;
  /** Bytes received so far. */
  loaded: number;
  /** Content-Length (0 when unknown). */
  total: number;
  /** Percent, 0..100. */
  progress: number;
  /** True when the file came from the Cache API instead of the network. */
  cached: boolean;
}

export interface LoadLimits {
  /** Largest accepted `width * height` of an input image (default 50 000 000). */
  maxImagePixels?: number;
}

export interface LoadOptions {
  onProgress?: (event: ProgressEvent) => void;
  /** Read and write the Cache API (`caches.open("florence2-wasm-v1")`); default true. */
  cache?: boolean;
  signal?: AbortSignal;
  limits?: LoadLimits;
}

export interface RunTaskOptions {
  /** Default 1024 (also bounded by the model's position table). */
  maxNewTokens?: number;
  /** Beam width, 1..64; default: the model's `generation_config.json` (3 for Florence-2); 1 is greedy. */
  numBeams?: number;
  signal?: AbortSignal;
  /** Called once per generated token with its text (empty while a multi-byte character is incomplete)
   * and its id: as each token is chosen with greedy decoding (`numBeams: 1`), at the end with beam search
   * (whose tokens are only final then). */
  onToken?: (text: string, tokenId: number) => void;
}
"#;

/// Everything a loaded model needs to run a task.
struct Loaded {
    model: Florence2,
    tok: Florence2Tokenizer,
    pre: ImageProcessorConfig,
    gen: GenerateOptions,
}

struct Inner {
    /// `None` once disposed.
    loaded: RefCell<Option<Rc<Loaded>>>,
    lock: Rc<queue::FifoLock>,
    limits: ImageLimits,
    gpu: Arc<Gpu>,
}

/// A Florence-2 model on the GPU.
#[wasm_bindgen(js_name = Florence2)]
pub struct JsFlorence2 {
    inner: Rc<Inner>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Output<'a> {
    task: &'a str,
    text: String,
    result: BTreeMap<&'a str, &'a TaskResult>,
    generated_text: String,
    token_ids: Vec<u32>,
    timings: Timings,
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

    /// Run one task on one image; resolves to `{task, text, result, generatedText, tokenIds, timings}`.
    #[wasm_bindgen(js_name = runTask, unchecked_return_type = "Promise<TaskOutput>")]
    pub fn run_task(
        &self,
        #[wasm_bindgen(unchecked_param_type = "ImageInput")] image: JsValue,
        prompt: String,
        #[wasm_bindgen(unchecked_optional_param_type = "RunTaskOptions")] options: JsValue,
    ) -> Promise {
        let inner = self.inner.clone();
        // The model is taken now: a call made before `dispose()` completes.
        let loaded = self.inner.loaded.borrow().clone();
        future_to_promise(async move {
            let loaded = loaded.ok_or_else(|| js_error(&Error::Disposed))?;
            run_impl(inner, loaded, image, prompt, options)
                .await
                .map_err(|e| js_error(&e))
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
        let Some(loaded) = self.inner.loaded.borrow_mut().take() else {
            return;
        };
        drop(loaded);
        let inner = self.inner.clone();
        // Destroy the device after every call queued before this one has settled.
        wasm_bindgen_futures::spawn_local(async move {
            let _guard = inner.lock.acquire().await;
            inner.gpu.device.destroy();
        });
    }

    /// Whether `dispose()` was called.
    #[wasm_bindgen(getter)]
    pub fn disposed(&self) -> bool {
        self.inner.loaded.borrow().is_none()
    }

    /// The GPU adapter in use (name, backend, limits).
    #[wasm_bindgen(getter, js_name = adapterInfo)]
    pub fn adapter_info(&self) -> String {
        self.inner.gpu.describe()
    }
}

async fn load_impl(source: &JsValue, options: &JsValue) -> Result<JsFlorence2> {
    let source = Source::from_js(source)?;
    let use_cache = opt_bool(options, "cache")?.unwrap_or(true);
    let signal = opt_signal(options, "signal")?;
    let on_progress = opt_fn(options, "onProgress")?;
    let mut limits = ImageLimits::default();
    if let Some(l) = opt_get(options, "limits") {
        if let Some(p) = opt_uint(&l, "maxImagePixels", MAX_SAFE)? {
            limits.max_pixels = p;
        }
    }
    let f = fetch::Fetcher::new(source, use_cache, signal, on_progress).await?;
    f.check_abort("loading")?;
    let gpu = Gpu::new(GpuOptions::default()).await?;

    let cfg = f
        .read_small(CONFIG_FILE, true, MAX_JSON_BYTES)
        .await?
        .unwrap_or_default();
    let cfg = std::str::from_utf8(&cfg)
        .map_err(|e| Error::Config(format!("config.json is not UTF-8: {e}")))
        .and_then(Florence2Config::from_json_str)?;
    let tok = f
        .read_small("tokenizer.json", true, MAX_TOKENIZER_JSON_BYTES as u64)
        .await?
        .unwrap_or_default();
    let tok = Florence2Tokenizer::from_json_bytes(&tok)?;
    let pre = match f
        .read_small("preprocessor_config.json", false, MAX_JSON_BYTES)
        .await?
    {
        Some(b) => ImageProcessorConfig::from_json_bytes(&b)?,
        None => ImageProcessorConfig::default(),
    };
    let mut gen = GenerateOptions::from_config(&cfg, DEFAULT_MAX_NEW_TOKENS);
    if let Some(b) = f
        .read_small("generation_config.json", false, MAX_JSON_BYTES)
        .await?
    {
        gen = gen.with_generation_config(&b)?;
    }
    gen.check_ids(cfg.text.vocab_size)?;

    let mut asm = Assembler::new(&gpu, &cfg, LoadOptions::default());
    match f.read_small(INDEX_FILE, false, MAX_JSON_BYTES).await? {
        Some(idx) => {
            let index = CheckpointIndex::parse(&idx)?;
            asm.set_layout(detect_layout(index.weight_map.keys().map(String::as_str)));
            for shard in &index.shards {
                let names = index.names_in(shard).map(str::to_owned).collect();
                f.stream_safetensors(shard, &mut asm, names).await?;
            }
        }
        None => {
            f.stream_safetensors(SINGLE_FILE, &mut asm, Vec::new())
                .await?;
        }
    }
    let weights = asm.finish()?;
    let model = Florence2::new(&gpu, cfg, &weights)?;
    drop(weights);
    gpu.check()?;
    f.progress("ready", "", 0, 0, false);
    Ok(JsFlorence2 {
        inner: Rc::new(Inner {
            loaded: RefCell::new(Some(Rc::new(Loaded {
                model,
                tok,
                pre,
                gen,
            }))),
            lock: Rc::new(queue::FifoLock::default()),
            limits,
            gpu,
        }),
    })
}

/// Streams token texts to `onToken`: each call gets the text the new token adds to the decoded
/// sequence (empty while a multi-byte character is incomplete).
struct TokenStreamer<'a> {
    tok: &'a Florence2Tokenizer,
    f: Option<Function>,
    ids: RefCell<Vec<u32>>,
    emitted: RefCell<usize>,
}

impl TokenStreamer<'_> {
    fn push(&self, id: u32) {
        let Some(f) = &self.f else { return };
        let piece = {
            let mut ids = self.ids.borrow_mut();
            ids.push(id);
            let text = self.tok.decode(&ids, false).unwrap_or_default();
            let mut emitted = self.emitted.borrow_mut();
            if text.ends_with('\u{FFFD}') || text.len() < *emitted {
                String::new()
            } else {
                let piece = text.get(*emitted..).unwrap_or_default().to_owned();
                *emitted = text.len();
                piece
            }
        };
        call2(f, &JsValue::from_str(&piece), &JsValue::from(id));
    }
}

async fn run_impl(
    inner: Rc<Inner>,
    loaded: Rc<Loaded>,
    image: JsValue,
    prompt: String,
    options: JsValue,
) -> Result<JsValue> {
    let t0 = perf_now();
    let signal = opt_signal(&options, "signal")?;
    let abort = || check_signal(signal.as_ref(), "runTask");
    let max_new = opt_uint(&options, "maxNewTokens", MAX_SAFE)?
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
        .unwrap_or(DEFAULT_MAX_NEW_TOKENS);
    let num_beams = opt_uint(&options, "numBeams", MAX_BEAMS as f64)?;
    let on_token = opt_fn(&options, "onToken")?;
    let tp = parse_task_prompt(&prompt)?;
    abort()?;

    // One call at a time, in call order.
    let _guard = inner.lock.acquire().await;
    abort()?;
    let gpu = loaded.model.gpu().clone();
    gpu.check()?;

    let t1 = perf_now();
    let px = image::pixels_from_js(&image, &loaded.pre, &inner.limits, &abort).await?;
    let pre = &loaded.pre;
    let pixels = Tensor::from_f32(&gpu, &[1, 3, pre.height, pre.width], &px.values, "pixels")?;
    drop(px.values);
    let ids = loaded.tok.encode_prompt(&tp.encoder_text())?;
    let t2 = perf_now();
    abort()?;

    let enc = loaded.model.encode(&pixels, &ids)?;
    let t3 = perf_now();
    let mut gen = loaded.gen.clone();
    gen.max_new_tokens = max_new;
    if let Some(n) = num_beams {
        gen.num_beams = n as usize;
    }
    gen.validate()?;
    let cancel = || signal.as_ref().is_some_and(|s| s.aborted());
    let streamer = TokenStreamer {
        tok: &loaded.tok,
        f: on_token,
        ids: RefCell::new(Vec::new()),
        emitted: RefCell::new(0),
    };
    let token_ids = if gen.num_beams <= 1 {
        // Greedy: every token is final as soon as it is chosen, so it streams.
        loaded
            .model
            .generate_greedy_observed_async(&enc, &gen, &cancel, &|t| streamer.push(t))
            .await
    } else {
        // Beam search: the tokens are known when the search ends.
        let ids = loaded.model.generate_async(&enc, &gen, &cancel).await;
        if let Ok(ids) = &ids {
            for &t in ids.iter().skip(1) {
                streamer.push(t);
            }
        }
        ids
    }
    .map_err(|e| match e {
        Error::Cancelled => Error::Aborted("runTask: generation was aborted".into()),
        e => e,
    })?;
    drop(enc);
    gpu.check()?;
    let t4 = perf_now();

    let generated_text = loaded.tok.decode(&token_ids, false)?;
    let task = tp.task();
    let result = post_process_generation(&generated_text, task, px.size)?;
    let text = render(&result);
    let mut map = BTreeMap::new();
    map.insert(task.marker(), &result);
    let _ = t0;
    let out = Output {
        task: task.marker(),
        text,
        result: map,
        generated_text,
        token_ids,
        timings: Timings {
            preprocess: t2 - t1,
            encode: t3 - t2,
            decode: t4 - t3,
            total: perf_now() - t1,
        },
    };
    to_js(&out)
}

fn post_process_impl(text: &str, task: &str, width: u32, height: u32) -> Result<JsValue> {
    if width == 0 || height == 0 {
        return Err(Error::InvalidInput(format!(
            "image size must be positive, got {width}x{height}"
        )));
    }
    let task = match Task::from_name(task) {
        Some(t) => t,
        None => parse_task_prompt(task)?.task(),
    };
    let result = post_process_generation(text, task, (width, height))?;
    let mut map = BTreeMap::new();
    map.insert(task.marker(), &result);
    to_js(&map)
}
