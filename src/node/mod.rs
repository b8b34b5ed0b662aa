//! The Node.js native addon (feature `node`, native only): the same engine as the CLI behind the
//! `Florence2` API of the wasm facade. Every load and task runs on libuv's thread pool (napi
//! `AsyncTask`), so the event loop stays free; a Rust panic becomes a rejected promise.
//!
//! Errors reach JS as `Error`s whose message starts with `[Name] ` (a name of [`crate::error::ERROR_NAMES`]);
//! the package's `node.js` turns the prefix into `error.name`, as the browser build names them.

mod encoding;
mod estimate;
mod image;
mod numbers;
mod output;
pub mod probe;
mod progress;
mod source;
mod tokens;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use napi::bindgen_prelude::{AsyncTask, Buffer, Either3};
use napi::{Env, JsFunction, Task};
use napi_derive::napi;

use crate::estimate::DTypeRequest;
use crate::pipeline::{open, CancelToken, DeviceChoice, OpenOptions, Pipeline, TaskOptions, Tiles};
use crate::weights::DirFiles;
use crate::Error;

/// A library error as a JS error carrying its name.
fn js_error(e: &Error) -> napi::Error {
    named_error(e.name(), &e.to_string())
}

fn named_error(name: &str, message: &str) -> napi::Error {
    napi::Error::from_reason(format!("[{name}] {message}"))
}

/// Runs `f`, turning a panic into a named error (nothing unwinds into Node).
fn guarded<T>(what: &str, f: impl FnOnce() -> napi::Result<T>) -> napi::Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(named_error(
            "Florence2GpuError",
            &format!("{what}: internal error (panic): {msg}"),
        ))
    })
}

fn parse_device(s: Option<&str>) -> napi::Result<DeviceChoice> {
    match s.unwrap_or("auto") {
        "auto" => Ok(DeviceChoice::Auto),
        "gpu" => Ok(DeviceChoice::Gpu),
        "cpu" => Ok(DeviceChoice::Cpu),
        other => Err(js_error(&Error::InvalidInput(format!(
            "device {other:?}: expected \"auto\", \"gpu\" or \"cpu\" (\"wasm\" is chosen in JS)"
        )))),
    }
}

/// `load(source, options)`'s options (the JS side keeps `onProgress`, `signal` and `device: "wasm"`).
#[napi(object)]
pub struct NativeLoadOptions {
    pub device: Option<String>,
    /// "auto", "fp32" | "fp16" | "q8" | "q4", or a mix "vision=fp16,text=q4" (the JS side writes an
    /// object `{vision: "fp16", text: "q4"}` so); absent: fp16 (the library's default resident format).
    pub dtype: Option<String>,
}

/// A loaded model shared by its tasks: `dispose` drops the handle's reference, a running task keeps its
/// own until it ends.
pub struct Loaded {
    pipeline: Pipeline,
    /// The device and why it was chosen (`adapterInfo`).
    info: String,
    /// Why `dtype: "auto"` chose the resident format (None for a fixed format).
    dtype_reason: Option<String>,
}

pub struct LoadTask {
    source: String,
    device: DeviceChoice,
    dtype: DTypeRequest,
    progress: Option<progress::ProgressSink>,
}

impl Task for LoadTask {
    type Output = Arc<Loaded>;
    type JsValue = NativeModel;

    fn compute(&mut self) -> napi::Result<Arc<Loaded>> {
        let loaded = self.load();
        if let Some(p) = &self.progress {
            p.end();
        }
        loaded
    }

    fn resolve(&mut self, _env: Env, loaded: Arc<Loaded>) -> napi::Result<NativeModel> {
        Ok(NativeModel {
            loaded: Mutex::new(Some(loaded)),
            disposed: CancelToken::new(),
        })
    }
}

impl LoadTask {
    fn load(&self) -> napi::Result<Arc<Loaded>> {
        guarded("load", || {
            let observer = self.progress.as_ref().map(progress::ProgressSink::observer);
            let dir = source::model_dir(&self.source, observer).map_err(|e| js_error(&e))?;
            let files = DirFiles::new(&dir);
            let opts = OpenOptions {
                device: self.device,
                dtype: self.dtype,
                ..OpenOptions::default()
            };
            let opened =
                pollster::block_on(open(&files, &files, &opts)).map_err(|e| js_error(&e))?;
            // The files read from disk, once read (a download's files had their own events).
            if let Some(p) = &self.progress {
                p.local_files(&dir);
            }
            let info = format!("{} ({})", opened.gpu.describe(), opened.device.reason);
            opened.gpu.reset_peak_memory();
            Ok(Arc::new(Loaded {
                pipeline: opened.pipeline,
                info,
                dtype_reason: opened.dtype_reason,
            }))
        })
    }
}

/// Loads a model directory, a `file://` URL or a hub repository (`org/name[@revision]` or its URL,
/// through the CLI's Hugging Face cache) on the thread pool. `on_file(status, file, loaded, total,
/// cached)` is told each file downloaded (`download`, `progress`, `done`) or read from disk (`done`,
/// cached).
#[napi]
pub fn load(
    source: String,
    options: Option<NativeLoadOptions>,
    on_file: Option<JsFunction>,
) -> napi::Result<AsyncTask<LoadTask>> {
    let device = parse_device(options.as_ref().and_then(|o| o.device.as_deref()))?;
    let dtype = match options.as_ref().and_then(|o| o.dtype.as_deref()) {
        None => DTypeRequest::default(),
        Some(d) => d.parse::<DTypeRequest>().map_err(|e: Error| js_error(&e))?,
    };
    Ok(AsyncTask::new(LoadTask {
        source,
        device,
        dtype,
        progress: on_file
            .as_ref()
            .map(progress::ProgressSink::new)
            .transpose()?,
    }))
}

/// Cancels the tasks it is handed to (the JS side calls `cancel` on its `AbortSignal`'s abort).
#[napi]
pub struct CancelHandle {
    token: CancelToken,
}

#[napi]
impl CancelHandle {
    #[napi(constructor)]
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        CancelHandle {
            token: CancelToken::new(),
        }
    }

    #[napi]
    pub fn cancel(&self) {
        self.token.cancel();
    }
}

/// `runTask`'s decoding options (absent: the model's generation_config.json).
#[napi(object)]
pub struct NativeTaskOptions {
    pub max_new_tokens: Option<u32>,
    pub num_beams: Option<u32>,
    pub no_repeat_ngram_size: Option<u32>,
    /// Tiling: "auto", "off" (the default) or "RxC" (see `pipeline::tiles`).
    pub tiles: Option<String>,
}

impl From<&NativeTaskOptions> for TaskOptions {
    fn from(o: &NativeTaskOptions) -> Self {
        TaskOptions {
            max_new_tokens: o.max_new_tokens.map(|n| n as usize),
            num_beams: o.num_beams.map(|n| n as usize),
            no_repeat_ngram_size: o.no_repeat_ngram_size.map(|n| n as usize),
            ..Default::default()
        }
    }
}

/// A loaded model (`Florence2` in JS wraps it).
#[napi]
pub struct NativeModel {
    loaded: Mutex<Option<Arc<Loaded>>>,
    /// Cancelled by `dispose`: a running task stops at its next check.
    disposed: CancelToken,
}

impl NativeModel {
    fn loaded(&self) -> napi::Result<Arc<Loaded>> {
        let guard = self.loaded.lock().map_err(|_| js_error(&Error::Disposed))?;
        guard.clone().ok_or_else(|| js_error(&Error::Disposed))
    }

    /// A task on `input` for the thread pool.
    fn task(
        &self,
        input: output::Input,
        task: String,
        options: Option<NativeTaskOptions>,
        cancel: Option<&CancelHandle>,
        on_token: Option<JsFunction>,
    ) -> napi::Result<AsyncTask<RunTask>> {
        let tokens = on_token.as_ref().map(tokens::TokenSink::new).transpose()?;
        let tiles = match options.as_ref().and_then(|o| o.tiles.as_deref()) {
            Some(t) => t.parse::<Tiles>().map_err(|e| js_error(&e))?,
            None => Tiles::Off,
        };
        Ok(AsyncTask::new(RunTask {
            tiles,
            tokens,
            loaded: self.loaded()?,
            input,
            task,
            options: options.as_ref().map(TaskOptions::from).unwrap_or_default(),
            cancel: cancel.map(|c| c.token.clone()).unwrap_or_default(),
            disposed: self.disposed.clone(),
        }))
    }
}

#[napi]
impl NativeModel {
    /// Runs `task` (a marker such as `<CAPTION>`, with its text input if any) on an image: a file
    /// path, the bytes of a PNG/JPEG/WebP/GIF/BMP file, or `{data, width, height}` RGBA pixels.
    /// `on_token(text, id)` gets each token, then `(null, 0)` once all token calls have been queued.
    #[napi]
    pub fn run_task(
        &self,
        image: Either3<String, Buffer, image::RgbaPixels>,
        task: String,
        options: Option<NativeTaskOptions>,
        cancel: Option<&CancelHandle>,
        on_token: Option<JsFunction>,
    ) -> napi::Result<AsyncTask<RunTask>> {
        let input = output::Input::Image(image::Owned::from_js(image));
        self.task(input, task, options, cancel, on_token)
    }

    /// Encodes an image once (the inputs of `run_task`) for several `run_task_encoded` calls.
    #[napi]
    pub fn encode_image(
        &self,
        image: Either3<String, Buffer, image::RgbaPixels>,
    ) -> napi::Result<AsyncTask<encoding::EncodeTask>> {
        Ok(AsyncTask::new(encoding::EncodeTask {
            loaded: self.loaded()?,
            image: image::Owned::from_js(image),
        }))
    }

    /// `run_task` on an encoding of `encode_image` (this model's: another's is refused).
    #[napi]
    pub fn run_task_encoded(
        &self,
        encoded: &encoding::NativeEncoding,
        task: String,
        options: Option<NativeTaskOptions>,
        cancel: Option<&CancelHandle>,
        on_token: Option<JsFunction>,
    ) -> napi::Result<AsyncTask<RunTask>> {
        let input = output::Input::Encoded(encoded.get()?);
        self.task(input, task, options, cancel, on_token)
    }

    /// The device in use and why it was chosen.
    #[napi(getter)]
    pub fn adapter_info(&self) -> napi::Result<String> {
        Ok(self.loaded()?.info.clone())
    }

    /// Why `dtype: "auto"` chose the resident format; null for a fixed format.
    #[napi(getter)]
    pub fn dtype_reason(&self) -> napi::Result<Option<String>> {
        Ok(self.loaded()?.dtype_reason.clone())
    }

    /// Memory now (the `memory` object of a result, without a task).
    #[napi]
    pub fn memory(&self) -> napi::Result<serde_json::Value> {
        let l = self.loaded()?;
        Ok(numbers::js_numbers(output::memory_json(
            &l.pipeline,
            l.pipeline.memory(),
        )))
    }

    /// Frees the model once its running tasks end; those stop at their next check and reject with
    /// `Florence2DisposedError`. Later calls reject with the same error.
    #[napi]
    pub fn dispose(&self) {
        self.disposed.cancel();
        if let Ok(mut g) = self.loaded.lock() {
            g.take();
        }
    }
}

pub struct RunTask {
    tokens: Option<tokens::TokenSink>,
    loaded: Arc<Loaded>,
    input: output::Input,
    task: String,
    options: TaskOptions,
    tiles: Tiles,
    cancel: CancelToken,
    disposed: CancelToken,
}

impl Task for RunTask {
    type Output = serde_json::Value;
    type JsValue = napi::JsUnknown;

    fn compute(&mut self) -> napi::Result<serde_json::Value> {
        let out = guarded("runTask", || {
            let cancel = || self.cancel.is_cancelled() || self.disposed.is_cancelled();
            let sink = self.tokens.as_ref();
            let on_token = |text: &str, id: u32| {
                if let Some(s) = sink {
                    s.token(text, id);
                }
            };
            let r = output::run(
                &self.loaded.pipeline,
                &self.input,
                &self.task,
                (&self.options, self.tiles),
                &cancel,
                sink.map(|_| &on_token as &dyn Fn(&str, u32)),
            );
            r.map_err(|e| match e {
                Error::Cancelled if self.disposed.is_cancelled() => js_error(&Error::Disposed),
                Error::Cancelled => named_error("AbortError", "runTask: aborted"),
                e => js_error(&e),
            })
        });
        if let Some(s) = &self.tokens {
            s.end();
        }
        out
    }

    fn resolve(&mut self, env: Env, out: serde_json::Value) -> napi::Result<napi::JsUnknown> {
        env.to_js_value(&numbers::js_numbers(out))
    }
}
