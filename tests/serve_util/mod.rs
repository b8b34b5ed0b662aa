//! Helpers for the `florence2 serve` tests: start the server on a free loopback port with a fixture model,
//! a minimal HTTP/1.1 client over `TcpStream` (so a test controls exactly when a connection closes), SSE
//! parsing, and Prometheus metric lookup. Every wait is a bounded loop.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub fn model_dir(name: &str) -> PathBuf {
    fixtures().join("models").join(name)
}

/// A running `florence2 serve`; killed when dropped.
pub struct Server {
    pub child: Child,
    /// Kept open: the server's stdout must not become a broken pipe.
    _stdout: BufReader<std::process::ChildStdout>,
    pub addr: SocketAddr,
    pub key: Option<String>,
}

impl Server {
    /// `florence2 serve --model tests/fixtures/models/<model> --port 0 <args>` with `env`; returns once
    /// the address is printed (the model may still be loading). Weights are fp32 unless `args` name a
    /// `--dtype` (as `common::fixtures::cli_run` runs the CLI, so answers compare like for like).
    pub fn start(model: &str, args: &[&str], env: &[(&str, &str)]) -> Server {
        Server::start_with(model_dir(model).as_os_str(), args, env)
    }

    /// [`Server::start`] with `--model` as given (a directory or a hub id).
    pub fn start_with(model: &std::ffi::OsStr, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_florence2"));
        cmd.env("NODEVICE_SELECT", "1")
            .env_remove("FLORENCE2_API_KEY")
            // The kernel tuner's cache goes to target/, never to the user's cache directory.
            .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
            .args(["serve", "--model"])
            .arg(model)
            .args(["--port", "0"])
            .args(args)
            .args(if args.contains(&"--dtype") {
                &[][..]
            } else {
                &["--dtype", "fp32"][..]
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn florence2 serve");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout
            .read_line(&mut line)
            .expect("read the listening line");
        let addr = line
            .trim()
            .rsplit("http://")
            .next()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no address in {line:?}"));
        let key = args
            .iter()
            .position(|a| *a == "--api-key")
            .map(|i| args[i + 1].to_string());
        Server {
            child,
            _stdout: stdout,
            addr,
            key,
        }
    }

    /// Wait until `/health` answers 200 (bounded only by [`LAST_GUARD`]).
    pub fn wait_ready(&self) {
        let ok = poll_until(|| {
            try_request(self.addr, "GET", "/health", &[], b"").is_ok_and(|r| r.status == 200)
        });
        assert!(ok, "server not ready after {LAST_GUARD:?}");
    }

    fn auth(&self) -> Vec<(String, String)> {
        self.key
            .iter()
            .map(|k| ("Authorization".to_string(), format!("Bearer {k}")))
            .collect()
    }

    pub fn get(&self, path: &str) -> Resp {
        let h = self.auth();
        let h: Vec<(&str, &str)> = h.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        request(self.addr, "GET", path, &h, b"")
    }

    pub fn post_json(&self, path: &str, body: &Value) -> Resp {
        self.post_raw(path, &serde_json::to_vec(body).unwrap())
    }

    pub fn post_raw(&self, path: &str, body: &[u8]) -> Resp {
        let mut h = self.auth();
        h.push(("Content-Type".into(), "application/json".into()));
        let h: Vec<(&str, &str)> = h.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        request(self.addr, "POST", path, &h, body)
    }

    /// One Prometheus sample, e.g. `florence2_requests_total{outcome="ok"}`.
    pub fn metric(&self, sample: &str) -> f64 {
        metric(&self.get("/metrics").text(), sample)
    }

    /// Wait until `sample` reaches at least `value` (bounded only by [`LAST_GUARD`]).
    pub fn wait_metric(&self, sample: &str, value: f64) {
        let ok = poll_until(|| self.metric(sample) >= value);
        assert!(ok, "{sample} did not reach {value} in {LAST_GUARD:?}");
    }

    /// SIGTERM, then wait (bounded only by [`LAST_GUARD`]) for the exit status code.
    pub fn terminate(mut self) -> Option<i32> {
        let pid = self.child.id().to_string();
        let ok = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill -TERM failed");
        let mut status = None;
        let exited = poll_until(|| {
            status = self.child.try_wait().expect("wait");
            status.is_some()
        });
        assert!(
            exited,
            "server did not exit within {LAST_GUARD:?} of SIGTERM"
        );
        status.and_then(|st| st.code())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A sample's value in a Prometheus text exposition (0 when absent).
pub fn metric(text: &str, sample: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(sample)
                .and_then(|rest| rest.strip_prefix(' '))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0.0)
}

/// An HTTP response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// `data:` payloads of an SSE body, in order.
    pub fn sse_data(&self) -> Vec<String> {
        sse_data(&self.text())
    }
}

pub fn sse_data(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter_map(|ev| {
            let data: Vec<&str> = ev
                .lines()
                .filter_map(|l| {
                    l.strip_prefix("data:")
                        .map(|d| d.strip_prefix(' ').unwrap_or(d))
                })
                .collect();
            (!data.is_empty()).then(|| data.join("\n"))
        })
        .collect()
}

/// Write a request on a new connection (`Connection: close`).
pub fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).expect("write head");
    // The server may answer (413) and close before the whole body is written.
    let _ = s.write_all(body);
    s
}

/// Read one whole response from a `Connection: close` stream.
pub fn read_response(mut s: TcpStream) -> std::io::Result<Resp> {
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    parse_response(&raw)
}

pub fn parse_response(raw: &[u8]) -> std::io::Result<Resp> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no header end"))?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| bad("head not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("bad status line"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let rest = &raw[end + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        dechunk(rest)?
    } else {
        rest.to_vec()
    };
    Ok(Resp {
        status,
        headers,
        body,
    })
}

fn dechunk(mut b: &[u8]) -> std::io::Result<Vec<u8>> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let mut out = Vec::new();
    loop {
        let nl = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| bad("chunk size line"))?;
        let size_str = std::str::from_utf8(&b[..nl]).map_err(|_| bad("chunk size"))?;
        let size = usize::from_str_radix(size_str.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| bad("chunk size hex"))?;
        b = &b[nl + 2..];
        if size == 0 {
            return Ok(out);
        }
        if b.len() < size + 2 {
            return Err(bad("truncated chunk"));
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

pub fn try_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Resp> {
    read_response(send(addr, method, path, headers, body))
}

pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    try_request(addr, method, path, headers, body).expect("HTTP request")
}

/// `data:image/<kind>;base64,...` of a fixture image.
pub fn data_url(image: &str) -> String {
    use base64::Engine as _;
    let bytes = std::fs::read(fixtures().join("images").join(image)).unwrap();
    let ext = image.rsplit('.').next().unwrap_or_default();
    let kind = if ["png", "webp", "gif", "bmp"].contains(&ext) {
        ext
    } else {
        "jpeg"
    };
    format!(
        "data:image/{kind};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// A chat-completions body with one user message: `prompt` and the image URL.
pub fn chat_body(prompt: &str, url: &str, extra: Value) -> Value {
    let mut body = serde_json::json!({
        "model": "tiny4",
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": prompt},
            {"type": "image_url", "image_url": {"url": url}},
        ]}],
    });
    if let (Some(b), Value::Object(e)) = (body.as_object_mut(), extra) {
        b.extend(e);
    }
    body
}

/// The bound of every wait on a server event: a last guard against a hung server, not a timing
/// assumption. The waits return as soon as the event happens; a loaded machine (CI shares its cores)
/// only makes them take longer.
pub const LAST_GUARD: Duration = Duration::from_secs(300);

/// Poll `done` every 50 ms until it holds (true) or [`LAST_GUARD`] passes (false).
pub fn poll_until(mut done: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < LAST_GUARD {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    done()
}
