//! Where a model comes from: a directory, a `file://` URL, or a hub repository (an id or its URL)
//! through the CLI's Hugging Face cache (one copy on disk for Python, the CLI and Node;
//! `HF_HUB_OFFLINE=1` works offline).

use std::path::PathBuf;

use napi_derive::napi;

use crate::hub::{repo_of_url, HubOptions};
use crate::hub_cache::{resolve_model, HubCacheOptions, ProgressObserver};
use crate::{Error, Result};

/// The local directory of `source`; `progress` is told the bytes of each file a hub download writes.
pub fn model_dir(source: &str, progress: Option<ProgressObserver>) -> Result<PathBuf> {
    let opts = HubCacheOptions {
        progress,
        ..HubCacheOptions::from_env()
    };
    let local = if let Some(rest) = source.strip_prefix("file://") {
        percent_decode(rest)?
    } else if is_http(source) {
        hub_repo(source, &opts).ok_or_else(|| {
            Error::InvalidInput(format!(
                "{source}: the native addon reads a hub repository's URL through the Hugging Face \
                 cache; other http(s) URLs are read by the wasm (device \"wasm\")"
            ))
        })?
    } else {
        source.to_string()
    };
    resolve_model(&local, &opts)
}

fn is_http(s: &str) -> bool {
    let s = s.trim_start().to_ascii_lowercase();
    s.starts_with("http://") || s.starts_with("https://")
}

/// `org/name@revision` of a hub repository's URL (huggingface.co or `HF_ENDPOINT`).
fn hub_repo(url: &str, opts: &HubCacheOptions) -> Option<String> {
    let hub = HubOptions {
        remote_host: format!("{}/", opts.endpoint.trim_end_matches('/')),
        ..HubOptions::default()
    };
    repo_of_url(url, &hub).map(|(id, rev)| format!("{id}@{rev}"))
}

/// `org/name@revision` when `url` is a whole hub repository's URL (the addon reads it through the
/// Hugging Face cache), else null (the JS side sends it to the wasm).
#[napi]
pub fn hub_repo_of_url(url: String) -> Option<String> {
    is_http(&url)
        .then(|| hub_repo(&url, &HubCacheOptions::from_env()))
        .flatten()
}

/// `%XX` escapes of a `file://` URL's path decoded (the URL `pathToFileURL` makes).
fn percent_decode(s: &str) -> Result<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| Error::InvalidInput(format!("file URL {s:?}: bad % escape")))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| Error::InvalidInput(format!("file URL {s:?}: not UTF-8")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_escapes_and_rejects_bad_ones() {
        assert_eq!(percent_decode("/a%20b/c").unwrap(), "/a b/c");
        assert!(percent_decode("/a%2").is_err());
        assert!(percent_decode("/a%zz").is_err());
    }
}
