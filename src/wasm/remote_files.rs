//! A model's files over HTTP for the memory estimate, read without downloading a weight: small files
//! whole through the load's [`Fetcher`] (cached like a load's), the weights files by `HEAD` (their
//! size, from `Content-Length`, else a one-byte range's `Content-Range`) and ranged `GET`s (the
//! safetensors headers). A server that ignores `Range` answers the whole file: the reader then takes
//! only the bytes it asked for and cancels the rest of the body.

use js_sys::Uint8Array;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use web_sys::{Headers, ReadableStreamDefaultReader, RequestInit, Response};

use crate::error::{Error, Result};
use crate::wasm::fetch::Fetcher;
use crate::wasm::js::read_error;
use crate::weights::load::ModelSource;
use crate::weights::source::{ByteSource, ModelFiles};

/// The files of a [`Fetcher`]'s source, for [`crate::estimate`].
pub struct RemoteFiles<'a> {
    pub fetcher: &'a Fetcher,
}

/// One remote file: its URL and size, read in ranges.
pub struct RemoteFile<'a> {
    fetcher: &'a Fetcher,
    name: String,
    url: String,
    len: u64,
}

fn bad(file: &str, msg: impl Into<String>) -> Error {
    Error::FileRead {
        file: file.to_owned(),
        msg: msg.into(),
    }
}

/// `method url` with the `Range` header when given; the response, or `None` for 404/410.
async fn request(
    f: &Fetcher,
    file: &str,
    url: &str,
    method: &str,
    range: Option<String>,
) -> Result<Option<Response>> {
    f.check_abort(&format!("estimating {file}"))?;
    let init = RequestInit::new();
    init.set_method(method);
    if let Some(r) = range {
        let h = Headers::new().map_err(|e| read_error(file, &e))?;
        h.set("Range", &r).map_err(|e| read_error(file, &e))?;
        init.set_headers(&h);
    }
    let resp = JsFuture::from(f.fetch_url(url, &init))
        .await
        .map_err(|e| read_error(file, &e))?;
    let resp: Response = resp
        .dyn_into()
        .map_err(|_| bad(file, "fetch did not return a Response"))?;
    if matches!(resp.status(), 404 | 410) {
        return Ok(None);
    }
    if !resp.ok() {
        return Err(bad(
            file,
            format!("HTTP {} {} from {url}", resp.status(), resp.status_text()),
        ));
    }
    Ok(Some(resp))
}

fn header(resp: &Response, k: &str) -> Option<String> {
    resp.headers().get(k).ok().flatten()
}

/// The total of a `Content-Range: bytes a-b/TOTAL`.
fn range_total(v: &str) -> Option<u64> {
    v.rsplit('/').next()?.trim().parse().ok()
}

/// Cancel a body that is not read (or no longer needed).
fn drop_body(resp: &Response) {
    if let Some(b) = resp.body() {
        let _ = b.cancel();
    }
}

impl<'a> ModelFiles for RemoteFiles<'a> {
    type Source = RemoteFile<'a>;

    async fn read_small(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>> {
        ModelSource::read_small(self.fetcher, name, false, max).await
    }

    async fn open(&self, name: &str) -> Result<Option<RemoteFile<'a>>> {
        let Some(url) = self.fetcher.source.url(name) else {
            return Ok(None);
        };
        let Some(resp) = request(self.fetcher, name, &url, "HEAD", None).await? else {
            return Ok(None);
        };
        let encoded = header(&resp, "content-encoding")
            .is_some_and(|e| !e.trim().is_empty() && !e.eq_ignore_ascii_case("identity"));
        let mut len = header(&resp, "content-length")
            .filter(|_| !encoded)
            .and_then(|s| s.trim().parse::<u64>().ok());
        drop_body(&resp);
        if len.is_none() {
            // No length on the HEAD: a one-byte range tells the total.
            if let Some(r) =
                request(self.fetcher, name, &url, "GET", Some("bytes=0-0".into())).await?
            {
                len = header(&r, "content-range").as_deref().and_then(range_total);
                drop_body(&r);
            }
        }
        let len = len.ok_or_else(|| {
            bad(
                name,
                format!("{url} gives no Content-Length or Content-Range to size it by"),
            )
        })?;
        Ok(Some(RemoteFile {
            fetcher: self.fetcher,
            name: name.to_owned(),
            url,
            len,
        }))
    }
}

impl ByteSource for RemoteFile<'_> {
    fn name(&self) -> &str {
        &self.name
    }

    async fn len(&mut self) -> Result<u64> {
        Ok(self.len)
    }

    async fn read_range(&mut self, start: u64, len: usize) -> Result<Vec<u8>> {
        let end = start + len as u64;
        if end > self.len {
            return Err(Error::Truncated {
                file: self.name.clone(),
                expected: end,
                got: self.len,
            });
        }
        let range = format!("bytes={start}-{}", end.saturating_sub(1));
        let resp = request(self.fetcher, &self.name, &self.url, "GET", Some(range))
            .await?
            .ok_or_else(|| bad(&self.name, "gone (404) between two requests"))?;
        // 206: exactly the range; 200: the whole file from byte 0 (read up to `end`, then cancelled).
        let skip = if resp.status() == 206 { 0 } else { start };
        let body = resp
            .body()
            .ok_or_else(|| bad(&self.name, "the response has no body"))?;
        let reader: ReadableStreamDefaultReader = body
            .get_reader()
            .dyn_into()
            .map_err(|_| bad(&self.name, "the response body has no default reader"))?;
        let mut out: Vec<u8> = Vec::with_capacity(len);
        let mut seen = 0u64;
        while out.len() < len {
            let chunk = JsFuture::from(reader.read())
                .await
                .map_err(|e| read_error(&self.name, &e))?;
            let done = js_sys::Reflect::get(&chunk, &"done".into())
                .map(|v| v.is_truthy())
                .unwrap_or(true);
            if done {
                break;
            }
            let value = js_sys::Reflect::get(&chunk, &"value".into())
                .map_err(|e| read_error(&self.name, &e))?;
            let bytes = Uint8Array::new(&value).to_vec();
            let from = skip.saturating_sub(seen).min(bytes.len() as u64) as usize;
            seen += bytes.len() as u64;
            let want = len - out.len();
            let part = &bytes[from..];
            out.extend_from_slice(&part[..part.len().min(want)]);
        }
        let _ = reader.cancel();
        if out.len() != len {
            return Err(Error::Truncated {
                file: self.name.clone(),
                expected: end,
                got: start + out.len() as u64,
            });
        }
        Ok(out)
    }
}
