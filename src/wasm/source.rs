//! Where a model's files are: a hub model id, a hub page URL, a directory URL, or a map of file names to
//! URLs (resolution rules in [`crate::hub`]).

use std::collections::BTreeMap;

use js_sys::{Object, Reflect};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use crate::error::{Error, Result};
use crate::hub::{self, HubOptions};
use crate::wasm::js::opt_string;

/// Where the model files are.
#[derive(Clone, Debug)]
pub enum Source {
    /// A directory URL (ends with `/`): file `f` is at `base + f`.
    Base(String),
    /// File name -> URL.
    Files(BTreeMap<String, String>),
}

/// `revision`, `remoteHost`, `remotePathTemplate` from load options.
pub fn hub_options(options: &JsValue) -> Result<HubOptions> {
    let mut o = HubOptions::default();
    if let Some(r) = opt_string(options, "revision")? {
        o.revision = r;
    }
    if let Some(h) = opt_string(options, "remoteHost")? {
        o.remote_host = h;
    }
    if let Some(t) = opt_string(options, "remotePathTemplate")? {
        o.remote_path_template = t;
    }
    Ok(o)
}

/// `url` resolved against the page (or worker) location, as `fetch` and the Cache API resolve it, so
/// cache keys, records and `cacheInfo()` all use one spelling. `blob:`/`data:` URLs and anything the
/// `Request` constructor refuses stay as given.
pub fn absolute(url: &str) -> String {
    web_sys::Request::new_with_str(url)
        .map(|r| r.url())
        .unwrap_or_else(|_| url.to_owned())
}

impl Source {
    /// `v`: a model id / URL string, a `URL`, or `{fileName: url}`; `options`: the load options (hub
    /// settings).
    pub fn from_js(v: &JsValue, options: &JsValue) -> Result<Source> {
        let bad = || {
            Error::InvalidInput(
                "source must be a model id (\"org/name\"), a base URL, or an object mapping file names \
                 to URLs"
                    .into(),
            )
        };
        // A `URL` object reads as its href.
        let as_str = v
            .as_string()
            .or_else(|| v.dyn_ref::<web_sys::Url>().map(|u| u.href()));
        if let Some(s) = as_str {
            let o = hub_options(options)?;
            return Ok(Source::Base(absolute(&hub::resolve(&s, &o)?)));
        }
        if !v.is_object() || v.is_function() {
            return Err(bad());
        }
        let obj: &Object = v.unchecked_ref();
        let mut files = BTreeMap::new();
        for entry in Object::entries(obj).iter() {
            let k = Reflect::get_u32(&entry, 0).ok().and_then(|k| k.as_string());
            let u = Reflect::get_u32(&entry, 1).ok().and_then(|u| {
                u.as_string()
                    .or_else(|| u.dyn_ref::<web_sys::Url>().map(|x| x.href()))
            });
            match (k, u) {
                (Some(k), Some(u)) => {
                    files.insert(k, absolute(&u));
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

    /// The directory URL, or every file URL.
    pub fn urls(&self) -> Vec<String> {
        match self {
            Source::Base(b) => vec![b.clone()],
            Source::Files(m) => m.values().cloned().collect(),
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
