//! Model files over `fetch()`: small JSON files read whole (with a size cap), weights files streamed
//! from `response.body` chunk by chunk into a [`StreamLoader`] (safetensors) or a [`TorchStreamLoader`]
//! (PyTorch `.bin`: zip or legacy pickle format), so the whole file is never in wasm or JS memory;
//! optional Cache API storage ([`crate::wasm::cache`]), abort signals, and transformers.js-shaped
//! progress events.
//!
//! Events per file: `initiate` once the file is known to exist (an absent optional file has none),
//! `download` when its body starts, `progress` per chunk, `done`; the loader sends `ready` at the end.
//!
//! Missing files, whatever the server does with them: an optional or probed file (indexes, single
//! weights files, generation and preprocessor configs) is absent when the server answers 404/410, or
//! answers with an HTML page (by `Content-Type: text/html`, or by its first bytes: a single-page-app
//! server such as Vite's dev server answers every unknown path with `200` + `index.html`). A required
//! file that comes back as HTML fails with an error that says so.
//!
//! Cache (on by default): a file is looked up in the package's bucket first; a hit whose meta record
//! says the file is complete never touches the network (events say `cached: true`), a negative record
//! (an optional file the server did not have) answers "absent" without a request. A downloaded response
//! is stored with `cache.put(url, response.clone())` while the original body is streamed (the browser
//! tees the body), and its meta record (byte count, ETag) is written once the whole body was read and
//! checked; on a failed read both are deleted. A cached body of the wrong length (a corrupted entry)
//! is deleted and fetched again. Once any file came from the cache, a network failure on an optional file
//! counts as absent (so a cached model loads offline). `blob:` and `data:` URLs are never cached. With
//! the cache off it is neither read nor written.
//!
//! Revalidation (the `revalidate` option, on by default): a cached file whose URL names a branch or tag
//! of a hub repository (`.../resolve/REV/...` where REV is not a 40-hex commit, which never changes) is
//! checked with a `HEAD` request (`cache: "no-cache"`, no custom header, so no CORS preflight) before it
//! is used: when the server's `ETag` (else `Last-Modified`, else `Content-Length`) differs from the
//! stored record's, the cached copy is dropped and the file downloaded again (its events then say
//! `cached: false`). A failed or unanswered `HEAD` (offline) keeps the cached copy.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use js_sys::{Function, Object, Promise, Reflect, Uint8Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use web_sys::{
    AbortController, AbortSignal, Cache, ReadableStreamDefaultReader, RequestInit, Response,
};

use crate::config::Florence2Config;
use crate::error::{Error, Result};
use crate::gpu::Device;
use crate::hub::{revision_may_change, Validators};
use crate::wasm::cache::{self, cacheable, Meta};
use crate::wasm::js::{call1, check_signal, describe_js, read_error, set};
use crate::wasm::source::Source;
use crate::weights::load::load_weights;
use crate::weights::torch_load::is_torch_file;
use crate::weights::{
    Assembler, LoadOptions, ModelSource, StreamLoader, TorchStreamLoader, Weights,
};

/// Bytes copied from a JS chunk into wasm memory at a time (a `fetch` chunk larger than this is split).
pub const PIECE_BYTES: usize = 1 << 20;

#[wasm_bindgen]
extern "C" {
    /// The global `fetch` (looked up at call time, so a page's wrapper of `globalThis.fetch` is used).
    #[wasm_bindgen(js_name = fetch)]
    pub(crate) fn global_fetch(input: &str, init: &RequestInit) -> Promise;
}

/// Whether bytes are the start of an HTML page rather than a model file: after an optional UTF-8 BOM and
/// whitespace, one of the openings an HTML document starts with. A safetensors file starts with its
/// header length as a little-endian u64 whose high bytes are zero, so it can never match these
/// (5+ printable characters); a JSON file starts with `{`.
pub fn looks_like_html(bytes: &[u8]) -> bool {
    let b = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let b = &b[start..];
    [
        "<!doctype html",
        "<html",
        "<head",
        "<body",
        "<!--",
        "<script",
        "<meta",
    ]
    .iter()
    .any(|p| {
        b.len() >= p.len()
            && b.get(..p.len())
                .is_some_and(|h| h.eq_ignore_ascii_case(p.as_bytes()))
    })
}

fn html_error(file: &str, url: &str, why: &str) -> Error {
    Error::FileRead {
        file: file.to_owned(),
        msg: format!(
            "{url} answered with an HTML page ({why}) instead of the file: the server most likely has \
             no such file and serves a fallback page (single-page-app servers such as Vite's dev server \
             do this); check the model URL and that the file is deployed"
        ),
    }
}

/// One opened file body.
struct Body {
    url: String,
    reader: Option<ReadableStreamDefaultReader>,
    /// Expected byte count: the meta record's for a cached body, else Content-Length (when the body is
    /// not content-encoded).
    total: Option<u64>,
    cached: bool,
    /// The pending `cache.put` of a downloaded response.
    put: Option<Promise>,
    /// Aborts this file's fetch (so a failed read also stops the cache's copy of the body).
    controller: Option<AbortController>,
    etag: Option<String>,
    last_modified: Option<String>,
}

/// How reading a body ended.
enum Pumped {
    Done(u64),
    /// The body starts like an HTML page.
    Html,
}

/// Fetches a model's files.
pub struct Fetcher {
    pub source: Source,
    name: String,
    cache: Option<Cache>,
    /// The `fetch` option: called as `fetch(url, init)` instead of the global `fetch`.
    fetch: Option<Function>,
    signal: Option<AbortSignal>,
    on_progress: Option<Function>,
    /// Some file came from the cache: a network failure on an optional file is then not fatal.
    any_cached: Cell<bool>,
    /// URLs whose cached copy failed to read: fetched from the network from now on.
    refetch: RefCell<BTreeSet<String>>,
    /// (loaded, total) bytes per file so far, for the aggregate `progress_total` events.
    files: RefCell<BTreeMap<String, (u64, u64)>>,
    /// Check cached files of branch revisions against the server before using them.
    revalidate: bool,
    /// Why `dtype: "auto"` chose the resident format (empty for an explicit one), for the `dtype`
    /// progress event sent when the weights start.
    dtype_reason: RefCell<String>,
}

/// What a `HEAD` says about a cached copy.
#[derive(Debug, PartialEq, Eq)]
enum Freshness {
    Fresh,
    Stale,
    /// No answer or nothing to compare: the cached copy is used.
    Unknown,
}

impl Fetcher {
    /// `use_cache`: read from and write to the Cache API; `fetch`: replaces the global `fetch`.
    pub async fn new(
        source: Source,
        use_cache: bool,
        fetch: Option<Function>,
        signal: Option<AbortSignal>,
        on_progress: Option<Function>,
    ) -> Result<Fetcher> {
        let cache = if use_cache {
            match cache::open_cache().await {
                Ok(c) => c,
                Err(e) => {
                    web_sys::console::warn_1(&JsValue::from_str(&format!(
                        "florence2-wasm: {e}; not caching"
                    )));
                    None
                }
            }
        } else {
            None
        };
        Ok(Fetcher {
            name: source.name(),
            source,
            cache,
            fetch,
            signal,
            on_progress,
            any_cached: Cell::new(false),
            refetch: RefCell::new(BTreeSet::new()),
            files: RefCell::new(BTreeMap::new()),
            revalidate: true,
            dtype_reason: RefCell::new(String::new()),
        })
    }

    /// Whether cached files of branch revisions are checked against the server (default on).
    pub fn with_revalidate(mut self, on: bool) -> Self {
        self.revalidate = on;
        self
    }

    /// `HEAD url`: whether the cached copy described by `meta` still matches the server's file.
    async fn freshness(&self, url: &str, meta: &Meta) -> Freshness {
        let init = RequestInit::new();
        init.set_method("HEAD");
        init.set_cache(web_sys::RequestCache::NoCache);
        init.set_signal(self.signal.as_ref());
        let Ok(resp) = JsFuture::from(self.fetch_url(url, &init)).await else {
            return Freshness::Unknown;
        };
        let Ok(resp) = resp.dyn_into::<Response>() else {
            return Freshness::Unknown;
        };
        if !resp.ok() {
            // Gone (404/410) or failing: the load decides with the cached copy; a later GET reports it.
            return Freshness::Unknown;
        }
        let headers = resp.headers();
        let header = |k: &str| headers.get(k).ok().flatten();
        let encoded = header("content-encoding")
            .is_some_and(|e| !e.trim().is_empty() && !e.eq_ignore_ascii_case("identity"));
        let length = header("content-length")
            .filter(|_| !encoded)
            .and_then(|s| s.trim().parse::<u64>().ok());
        let stored = Validators {
            etag: meta.etag.as_deref(),
            last_modified: meta.last_modified.as_deref(),
            length: Some(meta.bytes),
        };
        let (etag, last_modified) = (header("etag"), header("last-modified"));
        let now = Validators {
            etag: etag.as_deref(),
            last_modified: last_modified.as_deref(),
            length,
        };
        match stored.same_file(&now) {
            Some(true) => Freshness::Fresh,
            Some(false) => Freshness::Stale,
            None => Freshness::Unknown,
        }
    }

    /// `fetch(url, init)`: the `fetch` option's, else the global one. A synchronous throw or a value that
    /// is not a promise settles the promise the same way.
    pub(crate) fn fetch_url(&self, url: &str, init: &RequestInit) -> Promise {
        match &self.fetch {
            None => global_fetch(url, init),
            Some(f) => match f.call2(&JsValue::UNDEFINED, &JsValue::from_str(url), init) {
                Ok(v) => Promise::resolve(&v),
                Err(e) => Promise::reject(&e),
            },
        }
    }

    pub fn check_abort(&self, what: &str) -> Result<()> {
        check_signal(self.signal.as_ref(), what)
    }

    /// Emit a progress event `{status, name, file, loaded, total, progress, cached}`, then (for a file's
    /// initiate/download/progress/done) the aggregate over the files seen so far, as transformers.js
    /// sends it: `{status: "progress_total", name, file: "", loaded, total, progress, cached, files}` with
    /// `files` = `{file: {loaded, total}}` and loaded/total their sums.
    pub fn progress(&self, status: &str, file: &str, loaded: u64, total: u64, cached: bool) {
        let Some(f) = &self.on_progress else { return };
        call1(f, &self.event(status, file, loaded, total, cached));
        if !matches!(status, "initiate" | "download" | "progress" | "done") {
            return;
        }
        let (sum_loaded, sum_total, per_file) = {
            let mut files = self.files.borrow_mut();
            let e = files.entry(file.to_owned()).or_insert((0, 0));
            *e = (loaded, total.max(e.1));
            if status == "done" {
                e.1 = loaded;
            }
            let per_file = Object::new();
            for (name, &(l, t)) in files.iter() {
                let o = Object::new();
                set(&o, "loaded", &JsValue::from_f64(l as f64));
                set(&o, "total", &JsValue::from_f64(t as f64));
                set(&per_file, name, &o);
            }
            let l: u64 = files.values().map(|v| v.0).sum();
            let t: u64 = files.values().map(|v| v.1).sum();
            (l, t, per_file)
        };
        let ev = self.event(
            "progress_total",
            "",
            sum_loaded,
            sum_total,
            self.any_cached.get(),
        );
        set(&ev, "files", &per_file);
        call1(f, &ev);
    }

    /// Why `dtype: "auto"` chose the format the weights load in: the `reason` of the `dtype` event.
    pub fn set_dtype_reason(&self, reason: String) {
        *self.dtype_reason.borrow_mut() = reason;
    }

    /// `{status: "dtype", dtype, reason, ...}`: the resident format the load uses, and why `auto` chose it
    /// (empty for an explicit format).
    fn dtype_event(&self, dtype: &str, reason: &str) {
        if let Some(f) = &self.on_progress {
            let ev = self.event("dtype", "", 0, 0, false);
            set(&ev, "dtype", &JsValue::from_str(dtype));
            set(&ev, "reason", &JsValue::from_str(reason));
            call1(f, &ev);
        }
    }

    /// A cache write of `file` (at `url`) failed: remember it for `cacheInfo()` and tell `onProgress`
    /// (`{status: "cache_error", file, message, ...}`); the load goes on without caching that file.
    fn cache_failed(&self, file: &str, url: &str, message: &str) {
        cache::record_failure(url, message);
        if let Some(f) = &self.on_progress {
            let ev = self.event("cache_error", file, 0, 0, false);
            set(&ev, "message", &JsValue::from_str(message));
            call1(f, &ev);
        }
    }

    /// One progress event object.
    fn event(&self, status: &str, file: &str, loaded: u64, total: u64, cached: bool) -> Object {
        let ev = Object::new();
        set(&ev, "status", &JsValue::from_str(status));
        set(&ev, "name", &JsValue::from_str(&self.name));
        set(&ev, "file", &JsValue::from_str(file));
        set(&ev, "loaded", &JsValue::from_f64(loaded as f64));
        set(&ev, "total", &JsValue::from_f64(total as f64));
        let pct = match (status, total) {
            ("done" | "ready", _) => 100.0,
            (_, 0) => 0.0,
            _ => (loaded as f64 / total as f64 * 100.0).min(100.0),
        };
        set(&ev, "progress", &JsValue::from_f64(pct));
        set(&ev, "cached", &JsValue::from_bool(cached));
        ev
    }

    /// The cache, when on and `url` can be a key.
    fn cache_for(&self, url: &str) -> Option<&Cache> {
        self.cache.as_ref().filter(|_| cacheable(url))
    }

    /// Remember that the server has no `url` (optional files only).
    async fn record_absent(&self, url: &str) {
        if let Some(c) = self.cache_for(url) {
            let meta = Meta {
                url: url.to_owned(),
                absent: true,
                stored: cache::now(),
                ..Meta::default()
            };
            if let Err(e) = cache::write_meta(c, &meta).await {
                web_sys::console::warn_1(&JsValue::from_str(&format!("florence2-wasm: {e}")));
            }
        }
    }

    /// A cached copy of `url` and its byte count: `Some(None)` for a remembered absent optional file,
    /// `None` when it must come from the network.
    async fn open_cached(&self, url: &str, required: bool) -> Option<Option<(Response, Meta)>> {
        let c = self.cache_for(url)?;
        if self.refetch.borrow().contains(url) {
            return None;
        }
        let meta = cache::read_meta(c, url).await;
        match meta {
            Some(m) if m.absent && !required => {
                self.any_cached.set(true);
                Some(None)
            }
            Some(m) if !m.absent => {
                let hit = JsFuture::from(c.match_with_str(url)).await.ok()?;
                match hit.dyn_into::<Response>() {
                    Ok(r) => {
                        self.any_cached.set(true);
                        Some(Some((r, m)))
                    }
                    Err(_) => {
                        // A record without its body: drop the record, fetch again.
                        cache::forget(c, url).await;
                        None
                    }
                }
            }
            _ => {
                // No record (a download that never completed, or an absent record for a file that is
                // required now): whatever body there is, is not trusted.
                cache::forget(c, url).await;
                None
            }
        }
    }

    /// Open `file`: from the cache when enabled and present, else over the network. `Ok(None)` for an
    /// optional file that is absent (not listed by the source, 404/410, an HTML answer, remembered as
    /// absent, or unreachable while the model is served from the cache).
    async fn open(&self, file: &str, required: bool) -> Result<Option<Body>> {
        let Some(url) = self.source.url(file) else {
            return if required {
                Err(Error::FileRead {
                    file: file.to_owned(),
                    msg: "the source does not list this file".into(),
                })
            } else {
                Ok(None)
            };
        };
        self.check_abort(&format!("loading {file}"))?;
        let cached = self.open_fresh(&url, required).await;
        self.check_abort(&format!("loading {file}"))?;
        let got = match cached {
            Some(None) => return Ok(None),
            Some(Some((r, meta))) => Some((r, Some(meta.bytes), None, None)),
            None => self
                .open_network(file, &url, required)
                .await?
                .map(|(r, put, controller)| (r, None, put, controller)),
        };
        let Some((resp, meta_total, put, controller)) = got else {
            return Ok(None);
        };
        Self::body(file, url, resp, meta_total, put, controller).map(Some)
    }

    /// [`Fetcher::open_cached`], with a cached entry whose revision may have moved checked against the
    /// server first (when `revalidate`) and forgotten when it is stale.
    async fn open_fresh(&self, url: &str, required: bool) -> Option<Option<(Response, Meta)>> {
        let cached = self.open_cached(url, required).await;
        if let Some(Some((_, meta))) = &cached {
            if self.revalidate
                && revision_may_change(url)
                && self.freshness(url, meta).await == Freshness::Stale
            {
                if let Some(c) = self.cache_for(url) {
                    cache::forget(c, url).await;
                }
                return None;
            }
        }
        cached
    }

    /// `file` over the network: the response, its cache write (when caching) and the controller that
    /// aborts it. `Ok(None)` for an optional file that is absent or, offline with a cached model,
    /// unreachable.
    async fn open_network(
        &self,
        file: &str,
        url: &str,
        required: bool,
    ) -> Result<Option<(Response, Option<Promise>, Option<AbortController>)>> {
        let controller = AbortController::new().ok();
        let init = RequestInit::new();
        let signal = match (&self.signal, &controller) {
            (Some(user), Some(c)) => {
                let both = js_sys::Array::of2(user, &c.signal());
                Some(AbortSignal::any(&both))
            }
            (Some(user), None) => Some(user.clone()),
            (None, Some(c)) => Some(c.signal()),
            (None, None) => None,
        };
        init.set_signal(signal.as_ref());
        let resp = match JsFuture::from(self.fetch_url(url, &init)).await {
            Ok(r) => r,
            Err(e) => {
                let err = read_error(file, &e);
                if !required && self.any_cached.get() && !matches!(err, Error::Aborted(_)) {
                    // Offline with a cached model: an optional file we know nothing about.
                    web_sys::console::warn_1(&JsValue::from_str(&format!(
                        "florence2-wasm: {err}; loading without it"
                    )));
                    return Ok(None);
                }
                return Err(err);
            }
        };
        let resp: Response = resp.dyn_into().map_err(|_| Error::FileRead {
            file: file.to_owned(),
            msg: "fetch did not return a Response".into(),
        })?;
        if !self.usable(file, url, &resp, required).await? {
            return Ok(None);
        }
        let put = match self.cache_for(url) {
            Some(c) => resp.clone().ok().map(|copy| c.put_with_str(url, &copy)),
            None => None,
        };
        Ok(Some((resp, put, controller)))
    }

    /// Whether a network response holds the file: an error status or an HTML page fails a required
    /// file and makes an optional one absent (404/410 and HTML remembered as absent; a 5xx while a
    /// cached model is served only warns).
    async fn usable(&self, file: &str, url: &str, resp: &Response, required: bool) -> Result<bool> {
        if !resp.ok() {
            let status = resp.status();
            if !required && matches!(status, 404 | 410) {
                self.record_absent(url).await;
                return Ok(false);
            }
            if !required && self.any_cached.get() && status >= 500 {
                web_sys::console::warn_1(&JsValue::from_str(&format!(
                    "florence2-wasm: HTTP {status} for {url}; loading without {file}"
                )));
                return Ok(false);
            }
            return Err(Error::FileRead {
                file: file.to_owned(),
                msg: format!("HTTP {} {} from {url}", status, resp.status_text()),
            });
        }
        if crate::wasm::js::is_html(resp) {
            if let Some(b) = resp.body() {
                let _ = b.cancel();
            }
            if required {
                return Err(html_error(file, url, "Content-Type: text/html"));
            }
            self.record_absent(url).await;
            return Ok(false);
        }
        Ok(true)
    }

    /// The [`Body`] of a response: its total from the cache record (`meta_total`, a cached body) or
    /// from Content-Length unless the body is content-encoded, its reader and validators.
    fn body(
        file: &str,
        url: String,
        resp: Response,
        meta_total: Option<u64>,
        put: Option<Promise>,
        controller: Option<AbortController>,
    ) -> Result<Body> {
        let cached = meta_total.is_some();
        let headers = resp.headers();
        let header = |k: &str| headers.get(k).ok().flatten();
        let encoded = header("content-encoding")
            .is_some_and(|e| !e.trim().is_empty() && !e.eq_ignore_ascii_case("identity"));
        let total = if cached {
            meta_total
        } else if encoded {
            None
        } else {
            header("content-length").and_then(|s| s.trim().parse::<u64>().ok())
        };
        let reader = match resp.body() {
            Some(b) => Some(
                b.get_reader()
                    .dyn_into::<ReadableStreamDefaultReader>()
                    .map_err(|_| Error::FileRead {
                        file: file.to_owned(),
                        msg: "response body has no default reader".into(),
                    })?,
            ),
            None => None,
        };
        Ok(Body {
            url,
            reader,
            total,
            cached,
            put,
            controller,
            etag: header("etag"),
            last_modified: header("last-modified"),
        })
    }

    /// Read a body to its end, handing it to `sink` in pieces of at most [`PIECE_BYTES`]; `max` caps the
    /// size. Checks the byte count against the expected total. `sniff`: stop with [`Pumped::Html`] when
    /// the first chunk starts like an HTML page.
    async fn pump(
        &self,
        file: &str,
        body: &Body,
        max: Option<u64>,
        sniff: bool,
        sink: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<Pumped> {
        let mut loaded = 0u64;
        let total = body.total;
        self.progress("download", file, 0, total.unwrap_or(0), body.cached);
        let Some(reader) = &body.reader else {
            return match total {
                Some(t) if t > 0 => Err(Error::Truncated {
                    file: file.to_owned(),
                    expected: t,
                    got: 0,
                }),
                _ => Ok(Pumped::Done(0)),
            };
        };
        let mut buf: Vec<u8> = Vec::new();
        loop {
            self.check_abort(&format!("loading {file}"))?;
            let Some(value) = next_chunk(file, reader).await? else {
                break;
            };
            let len = value.length();
            if sniff && loaded == 0 {
                let head = value.subarray(0, len.min(64)).to_vec();
                if looks_like_html(&head) {
                    return Ok(Pumped::Html);
                }
            }
            loaded = loaded.saturating_add(u64::from(len));
            check_size(file, body, loaded, max)?;
            let mut off = 0u32;
            while off < len {
                let m = (len - off).min(PIECE_BYTES as u32);
                buf.resize(m as usize, 0);
                value.subarray(off, off + m).copy_to(&mut buf);
                sink(&buf)?;
                off += m;
            }
            self.progress("progress", file, loaded, total.unwrap_or(0), body.cached);
        }
        if let Some(t) = total {
            if loaded < t {
                return Err(Error::Truncated {
                    file: file.to_owned(),
                    expected: t,
                    got: loaded,
                });
            }
        }
        Ok(Pumped::Done(loaded))
    }

    /// Stop a body's download and drop its cache entry (a failed or rejected read).
    async fn discard(&self, body: Body) {
        if let Some(r) = &body.reader {
            let _ = r.cancel();
        }
        if let Some(c) = &body.controller {
            c.abort();
        }
        if let Some(put) = body.put {
            let _ = JsFuture::from(put).await;
        }
        if body.cached {
            self.refetch.borrow_mut().insert(body.url.clone());
        }
        if let Some(c) = self.cache_for(&body.url) {
            cache::forget(c, &body.url).await;
        }
    }

    /// Settle a body after reading it: on success wait for its cache entry and write its meta record; on
    /// failure stop the download and drop its cache entry (a cached copy is then refetched).
    async fn settle(&self, file: &str, body: Body, res: Result<u64>) -> Result<u64> {
        match res {
            Ok(n) => {
                if let Some(put) = body.put.clone() {
                    let stored = match JsFuture::from(put).await {
                        Ok(_) => match self.cache_for(&body.url) {
                            Some(c) => {
                                let meta = Meta {
                                    url: body.url.clone(),
                                    bytes: n,
                                    etag: body.etag.clone(),
                                    last_modified: body.last_modified.clone(),
                                    absent: false,
                                    stored: cache::now(),
                                };
                                cache::write_meta(c, &meta).await
                            }
                            None => Ok(()),
                        },
                        Err(e) => {
                            let (n, m) = describe_js(&e);
                            Err(Error::InvalidInput(format!("cache.put: {n}: {m}")))
                        }
                    };
                    if let Err(e) = stored {
                        web_sys::console::warn_1(&JsValue::from_str(&format!(
                            "florence2-wasm: caching {file} failed ({e})"
                        )));
                        self.cache_failed(file, &body.url, &e.to_string());
                        if let Some(c) = self.cache_for(&body.url) {
                            cache::forget(c, &body.url).await;
                        }
                    }
                }
                Ok(n)
            }
            Err(e) => {
                self.discard(body).await;
                Err(e)
            }
        }
    }

    /// A body that turned out to be an HTML page (a server's fallback page): dropped; an error for a
    /// required file, else the file is remembered as absent.
    async fn html_body(&self, file: &str, body: Body, required: bool) -> Result<()> {
        let url = body.url.clone();
        self.discard(body).await;
        if required {
            return Err(html_error(file, &url, "by its content"));
        }
        self.record_absent(&url).await;
        Ok(())
    }

    /// A small file read whole (`max` bytes at most). `Ok(None)` when optional and absent. A cached copy
    /// that fails its checks is deleted and the file fetched again.
    async fn read_whole(&self, file: &str, required: bool, max: u64) -> Result<Option<Vec<u8>>> {
        loop {
            let Some(body) = self.open(file, required).await? else {
                return Ok(None);
            };
            self.progress("initiate", file, 0, 0, body.cached);
            let mut out = Vec::new();
            let res = self
                .pump(file, &body, Some(max), false, &mut |b| {
                    out.extend_from_slice(b);
                    Ok(())
                })
                .await;
            let cached = body.cached;
            let res = match res {
                Ok(Pumped::Done(_)) if looks_like_html(&out) => Ok(Pumped::Html),
                r => r,
            };
            let n = match res {
                Ok(Pumped::Html) => {
                    return self.html_body(file, body, required).await.map(|()| None)
                }
                Ok(Pumped::Done(n)) => self.settle(file, body, Ok(n)).await,
                Err(e) => self.settle(file, body, Err(e)).await,
            };
            match n {
                Ok(n) => {
                    self.progress("done", file, n, n, cached);
                    return Ok(Some(out));
                }
                // A broken cached copy: it was deleted; read the file from the network.
                Err(e) if cached && !matches!(e, Error::Aborted(_)) => {
                    web_sys::console::warn_1(&JsValue::from_str(&format!(
                        "florence2-wasm: the cached {file} is damaged ({e}); fetching it again"
                    )));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Stream one weights file into `asm`: safetensors, or a PyTorch checkpoint when its name ends in
    /// `.bin`. `expect_names`: tensors an index places in it. Returns the byte count and whether it
    /// came from the cache; `None` when the file is absent and not `required` (a 404, or an HTML page
    /// where the file should be).
    async fn stream_weights(
        &self,
        file: &str,
        asm: &mut Assembler,
        expect_names: Vec<String>,
        required: bool,
    ) -> Result<Option<(u64, bool)>> {
        let Some(body) = self.open(file, required).await? else {
            return Ok(None);
        };
        self.progress("initiate", file, 0, 0, body.cached);
        let mut loader = Pushed::new(file, body.total, expect_names);
        let res = {
            let mut feed = |b: &[u8]| loader.feed(asm, b);
            self.pump(file, &body, None, true, &mut feed).await
        };
        let cached = body.cached;
        let res = match res {
            Ok(Pumped::Html) => return self.html_body(file, body, required).await.map(|()| None),
            Ok(Pumped::Done(n)) => loader.finish(asm).map(|()| n),
            Err(e) => Err(e),
        };
        let n = self.settle(file, body, res).await?;
        self.progress("done", file, n, n, cached);
        Ok(Some((n, cached)))
    }
}

/// The push-style loader of one weights file, by its kind.
enum Pushed {
    Safetensors(StreamLoader),
    Torch(TorchStreamLoader),
}

impl Pushed {
    fn new(file: &str, total: Option<u64>, expect_names: Vec<String>) -> Self {
        if is_torch_file(file) {
            Pushed::Torch(TorchStreamLoader::new(file, total).expect_names(expect_names))
        } else {
            Pushed::Safetensors(StreamLoader::new(file, total).expect_names(expect_names))
        }
    }

    fn feed(&mut self, asm: &mut Assembler, bytes: &[u8]) -> Result<()> {
        match self {
            Pushed::Safetensors(l) => l.feed(asm, bytes),
            Pushed::Torch(l) => l.feed(asm, bytes),
        }
    }

    fn finish(self, asm: &mut Assembler) -> Result<()> {
        match self {
            Pushed::Safetensors(l) => l.finish(asm),
            Pushed::Torch(l) => l.finish(asm),
        }
    }
}

impl ModelSource for Fetcher {
    async fn read_small(&self, name: &str, required: bool, max: u64) -> Result<Option<Vec<u8>>> {
        self.read_whole(name, required, max).await
    }

    async fn load_file(&self, name: &str, asm: &mut Assembler, expect: &[&str]) -> Result<bool> {
        // A file an index names must exist; the single-file names are probes.
        let required = !expect.is_empty();
        let names = expect.iter().map(|n| (*n).to_owned()).collect();
        Ok(self
            .stream_weights(name, asm, names, required)
            .await?
            .is_some())
    }

    /// [`load_weights`]; when a cached file turns out damaged midway (its tensors partly uploaded), the
    /// entry is deleted and the checkpoint read again, the damaged file from the network.
    async fn load_weights(
        &self,
        gpu: &Arc<Device>,
        cfg: &Florence2Config,
        opts: LoadOptions,
    ) -> Result<Weights> {
        // The format, before the first weights byte arrives.
        self.dtype_event(&opts.dtype.label(), &self.dtype_reason.borrow());
        let mut retried = false;
        loop {
            let before = self.refetch.borrow().len();
            let res = load_weights(gpu, self, cfg, opts.clone()).await;
            match res {
                Err(e)
                    if !retried
                        && self.refetch.borrow().len() > before
                        && !matches!(e, Error::Aborted(_)) =>
                {
                    web_sys::console::warn_1(&JsValue::from_str(&format!(
                        "florence2-wasm: a cached weights file is damaged ({e}); fetching it again"
                    )));
                    retried = true;
                }
                r => return r,
            }
        }
    }
}

/// The next chunk of a body stream; `None` at its end.
async fn next_chunk(
    file: &str,
    reader: &ReadableStreamDefaultReader,
) -> Result<Option<Uint8Array>> {
    let r = JsFuture::from(reader.read())
        .await
        .map_err(|e| read_error(file, &e))?;
    let done = Reflect::get(&r, &JsValue::from_str("done"))
        .ok()
        .and_then(|d| d.as_bool())
        .unwrap_or(true);
    if done {
        return Ok(None);
    }
    Reflect::get(&r, &JsValue::from_str("value"))
        .ok()
        .and_then(|v| v.dyn_into::<Uint8Array>().ok())
        .map(Some)
        .ok_or_else(|| Error::FileRead {
            file: file.to_owned(),
            msg: "the body stream yielded a non-byte chunk".into(),
        })
}

/// Fails when `loaded` bytes of `body` exceed the cap `max` or the body's expected total.
fn check_size(file: &str, body: &Body, loaded: u64, max: Option<u64>) -> Result<()> {
    if let Some(max) = max {
        if loaded > max {
            return Err(Error::FileRead {
                file: file.to_owned(),
                msg: format!("larger than the {max}-byte limit"),
            });
        }
    }
    match body.total {
        Some(t) if loaded > t => Err(Error::FileRead {
            file: file.to_owned(),
            msg: if body.cached {
                format!("the cached copy has more bytes than the {t} stored")
            } else {
                format!("more bytes than the announced Content-Length {t}")
            },
        }),
        _ => Ok(()),
    }
}
