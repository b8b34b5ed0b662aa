//! `--allow-remote-images`: fetching an `http(s)` image URL, bounded in bytes, time and redirects.
//!
//! Off by default: a server that fetches URLs its clients name can be pointed at hosts only it can reach
//! (cloud metadata endpoints, internal services), so the README asks for an egress-restricted network
//! when this is on. When on, a fetch:
//! - runs on a blocking thread of the HTTP runtime (never on the GPU worker), after admission, so at most
//!   `--max-queue` + 1 fetches run at once and a slow remote holds only its own request's slot;
//! - speaks only `http` and `https` (rustls; no proxy from the environment, no compression, so the byte
//!   limit is the size on the wire); `file:` and every other scheme are refused, also as a redirect target;
//! - reads the body under the image byte limit (`--max-image-bytes`) while streaming it: a body that grows
//!   past the limit is cut off at limit + 1 bytes, whatever its `Content-Length` says (or does not say);
//! - has one total time budget (`--remote-image-timeout`): connect, TLS, headers, body and every
//!   redirect hop together;
//! - follows at most `--max-remote-redirects` redirects, resolved here (not by the client library) so
//!   that each target's scheme is checked before it is contacted;
//! - accepts only PNG or JPEG bytes (checked from the magic bytes, as for data URLs).
//!
//! Every failure is a 400 with its own code (`image_too_large`, `remote_image_timeout`,
//! `remote_image_redirects`, `remote_image_redirect_refused`, `remote_image_fetch_failed`,
//! `invalid_image`).

use std::time::{Duration, Instant};

use super::error::{excerpt, ApiError};
use super::media::{image_kind, remote_scheme};

/// The limits of a remote image fetch.
#[derive(Clone, Copy, Debug)]
pub struct RemoteLimits {
    /// Largest body, in bytes (the image byte limit).
    pub max_bytes: usize,
    /// Total time for the whole fetch, redirects included.
    pub timeout: Duration,
    /// Redirects followed before giving up.
    pub max_redirects: u32,
}

/// The target of a `Location` header relative to `base` (an absolute http(s) URL), or a refusal
/// naming the scheme when it is not http(s).
fn resolve(param: &str, base: &str, location: &str) -> Result<String, ApiError> {
    let location = location.trim();
    if remote_scheme(location).is_some() {
        return Ok(location.to_string());
    }
    let refused = || {
        ApiError::invalid_code(
            param,
            "remote_image_redirect_refused",
            format!(
                "the image URL redirected to {}; only http and https URLs are fetched",
                excerpt(location)
            ),
        )
    };
    // A scheme of its own (`file:`, `ftp:`, `data:`, ...): `scheme ":"` before any '/', '?' or '#'.
    if let Some(colon) = location.find(':') {
        if !location[..colon].contains(['/', '?', '#']) {
            return Err(refused());
        }
    }
    let scheme = remote_scheme(base).ok_or_else(refused)?;
    let after_scheme = &base[scheme.len() + 3..];
    let authority_end = after_scheme
        .find(['/', '?', '#'])
        .unwrap_or(after_scheme.len());
    let origin = &base[..scheme.len() + 3 + authority_end];
    if let Some(rest) = location.strip_prefix("//") {
        // Scheme-relative.
        Ok(format!("{scheme}://{rest}"))
    } else if location.starts_with('/') {
        Ok(format!("{origin}{location}"))
    } else {
        // Relative to the base's directory (query and fragment dropped).
        let path_and_more = &base[origin.len()..];
        let path = path_and_more.split(['?', '#']).next().unwrap_or_default();
        let dir = path.rfind('/').map_or("/", |i| &path[..=i]);
        Ok(format!("{origin}{dir}{location}"))
    }
}

fn fetch_failed(param: &str, what: String) -> ApiError {
    // Bounded: the client library's messages can quote the URL.
    let what: String = what.chars().take(200).collect();
    ApiError::invalid_code(
        param,
        "remote_image_fetch_failed",
        format!("fetching the image URL failed: {what}"),
    )
}

fn timed_out(param: &str, limits: &RemoteLimits) -> ApiError {
    ApiError::invalid_code(
        param,
        "remote_image_timeout",
        format!(
            "fetching the image URL took longer than {:.1} s (connect, redirects and body together)",
            limits.timeout.as_secs_f64()
        ),
    )
}

fn too_large(param: &str, limits: &RemoteLimits) -> ApiError {
    ApiError::invalid_code(
        param,
        "image_too_large",
        format!(
            "the image at the URL is larger than {} bytes, the most accepted",
            limits.max_bytes
        ),
    )
}

fn map_error(param: &str, limits: &RemoteLimits, e: ureq::Error) -> ApiError {
    match e {
        ureq::Error::Timeout(_) => timed_out(param, limits),
        ureq::Error::BodyExceedsLimit(_) => too_large(param, limits),
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => {
            timed_out(param, limits)
        }
        other => fetch_failed(param, other.to_string()),
    }
}

/// Fetch the image at `url` (already known to be http(s)) under `limits`: its PNG or JPEG bytes.
pub fn fetch_image(param: &str, url: &str, limits: &RemoteLimits) -> Result<Vec<u8>, ApiError> {
    let deadline = Instant::now() + limits.timeout;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .proxy(None)
        .user_agent("florence2-serve")
        .max_response_header_size(64 * 1024)
        .build()
        .into();
    let mut url = url.to_string();
    let mut redirects = 0u32;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out(param, limits));
        }
        let mut resp = agent
            .get(&url)
            .config()
            .timeout_global(Some(left))
            .build()
            .call()
            .map_err(|e| map_error(param, limits, e))?;
        let status = resp.status().as_u16();
        if matches!(status, 301 | 302 | 303 | 307 | 308) {
            let Some(location) = resp.headers().get("location").and_then(|v| v.to_str().ok())
            else {
                return Err(fetch_failed(
                    param,
                    format!("HTTP {status} without a Location header"),
                ));
            };
            if redirects >= limits.max_redirects {
                return Err(ApiError::invalid_code(
                    param,
                    "remote_image_redirects",
                    format!(
                        "the image URL redirected more than {} times",
                        limits.max_redirects
                    ),
                ));
            }
            url = resolve(param, &url, location)?;
            redirects += 1;
            continue;
        }
        if !(200..300).contains(&status) {
            return Err(fetch_failed(
                param,
                format!("the server answered HTTP {status}"),
            ));
        }
        let declared = resp
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n > limits.max_bytes as u64) {
            return Err(too_large(param, limits));
        }
        let bytes = resp
            .body_mut()
            .with_config()
            .limit(limits.max_bytes as u64)
            .read_to_vec()
            .map_err(|e| map_error(param, limits, e))?;
        if image_kind(&bytes).is_none() {
            return Err(ApiError::invalid_code(
                param,
                "invalid_image",
                "the body fetched from the image URL is neither PNG nor JPEG",
            ));
        }
        return Ok(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirect_targets_resolve_and_other_schemes_are_refused() {
        let base = "http://127.0.0.1:8/a/b.png?x=1";
        let ok = |l: &str| resolve("p", base, l).unwrap();
        assert_eq!(ok("https://h/x"), "https://h/x");
        assert_eq!(ok("/c.png"), "http://127.0.0.1:8/c.png");
        assert_eq!(ok("c.png"), "http://127.0.0.1:8/a/c.png");
        assert_eq!(ok("//h:9/c"), "http://h:9/c");
        assert_eq!(ok("c.png?y=a:b"), "http://127.0.0.1:8/a/c.png?y=a:b");
        for l in [
            "file:///etc/passwd",
            "FILE:/etc/passwd",
            "data:image/png;base64,AA",
            "ftp://h/x",
        ] {
            let e = resolve("p", base, l).unwrap_err();
            assert_eq!(e.code, "remote_image_redirect_refused", "{l}");
        }
    }
}
