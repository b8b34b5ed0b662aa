//! A hub-shaped server on loopback for the hub-cache and `serve` tests: the hub (`/ORG/NAME/resolve/REV/FILE`)
//! on one port and its storage host (large files redirect there) on another, serving the fixture model
//! directories, with [`Quirks`] that make it misbehave (cut, corrupt, hold a body mid-way behind a
//! [`Gate`]).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use florence2_wasm::hub_cache::HubCacheOptions;
use sha1::Digest;

pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/models")
        .join(name)
}

/// One request the servers saw: (server, method, path, Authorization header).
pub type Seen = Arc<Mutex<Vec<(&'static str, String, String, Option<String>)>>>;

/// How the fake hub misbehaves.
#[derive(Clone, Default)]
pub struct Quirks {
    /// ETag header value sent for every file instead of the real one.
    pub etag: Option<String>,
    /// Answer 401 to everything.
    pub private: bool,
    /// The storage host cuts its first GET after half the body.
    pub cut_first_get: bool,
    /// The storage host sends the weights with their last byte flipped.
    pub corrupt: bool,
    /// The storage host sends this many bytes more than announced.
    pub overlong: usize,
    /// The storage host answers a range request with a Content-Range from byte 0.
    pub bad_range: bool,
    /// The storage host holds its first GET until the gate opens.
    pub gate: Option<Gate>,
    /// The storage host sends half of its first GET's body, then holds the connection until the gate
    /// opens (and then drops it).
    pub stall_mid_body: Option<Gate>,
    /// The storage host sends half of its first GET's body, holds until the gate opens, then sends
    /// the rest (a slow download that completes).
    pub hold_mid_body: Option<Gate>,
    /// X-Linked-Size header value sent for the weights instead of their real length.
    pub linked_size: Option<String>,
    /// Small files' bodies with this (from, to) substring replaced (and their ETag computed after).
    pub rewrite: Option<(String, String)>,
    /// The storage host answers every request with a redirect to the same path (a loop).
    pub redirect_loop: bool,
}

/// A gate a server thread waits on until the test opens it.
#[derive(Clone, Default)]
pub struct Gate(Arc<(Mutex<bool>, std::sync::Condvar)>);

impl Gate {
    pub fn open(&self) {
        *self.0 .0.lock().unwrap() = true;
        self.0 .1.notify_all();
    }

    pub fn wait(&self) {
        let mut open = self.0 .0.lock().unwrap();
        while !*open {
            open = self.0 .1.wait(open).unwrap();
        }
    }
}

/// A hub on one port and its storage host (large files redirect there) on another. Every repository
/// `ORG/NAME` serves the fixture directory `NAME` at revisions `main` and COMMIT.
pub struct Hub {
    pub endpoint: String,
    pub seen: Seen,
    /// The Range headers the storage host got.
    pub ranges: Arc<Mutex<Vec<String>>>,
    _threads: Vec<std::thread::JoinHandle<()>>,
}

/// The hub's ETag of `bytes`: the sha256 of an LFS file, the git blob sha1 of a small one.
pub fn fake_etag(bytes: &[u8], long: bool) -> String {
    let hex = |d: &[u8]| d.iter().map(|b| format!("{b:02x}")).collect::<String>();
    if long {
        hex(&sha2::Sha256::digest(bytes))
    } else {
        let mut h = sha1::Sha1::new();
        h.update(format!("blob {}\0", bytes.len()).as_bytes());
        h.update(bytes);
        hex(&h.finalize())
    }
}

pub fn respond(
    s: &mut TcpStream,
    status: &str,
    headers: &[(String, String)],
    body: &[u8],
    head: bool,
) {
    let mut out = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let _ = s.write_all(out.as_bytes());
    if !head {
        let _ = s.write_all(body);
    }
}

/// (method, path, headers) of one request.
pub fn read_request(s: &TcpStream) -> Option<(String, String, HashMap<String, String>)> {
    let mut r = BufReader::new(s.try_clone().ok()?);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next()?.to_owned(), parts.next()?.to_owned());
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).ok()? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    Some((method, path, headers))
}

impl Hub {
    pub fn start(quirks: Quirks) -> Hub {
        let hub = TcpListener::bind("127.0.0.1:0").unwrap();
        let cdn = TcpListener::bind("127.0.0.1:0").unwrap();
        let cdn_base = format!("http://{}", cdn.local_addr().unwrap());
        let endpoint = format!("http://{}", hub.local_addr().unwrap());
        let seen: Seen = Arc::default();
        let (s1, s2) = (seen.clone(), seen.clone());
        let cdn_quirks = quirks.clone();
        let t1 = std::thread::spawn(move || {
            for conn in hub.incoming() {
                let Ok(mut c) = conn else { continue };
                let Some((method, path, headers)) = read_request(&c) else {
                    continue;
                };
                s1.lock().unwrap().push((
                    "hub",
                    method.clone(),
                    path.clone(),
                    headers.get("authorization").cloned(),
                ));
                hub_answer(&mut c, &method, &path, &cdn_base, &quirks);
            }
        });
        let ranges: Arc<Mutex<Vec<String>>> = Arc::default();
        let r2 = ranges.clone();
        let t2 = std::thread::spawn(move || {
            let mut cut = cdn_quirks.cut_first_get;
            let mut gate = cdn_quirks.gate.clone();
            let mut stall = cdn_quirks.stall_mid_body.clone();
            let mut hold = cdn_quirks.hold_mid_body.clone();
            for conn in cdn.incoming() {
                let Ok(mut c) = conn else { continue };
                let Some((method, path, headers)) = read_request(&c) else {
                    continue;
                };
                s2.lock().unwrap().push((
                    "cdn",
                    method.clone(),
                    path.clone(),
                    headers.get("authorization").cloned(),
                ));
                if let Some(r) = headers.get("range") {
                    r2.lock().unwrap().push(r.clone());
                }
                // /NAME/FILE
                let file = path
                    .trim_start_matches('/')
                    .split_once('/')
                    .map(|(n, f)| fixture(n).join(f));
                let Some(b) = file.and_then(|f| std::fs::read(f).ok()) else {
                    respond(&mut c, "404 Not Found", &[], b"", method == "HEAD");
                    continue;
                };
                if cdn_quirks.redirect_loop {
                    let h = [("Location".to_string(), path.clone())];
                    respond(&mut c, "302 Found", &h, b"", method == "HEAD");
                    continue;
                }
                if method == "GET" {
                    if let Some(g) = gate.take() {
                        g.wait();
                    }
                }
                if let Some(g) = (method == "GET").then(|| stall.take()).flatten() {
                    let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", b.len());
                    let _ = c.write_all(head.as_bytes());
                    let _ = c.write_all(&b[..b.len() / 2]);
                    let _ = c.flush();
                    g.wait();
                    continue;
                }
                if let Some(g) = (method == "GET").then(|| hold.take()).flatten() {
                    let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", b.len());
                    let _ = c.write_all(head.as_bytes());
                    let _ = c.write_all(&b[..b.len() / 2]);
                    let _ = c.flush();
                    g.wait();
                    let _ = c.write_all(&b[b.len() / 2..]);
                    continue;
                }
                if method == "GET" && std::mem::take(&mut cut) {
                    let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", b.len());
                    let _ = c.write_all(head.as_bytes());
                    let _ = c.write_all(&b[..b.len() / 2]);
                    continue; // the connection drops mid-body
                }
                cdn_answer(&mut c, &method, headers.get("range"), b, &cdn_quirks);
            }
        });
        Hub {
            endpoint,
            seen,
            ranges,
            _threads: vec![t1, t2],
        }
    }

    pub fn options(&self, cache: &Path) -> HubCacheOptions {
        HubCacheOptions {
            endpoint: self.endpoint.clone(),
            cache_dir: cache.to_path_buf(),
            offline: false,
            token: Some("hf_secret".into()),
            verbose: false,
            progress: None,
        }
    }

    pub fn count(&self, server: &str, method: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.0 == server && r.1 == method)
            .count()
    }
}

/// The hub's `/ORG/NAME/resolve/REV/FILE`: small files inline with their ETag, weights as a redirect to
/// the storage host with `X-Linked-Etag`/`X-Linked-Size`, missing files 404 with `X-Repo-Commit`.
pub fn hub_answer(c: &mut TcpStream, method: &str, path: &str, cdn: &str, q: &Quirks) {
    let head = method == "HEAD";
    if q.private {
        return respond(c, "401 Unauthorized", &[], b"", head);
    }
    let parts: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    let [_org, name, "resolve", rev, file] = parts[..] else {
        return respond(c, "404 Not Found", &[], b"", head);
    };
    if rev != "main" && rev != COMMIT {
        return respond(
            c,
            "404 Not Found",
            &[("X-Error-Code".into(), "RevisionNotFound".into())],
            b"",
            head,
        );
    }
    let commit = ("X-Repo-Commit".to_string(), COMMIT.to_string());
    let Ok(mut bytes) = std::fs::read(fixture(name).join(file)) else {
        return respond(
            c,
            "404 Not Found",
            &[commit, ("X-Error-Code".into(), "EntryNotFound".into())],
            b"",
            head,
        );
    };
    let large = file.ends_with(".safetensors") || file.ends_with(".bin");
    if let (Some((from, to)), false) = (&q.rewrite, large) {
        bytes = String::from_utf8_lossy(&bytes)
            .replace(from.as_str(), to)
            .into_bytes();
    }
    let etag = q
        .etag
        .clone()
        .unwrap_or_else(|| format!("\"{}\"", fake_etag(&bytes, large)));
    if large {
        let h = vec![
            commit,
            ("X-Linked-Etag".into(), etag),
            (
                "X-Linked-Size".into(),
                q.linked_size.clone().unwrap_or(bytes.len().to_string()),
            ),
            ("Location".into(), format!("{cdn}/{name}/{file}")),
        ];
        respond(c, "302 Found", &h, b"", head)
    } else {
        respond(c, "200 OK", &[commit, ("ETag".into(), etag)], &bytes, head)
    }
}

/// The storage host's answer: the bytes (as the quirks spoil them), from `Range: bytes=N-` if asked.
pub fn cdn_answer(c: &mut TcpStream, method: &str, range: Option<&String>, b: Vec<u8>, q: &Quirks) {
    let mut b = b;
    if q.corrupt {
        if let Some(last) = b.last_mut() {
            *last ^= 1;
        }
    }
    b.extend(std::iter::repeat_n(0u8, q.overlong));
    let from = range
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.parse::<usize>().ok());
    match from {
        Some(n) if n < b.len() => {
            let start = if q.bad_range { 0 } else { n };
            let cr = format!("bytes {start}-{}/{}", b.len() - 1, b.len());
            let h = [("Content-Range".to_string(), cr)];
            respond(c, "206 Partial Content", &h, &b[n..], method == "HEAD")
        }
        Some(_) => respond(c, "416 Range Not Satisfiable", &[], b"", method == "HEAD"),
        None => respond(c, "200 OK", &[], &b, method == "HEAD"),
    }
}
