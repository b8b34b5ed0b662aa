//! The package's Cache API bucket: file bodies keyed by their URL, plus one small JSON record per URL
//! (the "meta" entry) that is written only after a file was read whole and checked:
//! `{url, bytes, etag, lastModified, absent, stored}`.
//!
//! - A body without a meta record (a download that was cut off, an older package version) is not
//!   trusted: it is deleted and the file is fetched again.
//! - A cached body shorter or longer than the meta's `bytes` (a corrupted entry) fails the read; the loader
//!   then deletes it and fetches the file again (see `fetch::Fetcher`).
//! - An optional file the server does not have is remembered as a meta record with `absent: true` and no
//!   body (a negative entry), so a cached model loads without asking the network about it again.
//! - The key is the resolved URL, which holds the revision for hub model ids (`.../resolve/REV/`); the
//!   server's `ETag` is kept in the record and reported by `cacheInfo()`.
//!
//! `Florence2.clearCache(source?)` and `Florence2.cacheInfo(source?)` manage the bucket from JS.

use js_sys::{Array, Promise};
use serde::{Deserialize, Serialize};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use web_sys::{Cache, CacheStorage, Headers, Request, Response, ResponseInit};

use crate::error::{Error, Result};
use crate::wasm::js::{describe_js, promise};
use crate::wasm::source::Source;
use crate::wasm::JsFlorence2;

/// The Cache API bucket the package uses.
pub const CACHE_NAME: &str = "florence2-wasm-v1";

/// Meta records live under this (never fetched) URL prefix, followed by the file's URL-encoded URL.
const META_PREFIX: &str = "https://florence2-wasm.invalid/meta?url=";

/// What the cache knows about one file URL.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Meta {
    pub url: String,
    /// Body length in bytes (0 for an absent file).
    #[serde(default)]
    pub bytes: u64,
    #[serde(default)]
    pub etag: Option<String>,
    #[serde(default)]
    pub last_modified: Option<String>,
    /// The server does not have this (optional) file.
    #[serde(default)]
    pub absent: bool,
    /// `Date.now()` when stored.
    #[serde(default)]
    pub stored: f64,
}

/// Failed cache writes this page saw (newest last, at most [`MAX_FAILURES`]): `cacheInfo()` reports them.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    pub url: String,
    /// The error's name and message (`QuotaExceededError: ...`).
    pub message: String,
    /// `Date.now()` when it failed.
    pub time: f64,
}

const MAX_FAILURES: usize = 16;

thread_local! {
    static FAILURES: std::cell::RefCell<Vec<Failure>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Remember a failed cache write of `url`.
pub fn record_failure(url: &str, message: &str) {
    FAILURES.with(|f| {
        let mut f = f.borrow_mut();
        if f.len() == MAX_FAILURES {
            f.remove(0);
        }
        f.push(Failure {
            url: url.to_owned(),
            message: message.to_owned(),
            time: now(),
        });
    });
}

/// The origin's storage as `navigator.storage` reports it (`estimate()`, `persisted()`); `None` where
/// there is no StorageManager (Node.js, insecure pages).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct StorageInfo {
    usage: Option<f64>,
    quota: Option<f64>,
    persisted: Option<bool>,
}

/// `navigator.storage`, when there is one.
fn storage_manager() -> Option<JsValue> {
    let nav = js_sys::Reflect::get(&js_sys::global(), &JsValue::from_str("navigator")).ok()?;
    let sm = js_sys::Reflect::get(&nav, &JsValue::from_str("storage")).ok()?;
    (!sm.is_undefined() && !sm.is_null()).then_some(sm)
}

/// Await `navigator.storage[method]()`; `None` when it is missing or rejects.
async fn call_storage(sm: &JsValue, method: &str) -> Option<JsValue> {
    let f = js_sys::Reflect::get(sm, &JsValue::from_str(method))
        .ok()?
        .dyn_into::<js_sys::Function>()
        .ok()?;
    let p = f.call0(sm).ok()?;
    JsFuture::from(Promise::resolve(&p)).await.ok()
}

async fn storage_info() -> Option<StorageInfo> {
    let sm = storage_manager()?;
    let est = call_storage(&sm, "estimate").await;
    let num = |k: &str| {
        est.as_ref()
            .and_then(|e| js_sys::Reflect::get(e, &JsValue::from_str(k)).ok())
            .and_then(|v| v.as_f64())
    };
    Some(StorageInfo {
        usage: num("usage"),
        quota: num("quota"),
        persisted: call_storage(&sm, "persisted")
            .await
            .and_then(|v| v.as_bool()),
    })
}

/// Ask for persistent storage (`navigator.storage.persist()`, the `persist: true` load option): the
/// browser's answer, `None` where it cannot be asked (workers, Node.js).
pub async fn request_persist() -> Option<bool> {
    let sm = storage_manager()?;
    call_storage(&sm, "persist").await.and_then(|v| v.as_bool())
}

/// The page's `CacheStorage`, when there is one (secure contexts only).
pub fn cache_storage() -> Option<CacheStorage> {
    js_sys::Reflect::get(&js_sys::global(), &JsValue::from_str("caches"))
        .ok()
        .and_then(|c| c.dyn_into::<CacheStorage>().ok())
}

/// Whether `url` can be a Cache API key (http(s) only: not `blob:` or `data:`).
pub fn cacheable(url: &str) -> bool {
    let u = url.trim_start().to_ascii_lowercase();
    !(u.starts_with("blob:") || u.starts_with("data:"))
}

fn meta_key(url: &str) -> String {
    format!(
        "{META_PREFIX}{}",
        String::from(js_sys::encode_uri_component(url))
    )
}

fn cache_err(what: &str, e: &JsValue) -> Error {
    let (n, m) = describe_js(e);
    Error::InvalidInput(format!("Cache API: {what} failed ({n}: {m})"))
}

/// Open the package's bucket.
pub async fn open_cache() -> Result<Option<Cache>> {
    let Some(cs) = cache_storage() else {
        return Ok(None);
    };
    let c = JsFuture::from(cs.open(CACHE_NAME))
        .await
        .map_err(|e| cache_err("caches.open", &e))?;
    Ok(c.dyn_into::<Cache>().ok())
}

/// The meta record of `url`, if any.
pub async fn read_meta(cache: &Cache, url: &str) -> Option<Meta> {
    let hit = JsFuture::from(cache.match_with_str(&meta_key(url)))
        .await
        .ok()?;
    let resp = hit.dyn_into::<Response>().ok()?;
    let text = JsFuture::from(resp.text().ok()?).await.ok()?.as_string()?;
    let meta: Meta = serde_json::from_str(&text).ok()?;
    (meta.url == url).then_some(meta)
}

/// Store `meta` (replacing any earlier record of its URL).
pub async fn write_meta(cache: &Cache, meta: &Meta) -> Result<()> {
    let json = serde_json::to_string(meta)
        .map_err(|e| Error::InvalidInput(format!("cache record: {e}")))?;
    let headers = Headers::new().map_err(|e| cache_err("Headers", &e))?;
    let _ = headers.set("content-type", "application/json");
    let init = ResponseInit::new();
    init.set_headers(&headers);
    let resp = Response::new_with_opt_str_and_init(Some(&json), &init)
        .map_err(|e| cache_err("Response", &e))?;
    JsFuture::from(cache.put_with_str(&meta_key(&meta.url), &resp))
        .await
        .map_err(|e| cache_err("cache.put", &e))?;
    Ok(())
}

/// Delete `url`'s body and meta record.
pub async fn forget(cache: &Cache, url: &str) {
    if !cacheable(url) {
        return;
    }
    let _ = JsFuture::from(cache.delete_with_str(&meta_key(url))).await;
    let _ = JsFuture::from(cache.delete_with_str(url)).await;
}

/// `Date.now()`.
pub fn now() -> f64 {
    js_sys::Date::now()
}

/// Every meta record in the bucket, and the URLs of bodies that have none.
async fn scan(cache: &Cache) -> Result<(Vec<Meta>, Vec<String>)> {
    let keys = JsFuture::from(cache.keys())
        .await
        .map_err(|e| cache_err("cache.keys", &e))?;
    let keys: Array = keys.unchecked_into();
    let mut metas = Vec::new();
    let mut bodies = Vec::new();
    for k in keys.iter() {
        let Ok(req) = k.dyn_into::<Request>() else {
            continue;
        };
        let url = req.url();
        if let Some(enc) = url.strip_prefix(META_PREFIX) {
            let Ok(orig) = js_sys::decode_uri_component(enc) else {
                continue;
            };
            if let Some(m) = read_meta(cache, &String::from(orig)).await {
                metas.push(m);
            }
        } else {
            bodies.push(url);
        }
    }
    Ok((metas, bodies))
}

/// Whether `url` belongs to `prefix` (a source's directory URL or file URLs).
fn under(url: &str, prefixes: &[String]) -> bool {
    prefixes.is_empty() || prefixes.iter().any(|p| url.starts_with(p.as_str()))
}

/// The absolute URL prefixes of a source (relative URLs resolved against the page, like the Cache API
/// resolves its keys).
fn source_prefixes(source: &JsValue, options: &JsValue) -> Result<Vec<String>> {
    if source.is_undefined() || source.is_null() {
        return Ok(Vec::new());
    }
    let src = Source::from_js(source, options)?;
    Ok(src.urls())
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FileInfo {
    url: String,
    bytes: u64,
    etag: Option<String>,
    stored: f64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CacheInfo {
    files: Vec<FileInfo>,
    bytes: u64,
    absent: Vec<String>,
    storage: Option<StorageInfo>,
    failures: Vec<Failure>,
}

async fn cache_info_impl(source: JsValue, options: JsValue) -> Result<JsValue> {
    let prefixes = source_prefixes(&source, &options)?;
    let mut info = CacheInfo {
        files: Vec::new(),
        bytes: 0,
        absent: Vec::new(),
        storage: storage_info().await,
        failures: FAILURES.with(|f| f.borrow().clone()),
    };
    let Some(cache) = open_cache().await? else {
        return info_to_js(&info);
    };
    let (metas, _) = scan(&cache).await?;
    for m in metas.into_iter().filter(|m| under(&m.url, &prefixes)) {
        if m.absent {
            info.absent.push(m.url);
        } else {
            info.bytes += m.bytes;
            info.files.push(FileInfo {
                url: m.url,
                bytes: m.bytes,
                etag: m.etag,
                stored: m.stored,
            });
        }
    }
    info.files.sort_by(|a, b| a.url.cmp(&b.url));
    info.absent.sort();
    info_to_js(&info)
}

/// `info` as a JS object, `None`s as `null` (as the TypeScript type says).
fn info_to_js(info: &CacheInfo) -> Result<JsValue> {
    let ser = serde_wasm_bindgen::Serializer::new()
        .serialize_maps_as_objects(true)
        .serialize_missing_as_null(true);
    info.serialize(&ser)
        .map_err(|e| Error::InvalidInput(format!("serializing cacheInfo: {e}")))
}

async fn clear_cache_impl(source: JsValue, options: JsValue) -> Result<JsValue> {
    let prefixes = source_prefixes(&source, &options)?;
    if prefixes.is_empty() {
        if let Some(cs) = cache_storage() {
            let ok = JsFuture::from(cs.delete(CACHE_NAME))
                .await
                .map_err(|e| cache_err("caches.delete", &e))?;
            return Ok(ok);
        }
        return Ok(JsValue::FALSE);
    }
    let Some(cache) = open_cache().await? else {
        return Ok(JsValue::FALSE);
    };
    let (metas, bodies) = scan(&cache).await?;
    let mut any = false;
    for m in metas.iter().filter(|m| under(&m.url, &prefixes)) {
        forget(&cache, &m.url).await;
        any = true;
    }
    for b in bodies.iter().filter(|b| under(b, &prefixes)) {
        let _ = JsFuture::from(cache.delete_with_str(b)).await;
        any = true;
    }
    Ok(JsValue::from_bool(any))
}

#[wasm_bindgen(typescript_custom_section)]
const TS_CACHE: &'static str = r#"
/** One cached model file. */
export interface CachedFile {
  url: string;
  bytes: number;
  /** The server's ETag when the file was stored (null when it sent none). */
  etag: string | null;
  /** `Date.now()` when stored. */
  stored: number;
}
/** What `Florence2.cacheInfo()` reports. */
export interface CacheInfo {
  /** Complete, checked files (a partial download is never listed). */
  files: CachedFile[];
  /** Sum of `files[].bytes`. */
  bytes: number;
  /** URLs of optional files remembered as absent on their server. */
  absent: string[];
  /** The origin's storage (`navigator.storage.estimate()` and `persisted()`); null where there is no
   * StorageManager (Node.js, insecure pages), a field null where the browser does not say. */
  storage: { usage: number | null; quota: number | null; persisted: boolean | null } | null;
  /** Cache writes that failed on this page (over quota, storage evicted, ...), newest last, at most 16.
   * Each also reached `onProgress` as a `cache_error` event when it happened. */
  failures: { url: string; message: string; time: number }[];
}
"#;

#[wasm_bindgen(js_class = Florence2)]
impl JsFlorence2 {
    /// What the package's Cache API bucket holds: every file, or one model's (`source` and `options` as
    /// for `load`).
    #[wasm_bindgen(js_name = cacheInfo, unchecked_return_type = "Promise<CacheInfo>")]
    pub fn cache_info(
        #[wasm_bindgen(unchecked_optional_param_type = "ModelSource")] source: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "LoadOptions")] options: JsValue,
    ) -> Promise {
        promise(cache_info_impl(source, options))
    }

    /// Delete cached files: all of them (the whole bucket), or one model's (`source` and `options` as for
    /// `load`). Resolves to whether anything was deleted.
    #[wasm_bindgen(js_name = clearCache, unchecked_return_type = "Promise<boolean>")]
    pub fn clear_cache(
        #[wasm_bindgen(unchecked_optional_param_type = "ModelSource")] source: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "LoadOptions")] options: JsValue,
    ) -> Promise {
        promise(clear_cache_impl(source, options))
    }
}
