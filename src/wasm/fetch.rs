//! Model files over `fetch()`: small JSON files read whole (with a size cap), safetensors files streamed
//! from `response.body` chunk by chunk into a [`StreamLoader`] (so the whole file is never in wasm or JS
//! memory), optional Cache API storage, abort signals, and transformers.js-shaped progress events.
//!
//! Events per file: `initiate` once the file is known to exist (an absent optional file has none),
//! `download` when its body starts, `progress` per chunk, `done`; the loader sends `ready` at the end.
//!
//! Cache: with it on, a file is looked up in `caches.open(CACHE_NAME)` first (a hit never touches the
//! network and its events say `cached: true`); a downloaded response is stored with `cache.put(url,
//! response.clone())` while the original body is streamed (the browser tees the body), and an entry is
//! deleted again when reading it failed (truncated, bad header, aborted). `blob:` and `data:` URLs are
//! never cached (the Cache API only takes http(s) requests). With it off the cache is neither read nor
//! written.

use std::collections::BTreeMap;

use js_sys::{Function, Object, Promise, Reflect, Uint8Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use web_sys::{
    AbortController, AbortSignal, Cache, CacheStorage, ReadableStreamDefaultReader, RequestInit,
    Response,
};

use crate::error::{Error, Result};
use crate::wasm::js::{call1, check_signal, describe_js, read_error, set};
use crate::weights::{Assembler, StreamLoader};

/// The Cache API bucket the package uses.
pub const CACHE_NAME: &str = "florence2-wasm-v1";

/// Bytes copied from a JS chunk into wasm memory at a time (a `fetch` chunk larger than this is split).
pub const PIECE_BYTES: usize = 1 << 20;

#[wasm_bindgen]
extern "C" {
    /// The global `fetch` (looked up at call time, so a page's wrapper of `globalThis.fetch` is used).
    #[wasm_bindgen(js_name = fetch)]
    fn global_fetch(input: &str, init: &RequestInit) -> Promise;
}

/// Where the model files are.
#[derive(Clone, Debug)]
pub enum Source {
    /// A directory URL (ends with `/`): file `f` is at `base + f`.
    Base(String),
    /// File name -> URL.
    Files(BTreeMap<String, String>),
}

impl Source {
    pub fn from_js(v: &JsValue) -> Result<Source> {
        let bad = || {
            Error::InvalidInput(
                "source must be a base URL string or an object mapping file names to URLs".into(),
            )
        };
        if let Some(s) = v.as_string() {
            if s.is_empty() {
                return Err(bad());
            }
            let mut s = s;
            if !s.ends_with('/') {
                s.push('/');
            }
            return Ok(Source::Base(s));
        }
        if !v.is_object() || v.is_function() {
            return Err(bad());
        }
        let obj: &Object = v.unchecked_ref();
        let mut files = BTreeMap::new();
        for entry in Object::entries(obj).iter() {
            let k = Reflect::get_u32(&entry, 0).ok().and_then(|k| k.as_string());
            let u = Reflect::get_u32(&entry, 1).ok().and_then(|u| u.as_string());
            match (k, u) {
                (Some(k), Some(u)) => {
                    files.insert(k, u);
                }
                _ => return Err(bad()),
            }
        }
        if files.is_empty() {
            return Err(bad());
        }
        Ok(Source::Files(files))
    }

    /// The URL of `file`, if the source has one.
    pub fn url(&self, file: &str) -> Option<String> {
        match self {
            Source::Base(b) => Some(format!("{b}{file}")),
            Source::Files(m) => m.get(file).cloned(),
        }
    }

    /// A name for progress events: the base URL, or the config's URL.
    pub fn name(&self) -> String {
        match self {
            Source::Base(b) => b.clone(),
            Source::Files(m) => m.get("config.json").cloned().unwrap_or_default(),
        }
    }
}

/// One opened file body.
struct Body {
    url: String,
    reader: Option<ReadableStreamDefaultReader>,
    /// Content-Length (when the body is not content-encoded).
    total: Option<u64>,
    cached: bool,
    /// The pending `cache.put` of a downloaded response.
    put: Option<Promise>,
    /// Aborts this file's fetch (so a failed read also stops the cache's copy of the body).
    controller: Option<AbortController>,
}

/// Fetches a model's files.
pub struct Fetcher {
    pub source: Source,
    name: String,
    cache: Option<Cache>,
    signal: Option<AbortSignal>,
    on_progress: Option<Function>,
}

/// The page's `CacheStorage`, when there is one (secure contexts only).
fn cache_storage() -> Option<CacheStorage> {
    Reflect::get(&js_sys::global(), &JsValue::from_str("caches"))
        .ok()
        .and_then(|c| c.dyn_into::<CacheStorage>().ok())
}

fn cacheable(url: &str) -> bool {
    let u = url.trim_start().to_ascii_lowercase();
    !(u.starts_with("blob:") || u.starts_with("data:"))
}

impl Fetcher {
    /// `use_cache`: read from and write to the Cache API.
    pub async fn new(
        source: Source,
        use_cache: bool,
        signal: Option<AbortSignal>,
        on_progress: Option<Function>,
    ) -> Result<Fetcher> {
        let cache = if use_cache {
            match cache_storage() {
                Some(cs) => match JsFuture::from(cs.open(CACHE_NAME)).await {
                    Ok(c) => c.dyn_into::<Cache>().ok(),
                    Err(e) => {
                        let (n, m) = describe_js(&e);
                        web_sys::console::warn_1(&JsValue::from_str(&format!(
                            "florence2-wasm: Cache API unavailable ({n}: {m}); not caching"
                        )));
                        None
                    }
                },
                None => None,
            }
        } else {
            None
        };
        Ok(Fetcher {
            name: source.name(),
            source,
            cache,
            signal,
            on_progress,
        })
    }

    pub fn check_abort(&self, what: &str) -> Result<()> {
        check_signal(self.signal.as_ref(), what)
    }

    /// Emit a progress event `{status, name, file, loaded, total, progress, cached}`.
    pub fn progress(&self, status: &str, file: &str, loaded: u64, total: u64, cached: bool) {
        let Some(f) = &self.on_progress else { return };
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
        call1(f, &ev);
    }

    /// Open `file`: from the cache when enabled and present, else over the network. `Ok(None)` for an
    /// optional file the source does not list or the server answers 404 for.
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
        let cache = self.cache.as_ref().filter(|_| cacheable(&url));
        let mut cached_resp = None;
        if let Some(c) = cache {
            if let Ok(hit) = JsFuture::from(c.match_with_str(&url)).await {
                cached_resp = hit.dyn_into::<Response>().ok();
            }
        }
        let (resp, cached, put, controller) = match cached_resp {
            Some(r) => (r, true, None, None),
            None => {
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
                let resp = JsFuture::from(global_fetch(&url, &init))
                    .await
                    .map_err(|e| read_error(file, &e))?;
                let resp: Response = resp.dyn_into().map_err(|_| Error::FileRead {
                    file: file.to_owned(),
                    msg: "fetch did not return a Response".into(),
                })?;
                if !resp.ok() {
                    if !required && resp.status() == 404 {
                        return Ok(None);
                    }
                    return Err(Error::FileRead {
                        file: file.to_owned(),
                        msg: format!("HTTP {} {} from {url}", resp.status(), resp.status_text()),
                    });
                }
                let put = match cache {
                    Some(c) => resp.clone().ok().map(|copy| c.put_with_str(&url, &copy)),
                    None => None,
                };
                (resp, false, put, controller)
            }
        };
        let headers = resp.headers();
        let encoded = headers
            .get("content-encoding")
            .ok()
            .flatten()
            .is_some_and(|e| !e.trim().is_empty() && !e.eq_ignore_ascii_case("identity"));
        let total = if encoded {
            None
        } else {
            headers
                .get("content-length")
                .ok()
                .flatten()
                .and_then(|s| s.trim().parse::<u64>().ok())
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
        Ok(Some(Body {
            url,
            reader,
            total,
            cached,
            put,
            controller,
        }))
    }

    /// Read a body to its end, handing it to `sink` in pieces of at most [`PIECE_BYTES`]; `max` caps the
    /// size. Checks the byte count against Content-Length.
    async fn pump(
        &self,
        file: &str,
        body: &Body,
        max: Option<u64>,
        sink: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<u64> {
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
                _ => Ok(0),
            };
        };
        let mut buf: Vec<u8> = Vec::new();
        loop {
            self.check_abort(&format!("loading {file}"))?;
            let r = JsFuture::from(reader.read())
                .await
                .map_err(|e| read_error(file, &e))?;
            let done = Reflect::get(&r, &JsValue::from_str("done"))
                .ok()
                .and_then(|d| d.as_bool())
                .unwrap_or(true);
            if done {
                break;
            }
            let value = Reflect::get(&r, &JsValue::from_str("value"))
                .ok()
                .and_then(|v| v.dyn_into::<Uint8Array>().ok())
                .ok_or_else(|| Error::FileRead {
                    file: file.to_owned(),
                    msg: "the body stream yielded a non-byte chunk".into(),
                })?;
            let n = value.length() as u64;
            loaded = loaded.saturating_add(n);
            if let Some(max) = max {
                if loaded > max {
                    return Err(Error::FileRead {
                        file: file.to_owned(),
                        msg: format!("larger than the {max}-byte limit"),
                    });
                }
            }
            if let Some(t) = total {
                if loaded > t {
                    return Err(Error::FileRead {
                        file: file.to_owned(),
                        msg: format!("more bytes than the announced Content-Length {t}"),
                    });
                }
            }
            let mut off = 0u32;
            let len = value.length();
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
        Ok(loaded)
    }

    /// Settle a body after reading it: on success wait for its cache entry; on failure stop the
    /// download and drop its cache entry.
    async fn settle<T>(&self, file: &str, body: Body, res: Result<T>) -> Result<T> {
        match res {
            Ok(v) => {
                if let Some(put) = body.put {
                    if let Err(e) = JsFuture::from(put).await {
                        let (n, m) = describe_js(&e);
                        web_sys::console::warn_1(&JsValue::from_str(&format!(
                            "florence2-wasm: caching {file} failed ({n}: {m})"
                        )));
                        self.forget(&body.url).await;
                    }
                }
                Ok(v)
            }
            Err(e) => {
                if let Some(r) = &body.reader {
                    let _ = r.cancel();
                }
                if let Some(c) = &body.controller {
                    c.abort();
                }
                if let Some(put) = body.put {
                    let _ = JsFuture::from(put).await;
                }
                if body.cached || self.cache.is_some() {
                    self.forget(&body.url).await;
                }
                Err(e)
            }
        }
    }

    async fn forget(&self, url: &str) {
        if let Some(c) = &self.cache {
            if cacheable(url) {
                let _ = JsFuture::from(c.delete_with_str(url)).await;
            }
        }
    }

    /// A small file read whole (`max` bytes at most). `Ok(None)` when optional and absent.
    pub async fn read_small(
        &self,
        file: &str,
        required: bool,
        max: u64,
    ) -> Result<Option<Vec<u8>>> {
        let Some(body) = self.open(file, required).await? else {
            return Ok(None);
        };
        self.progress("initiate", file, 0, 0, false);
        let mut out = Vec::new();
        let res = self
            .pump(file, &body, Some(max), &mut |b| {
                out.extend_from_slice(b);
                Ok(())
            })
            .await;
        let cached = body.cached;
        let n = self.settle(file, body, res).await?;
        self.progress("done", file, n, n, cached);
        Ok(Some(out))
    }

    /// Stream one safetensors file into `asm`. `expect_names`: tensors an index places in it.
    pub async fn stream_safetensors(
        &self,
        file: &str,
        asm: &mut Assembler,
        expect_names: Vec<String>,
    ) -> Result<u64> {
        let Some(body) = self.open(file, true).await? else {
            return Err(Error::FileRead {
                file: file.to_owned(),
                msg: "not found".into(),
            });
        };
        self.progress("initiate", file, 0, 0, false);
        let mut loader = StreamLoader::new(file, body.total).expect_names(expect_names);
        let res = {
            let mut feed = |b: &[u8]| loader.feed(asm, b);
            self.pump(file, &body, None, &mut feed).await
        };
        let res = res.and_then(|n| loader.finish(asm).map(|()| n));
        let cached = body.cached;
        let n = self.settle(file, body, res).await?;
        self.progress("done", file, n, n, cached);
        Ok(n)
    }
}
