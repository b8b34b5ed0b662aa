//! The access log: one line per request on stderr, written when the request is done (for an SSE stream,
//! when the stream ends or the client leaves): method, path (never the query), status, the tokens the
//! model generated for it (none for requests that generate nothing) and the milliseconds from the
//! request's arrival. `--log-format text` (the default) writes
//! `florence2 serve: POST /v1/chat/completions 200 tokens=12 ms=345.6`; `--log-format json` one JSON
//! object `{"method", "path", "status", "tokens", "ms"}` per line, for log collectors.

use std::io::Write;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::json;

/// How access-log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// `--log-format`: text or json.
pub fn parse_format(s: &str) -> Result<LogFormat, String> {
    match s {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        _ => Err(format!("takes text or json, got {s:?}")),
    }
}

/// No token count recorded.
const NO_TOKENS: u64 = u64::MAX;

/// One request's line, written when the last holder drops it: the middleware, and the handler or the
/// SSE stream that records the tokens (found in the request's extensions).
pub struct Entry {
    format: LogFormat,
    method: String,
    path: String,
    start: Instant,
    status: AtomicU16,
    tokens: AtomicU64,
}

impl Entry {
    fn new(format: LogFormat, req: &Request) -> Entry {
        Entry {
            format,
            method: req.method().as_str().to_string(),
            path: req.uri().path().to_string(),
            start: Instant::now(),
            status: AtomicU16::new(0),
            tokens: AtomicU64::new(NO_TOKENS),
        }
    }

    /// The tokens generated for the request.
    pub fn set_tokens(&self, n: usize) {
        self.tokens.store(n as u64, Ordering::Relaxed);
    }

    /// The line, without its newline.
    fn line(&self) -> String {
        let ms = (self.start.elapsed().as_secs_f64() * 1e4).round() / 10.0;
        let status = self.status.load(Ordering::Relaxed);
        let tokens = Some(self.tokens.load(Ordering::Relaxed)).filter(|&n| n != NO_TOKENS);
        match self.format {
            LogFormat::Json => json!({
                "method": self.method,
                "path": self.path,
                "status": status,
                "tokens": tokens,
                "ms": ms,
            })
            .to_string(),
            LogFormat::Text => format!(
                "florence2 serve: {} {} {status} tokens={} ms={ms:.1}",
                self.method,
                self.path.escape_debug(),
                tokens.map_or("-".to_string(), |n| n.to_string()),
            ),
        }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        // A closed stderr loses the line, never the request.
        let _ = writeln!(std::io::stderr().lock(), "{}", self.line());
    }
}

/// The middleware: an [`Entry`] in the request's extensions, its status set from the response.
pub async fn access_log(State(format): State<LogFormat>, mut req: Request, next: Next) -> Response {
    let entry = Arc::new(Entry::new(format, &req));
    req.extensions_mut().insert(entry.clone());
    let resp = next.run(req).await;
    entry
        .status
        .store(resp.status().as_u16(), Ordering::Relaxed);
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(format: LogFormat) -> Entry {
        let req = Request::builder()
            .method("POST")
            .uri("/v1/chat/completions?secret=1")
            .body(axum::body::Body::empty())
            .unwrap();
        let e = Entry::new(format, &req);
        e.status.store(200, Ordering::Relaxed);
        e
    }

    #[test]
    fn lines_name_method_path_status_tokens_and_time() {
        let e = entry(LogFormat::Json);
        let v: serde_json::Value = serde_json::from_str(&e.line()).unwrap();
        assert_eq!(v["method"], "POST");
        assert_eq!(v["path"], "/v1/chat/completions");
        assert_eq!(v["status"], 200);
        assert_eq!(v["tokens"], serde_json::Value::Null);
        assert!(v["ms"].as_f64().is_some_and(|ms| ms >= 0.0));
        e.set_tokens(12);
        let v: serde_json::Value = serde_json::from_str(&e.line()).unwrap();
        assert_eq!(v["tokens"], 12);

        let e = entry(LogFormat::Text);
        let line = e.line();
        assert!(
            line.starts_with("florence2 serve: POST /v1/chat/completions 200 tokens=- ms="),
            "{line}"
        );
        assert!(!line.contains("secret"), "{line}");
        assert_eq!(parse_format("json"), Ok(LogFormat::Json));
        assert!(parse_format("xml").is_err());
    }
}
