//! `--allow-remote-images`: fetching an `http(s)` image URL, bounded in bytes, time and redirects.
//!
//! Off by default: a server that fetches URLs its clients name can be pointed at hosts only it can reach
//! (cloud metadata endpoints, internal services), so docs/server.md asks for an egress-restricted network
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
//! - connects only to public addresses: every hop's host is resolved and loopback, private, link-local,
//!   unique-local and cloud-metadata addresses are refused before anything is sent (`guard.rs`), unless
//!   `--allow-private-remote-images`;
//! - accepts only PNG, JPEG, WebP, GIF or BMP bytes (checked from the magic bytes, as for data URLs).
//!
//! Every failure is a 400 with its own code (`image_too_large`, `remote_image_timeout`,
//! `remote_image_redirects`, `remote_image_redirect_refused`, `remote_image_address_refused`,
//! `remote_image_fetch_failed`, `invalid_image`).

use std::net::IpAddr;
use std::time::{Duration, Instant};

use ureq::unversioned::transport::DefaultConnector;

use super::error::{excerpt, ApiError};
use super::guard::{any_address, public_only, AddressRefused, GuardedResolver, Hosts};
use super::media::{image_kind, remote_scheme};

/// The limits of a remote image fetch.
#[derive(Clone, Debug)]
pub struct RemoteLimits {
    /// Largest body, in bytes (the image byte limit).
    pub max_bytes: usize,
    /// Total time for the whole fetch, redirects included.
    pub timeout: Duration,
    /// Redirects followed before giving up.
    pub max_redirects: u32,
    /// `--allow-private-remote-images`: connect to loopback, private, ... addresses too.
    pub allow_private: bool,
    /// Fixed name -> address answers before the system resolver (a test hook; empty in production).
    pub hosts: Hosts,
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
        ureq::Error::Other(e) if e.is::<AddressRefused>() => {
            ApiError::invalid_code(param, "remote_image_address_refused", e.to_string())
        }
        other => fetch_failed(param, other.to_string()),
    }
}

/// Fetch the image at `url` (already known to be http(s)) under `limits`: its image bytes.
pub fn fetch_image(param: &str, url: &str, limits: &RemoteLimits) -> Result<Vec<u8>, ApiError> {
    let may_connect = if limits.allow_private {
        any_address
    } else {
        public_only
    };
    fetch_image_with(param, url, limits, may_connect)
}

/// [`fetch_image`] connecting only to the addresses `may_connect` allows.
fn fetch_image_with(
    param: &str,
    url: &str,
    limits: &RemoteLimits,
    may_connect: fn(IpAddr) -> bool,
) -> Result<Vec<u8>, ApiError> {
    let deadline = Instant::now() + limits.timeout;
    let agent = agent(limits, may_connect);
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
        return read_image_body(param, limits, &mut resp);
    }
}

/// The HTTP agent of one image fetch: no redirects followed by itself (the caller checks each), no
/// proxy, names resolved by a [`GuardedResolver`] that only lets `may_connect` addresses through.
fn agent(limits: &RemoteLimits, may_connect: fn(IpAddr) -> bool) -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .proxy(None)
        .user_agent("florence2-serve")
        .max_response_header_size(64 * 1024)
        .build();
    let resolver = GuardedResolver {
        hosts: limits.hosts.clone(),
        may_connect,
    };
    ureq::Agent::with_parts(config, DefaultConnector::default(), resolver)
}

/// A successful answer's body, capped at `limits.max_bytes` (a larger Content-Length is refused
/// before reading), which must be an image file.
fn read_image_body(
    param: &str,
    limits: &RemoteLimits,
    resp: &mut ureq::http::Response<ureq::Body>,
) -> Result<Vec<u8>, ApiError> {
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
            "the body fetched from the image URL is not PNG, JPEG, WebP, GIF or BMP",
        ));
    }
    Ok(bytes)
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

    /// A one-thread HTTP origin on 127.0.0.1: `/img` a PNG signature and bytes, `/hop` a redirect to
    /// `http://internal.test:PORT/img`. Returns the port and the connection count.
    fn origin() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = hits.clone();
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let Ok(mut s) = s else { continue };
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && s.read(&mut b).is_ok_and(|n| n == 1) {
                    head.push(b[0]);
                }
                let reply = if head.starts_with(b"GET /hop ") {
                    format!(
                        "HTTP/1.1 302 Found\r\nLocation: http://internal.test:{port}/img\r\n\
                         Content-Length: 0\r\nConnection: close\r\n\r\n"
                    )
                    .into_bytes()
                } else {
                    let mut r =
                        b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nConnection: close\r\n\r\n"
                            .to_vec();
                    r.extend_from_slice(b"\x89PNG\r\n\x1a\nabcd");
                    r
                };
                let _ = s.write_all(&reply);
            }
        });
        (port, hits)
    }

    /// The guard with an injected resolver (`public.test` -> 127.0.0.1, `internal.test` -> 127.0.0.2)
    /// and a rule that counts only 127.0.0.1 as public: a redirect hop to a refused address is refused
    /// before it is contacted, as is a refused literal address.
    #[test]
    fn every_hop_is_resolved_and_checked_before_connecting() {
        let (port, hits) = origin();
        let hosts =
            super::super::guard::parse_hosts("public.test=127.0.0.1,internal.test=127.0.0.2")
                .unwrap();
        let limits = RemoteLimits {
            max_bytes: 1000,
            timeout: Duration::from_secs(20),
            max_redirects: 3,
            allow_private: false,
            hosts: std::sync::Arc::new(hosts),
        };
        fn only_127_0_0_1(ip: IpAddr) -> bool {
            ip == IpAddr::from([127, 0, 0, 1])
        }
        let get = |url: String| fetch_image_with("p", &url, &limits, only_127_0_0_1);
        let count = || hits.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            get(format!("http://public.test:{port}/img")).unwrap().len(),
            12
        );
        assert_eq!(count(), 1);
        for url in [
            format!("http://public.test:{port}/hop"),
            format!("http://internal.test:{port}/img"),
            format!("http://127.0.0.2:{port}/img"),
        ] {
            let e = get(url.clone()).unwrap_err();
            assert_eq!(
                e.code, "remote_image_address_refused",
                "{url}: {}",
                e.message
            );
            assert!(e.message.contains("127.0.0.2"), "{}", e.message);
        }
        // Only the first hop of /hop connected.
        assert_eq!(count(), 2);
        // The real rule refuses loopback; --allow-private-remote-images lets it through.
        let e = fetch_image("p", &format!("http://public.test:{port}/img"), &limits).unwrap_err();
        assert_eq!(e.code, "remote_image_address_refused");
        assert!(e.message.contains("loopback"), "{}", e.message);
        let open = RemoteLimits {
            allow_private: true,
            ..limits.clone()
        };
        assert!(fetch_image("p", &format!("http://internal.test:{port}/img"), &open).is_err());
        assert!(fetch_image("p", &format!("http://public.test:{port}/img"), &open).is_ok());
        assert_eq!(
            count(),
            3,
            "127.0.0.2 has no listener; the one fetch with the rule off"
        );
    }
}
