//! `load`'s per-file progress on the native engine: the files a hub download writes (their bytes as
//! they arrive, through the Hugging Face cache's [`ProgressObserver`]) and the files read from disk
//! (a directory, or what the cache already held), as `(status, file, loaded, total, cached)` calls of a
//! JS callback, which the package turns into the wasm's progress events.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};

use napi::threadsafe_function::{
    ErrorStrategy, ThreadSafeCallContext, ThreadsafeFunction, ThreadsafeFunctionCallMode,
};
use napi::JsFunction;

use crate::hub_cache::{DownloadProgress, ProgressObserver};

/// `(status, file, loaded, total, cached)`.
type FileCall = (&'static str, String, f64, f64, bool);

/// A download's bytes between two progress calls (besides each whole percent).
const STEP_BYTES: u64 = 8 << 20;

/// The JS `onFile` callback, callable from the load's pool thread.
#[derive(Clone)]
pub struct ProgressSink {
    f: ThreadsafeFunction<FileCall, ErrorStrategy::Fatal>,
    downloaded: Arc<Mutex<HashSet<String>>>,
}

impl ProgressSink {
    /// Wraps `f(status, file, loaded, total, cached)` (on the JS thread, as the load is set up).
    pub fn new(f: &JsFunction) -> napi::Result<Self> {
        let f = f.create_threadsafe_function(0, |ctx: ThreadSafeCallContext<FileCall>| {
            let (status, file, loaded, total, cached) = ctx.value;
            Ok(vec![
                ctx.env.create_string(status)?.into_unknown(),
                ctx.env.create_string(&file)?.into_unknown(),
                ctx.env.create_double(loaded)?.into_unknown(),
                ctx.env.create_double(total)?.into_unknown(),
                ctx.env.get_boolean(cached)?.into_unknown(),
            ])
        })?;
        Ok(ProgressSink {
            f,
            downloaded: Arc::default(),
        })
    }

    fn call(&self, status: &'static str, file: &str, loaded: u64, total: u64, cached: bool) {
        self.f.call(
            (status, file.to_owned(), loaded as f64, total as f64, cached),
            ThreadsafeFunctionCallMode::NonBlocking,
        );
    }

    /// The hub downloader's observer: `download` at a file's first bytes, `progress` every whole
    /// percent or [`STEP_BYTES`], `done` when it is complete and verified. Files are named as in the
    /// repository (`model.safetensors`), as the wasm names them.
    pub fn observer(&self) -> ProgressObserver {
        let sink = self.clone();
        let last = Arc::new(Mutex::new(std::collections::HashMap::<String, u64>::new()));
        ProgressObserver::new(move |p: &DownloadProgress| {
            let file = p.file.splitn(3, '/').nth(2).unwrap_or(&p.file).to_owned();
            let total = p.total.unwrap_or(0);
            let Ok(mut last) = last.lock() else { return };
            let first = !last.contains_key(&file);
            let prev = *last.get(&file).unwrap_or(&0);
            let pct = |b: u64| (b * 100).checked_div(total).unwrap_or(b / STEP_BYTES);
            if p.finished {
                if let Ok(mut d) = sink.downloaded.lock() {
                    d.insert(file.clone());
                }
                sink.call("done", &file, p.done, total.max(p.done), false);
            } else if first {
                sink.call("download", &file, p.done, total, false);
            } else if pct(p.done) != pct(prev) || p.done >= prev + STEP_BYTES {
                sink.call("progress", &file, p.done, total, false);
            } else {
                return;
            }
            last.insert(file, p.done);
        })
    }

    /// The last call (`end`), made whether the load succeeded or not: calls run first in, first out, so
    /// the JS side knows every file call has run before it settles the load's promise.
    pub fn end(&self) {
        self.call("end", "", 0, 0, false);
    }

    /// `done` (cached) for each file of `dir` the load read and no download wrote: the configs, the
    /// tokenizer and the weights files (called once the load has read them).
    pub fn local_files(&self, dir: &Path) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let downloaded = self
            .downloaded
            .lock()
            .map(|d| d.clone())
            .unwrap_or_default();
        let mut files: Vec<(String, u64)> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let read = name.ends_with(".json")
                    || name.ends_with(".safetensors")
                    || name.ends_with(".bin");
                let size = std::fs::metadata(e.path()).ok()?.len();
                (read && !downloaded.contains(&name)).then_some((name, size))
            })
            .collect();
        files.sort();
        for (name, size) in files {
            self.call("done", &name, size, size, true);
        }
    }
}
