//! The tuning cache: its file format (one JSON file per adapter and package version) and where it
//! lives (a directory natively, the Cache API in the browser).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::CacheLocation;
use crate::gpu::registry::{format_from_name, ShapeClass};

/// Version recorded in (and required of) the cache: a new package may bring new kernels.
pub(super) const PACKAGE_VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Serialize, Deserialize)]
pub(super) struct CacheFile {
    pub(super) package: String,
    pub(super) adapter: String,
    pub(super) entries: Vec<CacheEntry>,
    /// Candidates of resizable cases (linear) that lost by more than [`super::BAN_FACTOR`] on this adapter, per regime and weight
    /// format: `auto` on a later load neither compiles nor times them (`exhaustive` times them and
    /// clears the list).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) banned: Vec<BanEntry>,
}

#[derive(Serialize, Deserialize, Clone, PartialEq, Eq)]
pub(super) struct BanEntry {
    /// "gemv" (decode rows) or "gemm".
    pub(super) regime: String,
    pub(super) format: String,
    pub(super) variant: String,
}

#[derive(Serialize, Deserialize, Clone)]
pub(super) struct CacheEntry {
    pub(super) op: String,
    pub(super) format: String,
    pub(super) dims: [usize; 3],
    pub(super) variant: String,
    pub(super) times_ms: BTreeMap<String, f64>,
    /// Candidates not tried yet (the budget ran out while compiling them): a later load times them
    /// against `variant`. Empty (absent in older files) = the class is done.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) untried: Vec<String>,
}

/// 64-bit FNV-1a: a short stable file name for an adapter key (the key itself is stored inside and
/// compared on load, so a collision only costs a re-tune).
fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

pub(super) fn cache_name(adapter_key: &str) -> String {
    format!(
        "tuning-{:016x}.json",
        fnv1a(&format!("{PACKAGE_VERSION}\n{adapter_key}"))
    )
}

#[cfg(not(target_arch = "wasm32"))]
fn dir(loc: &CacheLocation) -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    match loc {
        CacheLocation::None => None,
        CacheLocation::Dir(d) => Some(d.clone()),
        CacheLocation::Default => {
            let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
            let base = env("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .or_else(|| env("LOCALAPPDATA").map(PathBuf::from))?;
            Some(base.join("florence2-wasm"))
        }
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub fn describe(loc: &CacheLocation, name: &str) -> String {
    match dir(loc) {
        Some(d) => d.join(name).display().to_string(),
        None => "(no cache directory)".into(),
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub async fn load(loc: &CacheLocation, name: &str) -> Result<Option<String>, String> {
    let Some(d) = dir(loc) else {
        return Ok(None);
    };
    match std::fs::read(d.join(name)) {
        // Not UTF-8 is corrupt too: the lossy text fails to parse and is reported as such.
        Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub async fn save(loc: &CacheLocation, name: &str, text: &str) -> Result<(), String> {
    let Some(d) = dir(loc) else {
        return Err("no cache directory (set XDG_CACHE_HOME or HOME)".into());
    };
    std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
    // A concurrent reader, or the next run after a crash or a full disk, never sees half a file.
    crate::files::write_atomic(&d.join(name), text.as_bytes()).map_err(|e| e.to_string())
}

#[cfg(target_arch = "wasm32")]
const CACHE_NAME: &str = "florence2-wasm-tuning";
/// A synthetic URL keying the entry in the Cache API (never fetched).
#[cfg(target_arch = "wasm32")]
const URL_BASE: &str = "https://florence2-wasm.invalid/tuning/";

#[cfg(target_arch = "wasm32")]
pub fn describe(loc: &CacheLocation, name: &str) -> String {
    match loc {
        CacheLocation::None => "(no cache)".into(),
        CacheLocation::Default => format!("Cache API {CACHE_NAME}: {URL_BASE}{name}"),
    }
}

#[cfg(target_arch = "wasm32")]
async fn open(loc: &CacheLocation) -> Result<Option<web_sys::Cache>, String> {
    use wasm_bindgen::JsCast;
    use wasm_bindgen_futures::JsFuture;
    if matches!(loc, CacheLocation::None) {
        return Ok(None);
    }
    let caches = js_sys::Reflect::get(&js_sys::global(), &"caches".into())
        .ok()
        .and_then(|c| c.dyn_into::<web_sys::CacheStorage>().ok());
    let Some(caches) = caches else {
        return Ok(None); // no Cache API (insecure context): tune every load.
    };
    let c = JsFuture::from(caches.open(CACHE_NAME))
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(c.dyn_into::<web_sys::Cache>().ok())
}

#[cfg(target_arch = "wasm32")]
pub async fn load(loc: &CacheLocation, name: &str) -> Result<Option<String>, String> {
    use wasm_bindgen::JsCast;
    use wasm_bindgen_futures::JsFuture;
    let Some(cache) = open(loc).await? else {
        return Ok(None);
    };
    let url = format!("{URL_BASE}{name}");
    let hit = JsFuture::from(cache.match_with_str(&url))
        .await
        .map_err(|e| format!("{e:?}"))?;
    let Ok(resp) = hit.dyn_into::<web_sys::Response>() else {
        return Ok(None);
    };
    let text = JsFuture::from(resp.text().map_err(|e| format!("{e:?}"))?)
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(text.as_string())
}

#[cfg(target_arch = "wasm32")]
pub async fn save(loc: &CacheLocation, name: &str, text: &str) -> Result<(), String> {
    use wasm_bindgen_futures::JsFuture;
    let Some(cache) = open(loc).await? else {
        return Ok(());
    };
    let url = format!("{URL_BASE}{name}");
    let resp = web_sys::Response::new_with_opt_str(Some(text)).map_err(|e| format!("{e:?}"))?;
    JsFuture::from(cache.put_with_str(&url, &resp))
        .await
        .map(|_| ())
        .map_err(|e| format!("{e:?}"))
}

impl CacheEntry {
    /// Whether this entry is `class`'s.
    pub(super) fn is_for(&self, class: &ShapeClass) -> bool {
        self.op == class.op.name()
            && format_from_name(&self.format) == Some(class.format)
            && self.dims == class.dims
    }
}

/// The cache of this adapter as one run reads and rewrites it.
pub(super) struct Cache<'a> {
    loc: &'a CacheLocation,
    adapter: String,
    name: String,
    pub(super) entries: Vec<CacheEntry>,
    pub(super) banned: Vec<BanEntry>,
}

impl<'a> Cache<'a> {
    /// Read `adapter_key`'s cache at `loc` (nothing with [`CacheLocation::None`]); a file that cannot
    /// be read or parsed is a warning (and an empty cache), one of another adapter or package is empty.
    pub(super) async fn read(
        loc: &'a CacheLocation,
        adapter_key: &str,
        warnings: &mut Vec<String>,
    ) -> Cache<'a> {
        let mut c = Cache {
            loc,
            adapter: adapter_key.to_string(),
            name: cache_name(adapter_key),
            entries: Vec::new(),
            banned: Vec::new(),
        };
        if matches!(loc, CacheLocation::None) {
            return c;
        }
        match load(loc, &c.name).await {
            Ok(None) => {}
            Ok(Some(text)) => match serde_json::from_str::<CacheFile>(&text) {
                Ok(f) if f.package == PACKAGE_VERSION && f.adapter == c.adapter => {
                    c.entries = f.entries;
                    c.banned = f.banned;
                }
                Ok(_) => {} // another adapter or version under a colliding name: re-tune.
                Err(e) => warnings.push(format!(
                    "tuning cache {} is corrupt ({e}); ignoring it and re-tuning",
                    c.path()
                )),
            },
            Err(e) => warnings.push(format!(
                "tuning cache {} could not be read ({e}); re-tuning",
                c.path()
            )),
        }
        c
    }

    /// The file or key, for reports; `None` without a cache.
    pub(super) fn describe(&self) -> Option<String> {
        (!matches!(self.loc, CacheLocation::None)).then(|| self.path())
    }

    fn path(&self) -> String {
        describe(self.loc, &self.name)
    }

    /// Replace `class`'s entry.
    pub(super) fn put(&mut self, class: &ShapeClass, entry: CacheEntry) {
        self.entries.retain(|e| !e.is_for(class));
        self.entries.push(entry);
    }

    /// Write the entries and `bans` (sorted); a failure is a warning, and returned.
    pub(super) async fn write(
        self,
        mut bans: Vec<BanEntry>,
        warnings: &mut Vec<String>,
    ) -> Option<String> {
        if matches!(self.loc, CacheLocation::None) {
            return None;
        }
        bans.sort_by(|a, b| {
            (&a.regime, &a.format, &a.variant).cmp(&(&b.regime, &b.format, &b.variant))
        });
        let path = self.path();
        let (loc, name) = (self.loc, self.name);
        let file = CacheFile {
            package: PACKAGE_VERSION.to_string(),
            adapter: self.adapter,
            entries: self.entries,
            banned: bans,
        };
        let saved = match serde_json::to_string_pretty(&file) {
            Ok(text) => save(loc, &name, &text).await,
            Err(e) => Err(format!("serialising: {e}")),
        };
        let e = saved.err()?;
        let w = format!("tuning cache {path} could not be written ({e})");
        log::warn!("{w}");
        warnings.push(w.clone());
        Some(w)
    }
}
