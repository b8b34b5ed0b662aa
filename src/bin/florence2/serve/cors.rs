//! `--cors-origin`: lets browser pages on other origins call the server.
//!
//! A request whose `Origin` is allowed (one of the listed origins, or any with `*`) gets
//! `Access-Control-Allow-Origin` (the origin itself, or `*`) and `Access-Control-Expose-Headers:
//! Retry-After`; with a list, every answer says `Vary: Origin`. A preflight (`OPTIONS` with
//! `Access-Control-Request-Method`) from an allowed origin is answered here with 204, the methods (GET,
//! POST), the request headers asked for (`Authorization` and `Content-Type` included) and a max age of
//! 10 minutes; it needs no API key (browsers send none on a preflight). Other requests pass through
//! without CORS headers: a page on an origin not listed is refused by its browser.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The allowed origins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CorsOrigins {
    Any,
    List(Vec<String>),
}

impl CorsOrigins {
    /// From the `--cors-origin` values (`None` when there are none).
    pub fn from_args(origins: &[String]) -> Option<CorsOrigins> {
        if origins.is_empty() {
            None
        } else if origins.iter().any(|o| o == "*") {
            Some(CorsOrigins::Any)
        } else {
            Some(CorsOrigins::List(origins.to_vec()))
        }
    }

    fn allows(&self, origin: &str) -> bool {
        match self {
            CorsOrigins::Any => true,
            CorsOrigins::List(list) => list.iter().any(|o| o == origin),
        }
    }
}

/// `*`, or an origin as browsers send it: `http(s)://host[:port]`, no path (lower-cased).
pub fn parse_origin(s: &str) -> Result<String, String> {
    if s == "*" {
        return Ok(s.into());
    }
    let lower = s.trim().to_ascii_lowercase();
    let rest = lower
        .strip_prefix("https://")
        .or_else(|| lower.strip_prefix("http://"));
    let ok = rest.is_some_and(|r| {
        !r.is_empty()
            && r.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
    });
    if ok {
        Ok(lower)
    } else {
        Err(format!(
            "takes '*' or an origin like https://app.example.com[:port] (no path), got {s:?}"
        ))
    }
}

fn value(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static("null"))
}

/// `Vary: Origin` on every answer when the answer depends on the origin (a list, not `*`), so a cache
/// never hands one origin's answer to another.
fn vary(headers: &mut HeaderMap, origins: &CorsOrigins) {
    if *origins != CorsOrigins::Any {
        headers.append(header::VARY, HeaderValue::from_static("Origin"));
    }
}

/// The headers every answer to an allowed origin carries.
fn allow(headers: &mut HeaderMap, origins: &CorsOrigins, origin: &str) {
    if *origins == CorsOrigins::Any {
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_ORIGIN,
            HeaderValue::from_static("*"),
        );
    } else {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value(origin));
    }
    headers.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("Retry-After"),
    );
}

/// The answer to an allowed preflight.
fn preflight(req: &Request, origins: &CorsOrigins, origin: &str) -> Response {
    let mut resp = StatusCode::NO_CONTENT.into_response();
    let h = resp.headers_mut();
    allow(h, origins, origin);
    vary(h, origins);
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    let asked = req
        .headers()
        .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .cloned()
        .unwrap_or_else(|| HeaderValue::from_static("authorization, content-type"));
    h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked);
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    resp
}

/// The middleware (installed only with `--cors-origin`).
pub async fn cors(State(origins): State<Arc<CorsOrigins>>, req: Request, next: Next) -> Response {
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let origin = origin.filter(|o| origins.allows(o));
    let is_preflight = req.method() == Method::OPTIONS
        && req
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if let (Some(o), true) = (&origin, is_preflight) {
        return preflight(&req, &origins, o);
    }
    let mut resp = next.run(req).await;
    if let Some(o) = &origin {
        allow(resp.headers_mut(), &origins, o);
    }
    vary(resp.headers_mut(), &origins);
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_parse_as_browsers_send_them() {
        assert_eq!(parse_origin("*").unwrap(), "*");
        assert_eq!(
            parse_origin("HTTPS://App.Example.com:8443").unwrap(),
            "https://app.example.com:8443"
        );
        assert_eq!(
            parse_origin("http://[::1]:3000").unwrap(),
            "http://[::1]:3000"
        );
        for bad in [
            "app.example.com",
            "https://a/b",
            "ftp://a",
            "https://",
            "https://a b",
        ] {
            assert!(parse_origin(bad).is_err(), "{bad}");
        }
        let list = CorsOrigins::from_args(&["https://a.example".into()]).unwrap();
        assert!(list.allows("https://a.example"));
        assert!(!list.allows("https://b.example"));
        assert_eq!(
            CorsOrigins::from_args(&["https://a.example".into(), "*".into()]),
            Some(CorsOrigins::Any)
        );
        assert_eq!(CorsOrigins::from_args(&[]), None);
    }
}
