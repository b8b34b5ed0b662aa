//! Fetching one file of a hub repository into the cache: a HEAD request for its commit and ETag (the
//! hub answers a large file with a redirect to its storage host, which is not followed), then, if the
//! blob is not cached yet, a GET that follows redirects (see [`super::download`]: resumed, capped,
//! verified against the ETag). The token goes to the endpoint's host only.

use std::cell::Cell;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::hub::encode_component;
use crate::weights::source::check_relative_name;

use super::layout::{is_key, normalize_etag, RepoCache};
use super::{HubCacheOptions, ModelId};

/// Redirects followed by a download (the hub uses one; mirrors a few).
pub(super) const MAX_REDIRECTS: u32 = 8;

/// An HTTP client for one resolution.
pub struct Client {
    agent: ureq::Agent,
    endpoint: String,
    token: Option<String>,
    pub(super) verbose: bool,
    pub(super) progress: Option<super::ProgressObserver>,
    pub(super) unreachable: Cell<bool>,
}

/// What a HEAD request says about a file.
struct Meta {
    commit: Option<String>,
    etag: Option<String>,
    size: Option<u64>,
}

fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split(['/', '?', '#']).next().unwrap_or("")
}

/// `location` (absolute, or relative to `base`) as an absolute URL.
pub(super) fn join_url(base: &str, location: &str) -> String {
    if location.contains("://") {
        return location.to_owned();
    }
    let (scheme, rest) = base.split_once("://").unwrap_or(("https", base));
    let host = host_of(base);
    if location.starts_with('/') {
        return format!("{scheme}://{host}{location}");
    }
    let dir = rest.rfind('/').map_or(rest, |i| &rest[..=i]);
    format!("{scheme}://{dir}{location}")
}

pub(super) fn header(resp: &ureq::http::Response<ureq::Body>, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_owned())
}

impl Client {
    pub fn new(opts: &HubCacheOptions) -> Client {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .user_agent(concat!("florence2/", env!("CARGO_PKG_VERSION")))
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .build();
        Client {
            agent: config.into(),
            endpoint: opts.endpoint.clone(),
            token: opts.token.clone(),
            verbose: opts.verbose,
            progress: opts.progress.clone(),
            unreachable: Cell::new(false),
        }
    }

    /// Whether a request failed for want of a connection (not an HTTP answer).
    pub fn unreachable(&self) -> bool {
        self.unreachable.get()
    }

    fn request_err(&self, url: &str, e: ureq::Error) -> Error {
        if matches!(
            e,
            ureq::Error::Io(_)
                | ureq::Error::HostNotFound
                | ureq::Error::ConnectionFailed
                | ureq::Error::Timeout(_)
        ) {
            self.unreachable.set(true);
        }
        Error::FileRead {
            file: url.to_owned(),
            msg: e.to_string(),
        }
    }

    /// A request to `url` with the token when `url` is on the endpoint's host; a GET from byte `from`
    /// asks for `Range: bytes=FROM-`.
    pub(super) fn call(
        &self,
        head: bool,
        url: &str,
        from: Option<u64>,
    ) -> Result<ureq::http::Response<ureq::Body>> {
        let own_host = host_of(url) == host_of(&self.endpoint);
        let r = if head {
            self.agent.head(url).header("Accept-Encoding", "identity")
        } else {
            self.agent.get(url).header("Accept-Encoding", "identity")
        };
        let r = match from {
            Some(n) => r.header("Range", format!("bytes={n}-")),
            None => r,
        };
        let r = match (&self.token, own_host) {
            (Some(t), true) => r.header("Authorization", format!("Bearer {t}")),
            _ => r,
        };
        r.call().map_err(|e| self.request_err(url, e))
    }

    /// `file` of `id` into the cache: its snapshot path, or `None` when the repository has no such file
    /// (an error if `required`). `commit` is set by the first answer and pins the files after it.
    pub fn fetch(
        &self,
        cache: &RepoCache,
        id: &ModelId,
        commit: &mut Option<String>,
        file: &str,
        required: bool,
    ) -> Result<Option<PathBuf>> {
        let shown = format!("{}/{file}", id.repo);
        let fail = |msg: String| Error::FileRead {
            file: shown.clone(),
            msg,
        };
        if !check_relative_name(file) {
            return Err(fail("not a safe file name".into()));
        }
        if let Some(c) = commit.as_deref() {
            if !required && cache.is_missing(c, file) {
                return Ok(None);
            }
        }
        let rev = commit.as_deref().unwrap_or(&id.revision);
        let url = format!(
            "{}/{}/resolve/{}/{file}",
            self.endpoint,
            id.repo,
            encode_component(rev)
        );
        let Some(meta) = self.head(&url, &shown)? else {
            if required {
                return Err(fail(format!("not found on the hub ({url})")));
            }
            if let Some(c) = commit.as_deref() {
                cache.mark_missing(c, file)?;
            }
            return Ok(None);
        };
        let got = meta.commit.ok_or_else(|| {
            fail(format!(
                "{url}: the server sent no X-Repo-Commit header (HF_ENDPOINT must be a hub or a mirror of one)"
            ))
        })?;
        if commit.is_none() {
            cache.write_ref(&id.revision, &got)?;
            *commit = Some(got.clone());
        }
        let etag = meta
            .etag
            .ok_or_else(|| fail(format!("{url}: the server sent no usable ETag")))?;
        let blob = cache.blob_path(&etag);
        // Another process may be fetching the same blob: wait for it, then look again.
        let _lock = cache.lock_blob(&etag)?;
        let cached = std::fs::metadata(&blob)
            .ok()
            .filter(|m| m.is_file() && meta.size.is_none_or(|n| n == m.len()));
        if cached.is_none() {
            self.download(&url, &blob, meta.size, &etag, &shown)?;
        }
        let c = commit.as_deref().unwrap_or(&got);
        cache.link(c, file, &etag).map(Some)
    }

    /// HEAD `url`: `None` on 404; redirects to other hosts are not followed (their headers are the
    /// answer), relative ones are.
    fn head(&self, url: &str, shown: &str) -> Result<Option<Meta>> {
        let mut url = url.to_owned();
        for _ in 0..MAX_REDIRECTS {
            let resp = self.call(true, &url, None)?;
            let status = resp.status().as_u16();
            let meta = Meta {
                commit: header(&resp, "x-repo-commit").filter(|c| is_key(c)),
                etag: header(&resp, "x-linked-etag")
                    .or_else(|| header(&resp, "etag"))
                    .and_then(|e| normalize_etag(&e)),
                // A redirect's Content-Length is its own body's: only the linked size counts then.
                size: header(&resp, "x-linked-size")
                    .or_else(|| {
                        (200..300)
                            .contains(&status)
                            .then(|| header(&resp, "content-length"))
                            .flatten()
                    })
                    .and_then(|s| s.parse().ok()),
            };
            match status {
                200..=299 => return Ok(Some(meta)),
                301..=308 => {
                    let loc = header(&resp, "location").unwrap_or_default();
                    let next = join_url(&url, &loc);
                    if host_of(&next) != host_of(&url) || meta.etag.is_some() {
                        return Ok(Some(meta));
                    }
                    url = next;
                }
                404 => return Ok(None),
                401 | 403 => {
                    return Err(Error::FileRead {
                        file: shown.to_owned(),
                        msg: format!(
                            "HTTP {status}: the repository is private or gated (set HF_TOKEN to a token with access)"
                        ),
                    })
                }
                _ => {
                    return Err(Error::FileRead {
                        file: shown.to_owned(),
                        msg: format!("HTTP {status} from {url}"),
                    })
                }
            }
        }
        Err(Error::FileRead {
            file: shown.to_owned(),
            msg: format!("more than {MAX_REDIRECTS} redirects"),
        })
    }
}
