//! Where a model comes from: a directory, a `file://` URL, or a hub id through the CLI's Hugging Face
//! cache (one copy on disk for Python, the CLI and Node; `HF_HUB_OFFLINE=1` works offline).

use std::path::PathBuf;

use crate::hub_cache::{resolve_model, HubCacheOptions};
use crate::{Error, Result};

/// The local directory of `source`.
pub fn model_dir(source: &str) -> Result<PathBuf> {
    let local = match source.strip_prefix("file://") {
        Some(rest) => percent_decode(rest)?,
        None => source.to_string(),
    };
    resolve_model(&local, &HubCacheOptions::from_env())
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
