//! One blob's GET: streamed to `blobs/ETAG.incomplete` (`huggingface_hub`'s name for a partial blob),
//! resumed from what a previous run left there with `Range: bytes=N-`, capped at the announced length,
//! checked against the ETag's digest, and only then renamed to its final name. A killed process leaves
//! an `.incomplete` file, never a blob a later run trusts.

use std::io::{Read, Write};
use std::path::Path;

use crate::error::{Error, Result};

use super::checksum;
use super::http::{header, join_url, Client, MAX_REDIRECTS};
use super::progress::DownloadProgress;

/// The most a file of unannounced length may be (a hostile server's endless body stops here).
const MAX_UNANNOUNCED: u64 = 64 << 30;

/// A failed copy: the network side or the disk side.
enum Copy {
    Read(std::io::Error),
    Write(std::io::Error),
}

/// Where a GET starts writing.
enum Start {
    /// At byte 0 (a new file, or a server that ignored the range).
    Fresh,
    /// After the `N` bytes already in the partial file (the server answered 206 from `N`).
    Resume(u64),
}

/// `bytes START-END/TOTAL` of a 206 answer as (START, TOTAL); `TOTAL` may be `*`. Public for the fuzz
/// target (scripts/fuzz/fuzz_targets/hub.rs).
pub fn content_range(v: &str) -> Option<(u64, Option<u64>)> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (span, total) = rest.split_once('/')?;
    let (start, end) = span.split_once('-')?;
    let (start, end): (u64, u64) = (start.trim().parse().ok()?, end.trim().parse().ok()?);
    let total = match total.trim() {
        "*" => None,
        t => Some(t.parse().ok()?),
    };
    (end >= start && total.is_none_or(|t| end < t)).then_some((start, total))
}

impl Client {
    /// GET `url` (following redirects) into `blob`, through `blob.incomplete`, then verify `etag`.
    pub(super) fn download(
        &self,
        url: &str,
        blob: &Path,
        size: Option<u64>,
        etag: &str,
        shown: &str,
    ) -> Result<()> {
        let fail = |msg: String| Error::FileRead {
            file: shown.to_owned(),
            msg,
        };
        let dir = blob.parent().ok_or_else(|| fail("bad cache path".into()))?;
        std::fs::create_dir_all(dir).map_err(|e| fail(format!("{}: {e}", dir.display())))?;
        let part = blob.with_extension("incomplete");
        let mut have = std::fs::metadata(&part).map_or(0, |m| m.len());
        if size.is_some_and(|s| have >= s) {
            // Longer than the file (or whole but never verified): start over.
            have = 0;
        }
        let (mut resp, start) = match self.get(url, have, size, shown)? {
            Some(r) => r,
            // 416: the partial file does not fit the server's; start over.
            None => self
                .get(url, 0, size, shown)?
                .ok_or_else(|| fail(format!("HTTP 416 from {url} without a range")))?,
        };
        if self.verbose {
            let mb = size.map_or(String::new(), |n| format!(" ({:.1} MB)", n as f64 / 1e6));
            eprintln!("florence2: downloading {shown}{mb}");
        }
        let write = |e: std::io::Error| fail(format!("{}: {e}", part.display()));
        let (mut out, from) = match start {
            Start::Fresh => (std::fs::File::create(&part).map_err(write)?, 0),
            Start::Resume(n) => {
                let f = std::fs::OpenOptions::new().append(true).open(&part);
                (f.map_err(write)?, n)
            }
        };
        // One byte past the announced length tells an overlong body from an exact one (saturating: a
        // hostile hub may announce u64::MAX).
        let cap = size.map_or(MAX_UNANNOUNCED, |s| s - from).saturating_add(1);
        let mut body = resp.body_mut().as_reader().take(cap);
        let mut state = DownloadProgress {
            file: shown.to_owned(),
            done: from,
            total: size,
            finished: false,
        };
        let n = self
            .copy(&mut body, &mut out, &mut state)
            .map_err(|e| match e {
                Copy::Read(e) => {
                    self.unreachable.set(true);
                    fail(format!("download interrupted: {e}"))
                }
                Copy::Write(e) => write(e),
            })?;
        out.flush().map_err(write)?;
        drop(out);
        let total = from + n;
        if n == cap || size.is_some_and(|s| s != total) {
            let _ = std::fs::remove_file(&part);
            return Err(fail(match size {
                Some(s) if n == cap => format!("the server sent more than the {s} bytes announced"),
                Some(s) => format!("downloaded {total} bytes, the hub announced {s}"),
                None => format!("more than {MAX_UNANNOUNCED} bytes of unannounced length"),
            }));
        }
        if let Err(e) = checksum::verify(&part, etag, shown) {
            let _ = std::fs::remove_file(&part);
            return Err(e);
        }
        std::fs::rename(&part, blob).map_err(write)?;
        if let Some(p) = &self.progress {
            state.finished = true;
            p.report(&state);
        }
        Ok(())
    }

    /// `body` into `out`, reporting each chunk; the bytes copied.
    fn copy(
        &self,
        body: &mut impl Read,
        out: &mut impl Write,
        state: &mut DownloadProgress,
    ) -> std::result::Result<u64, Copy> {
        let mut buf = vec![0u8; 1 << 16];
        let mut n = 0u64;
        loop {
            let k = match body.read(&mut buf) {
                Ok(0) => return Ok(n),
                Ok(k) => k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Copy::Read(e)),
            };
            out.write_all(&buf[..k]).map_err(Copy::Write)?;
            n += k as u64;
            state.done += k as u64;
            if let Some(p) = &self.progress {
                p.report(state);
            }
        }
    }

    /// GET `url` from byte `from`, following redirects: the answer and where it starts, or `None` on
    /// 416 (the range does not fit the file). A 206 must resume at `from` of a file of length `size`.
    fn get(
        &self,
        url: &str,
        from: u64,
        size: Option<u64>,
        shown: &str,
    ) -> Result<Option<(ureq::http::Response<ureq::Body>, Start)>> {
        let fail = |msg: String| Error::FileRead {
            file: shown.to_owned(),
            msg,
        };
        let mut url = url.to_owned();
        for _ in 0..MAX_REDIRECTS {
            let r = self.call(false, &url, (from > 0).then_some(from))?;
            let status = r.status().as_u16();
            match status {
                301..=308 => url = join_url(&url, &header(&r, "location").unwrap_or_default()),
                200 => return Ok(Some((r, Start::Fresh))),
                206 => {
                    let range = header(&r, "content-range").and_then(|v| content_range(&v));
                    return match range {
                        Some((start, total))
                            if start == from
                                && from > 0
                                && total.zip(size).is_none_or(|(t, s)| t == s) =>
                        {
                            Ok(Some((r, Start::Resume(from))))
                        }
                        _ => Err(fail(format!(
                            "{url}: a 206 answer whose Content-Range does not continue the file at byte {from}"
                        ))),
                    };
                }
                416 if from > 0 => return Ok(None),
                _ => return Err(fail(format!("HTTP {status} from {url}"))),
            }
        }
        Err(fail(format!("more than {MAX_REDIRECTS} redirects")))
    }
}

#[cfg(test)]
mod tests {
    use super::content_range;

    #[test]
    fn content_range_is_parsed_strictly() {
        assert_eq!(content_range("bytes 10-99/100"), Some((10, Some(100))));
        assert_eq!(content_range("bytes 10-99/*"), Some((10, None)));
        for bad in [
            "bytes 10-100/100",
            "bytes 99-10/100",
            "bytes -1-5/9",
            "items 1-2/3",
            "bytes 1-2",
            "bytes 18446744073709551616-1/2",
        ] {
            assert_eq!(content_range(bad), None, "{bad}");
        }
    }
}
