//! What a generic OpenAI client meets: a prompt without a task marker runs `--default-task` and the
//! answer says so (`florence2_result.default_task`), a `model` the server does not serve is a 404
//! `model_not_found` in the OpenAI error shape (the served id and its case variants are accepted), and
//! every request writes one access-log line on stderr (method, path, status, generated tokens, ms; JSON
//! with `--log-format json`). The server runs with stderr captured, so the log is read as it is written.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use serde_json::{json, Value};

use crate::serve_util::*;

/// A `florence2 serve` on tiny4 (fp32) whose stderr lines arrive on `log`; killed when dropped.
struct LoggedServer {
    child: Child,
    addr: SocketAddr,
    log: Receiver<String>,
}

impl LoggedServer {
    fn start(args: &[&str]) -> LoggedServer {
        let mut child = Command::new(env!("CARGO_BIN_EXE_florence2"))
            .env("NODEVICE_SELECT", "1")
            .env_remove("FLORENCE2_API_KEY")
            .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
            .args(["serve", "--model"])
            .arg(model_dir("tiny4"))
            .args(["--port", "0", "--dtype", "fp32"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn florence2 serve");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, log) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("the listening line");
        // The server's stdout stays open (no broken pipe) for as long as the reader lives.
        std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        let addr = line
            .trim()
            .rsplit("http://")
            .next()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no address in {line:?}"));
        let server = LoggedServer { child, addr, log };
        server.wait_ready();
        server
    }

    /// Bounded (120 s) wait until `/health` answers 200.
    fn wait_ready(&self) {
        for _ in 0..1200 {
            if try_request(self.addr, "GET", "/health", &[], b"").is_ok_and(|r| r.status == 200) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("server not ready after 120 s");
    }

    fn chat(&self, body: &Value) -> Resp {
        let h = [("Content-Type", "application/json")];
        request(
            self.addr,
            "POST",
            "/v1/chat/completions",
            &h,
            &serde_json::to_vec(body).unwrap(),
        )
    }

    /// The next stderr line that `pick` takes (bounded: 60 s per line; lines it skips are dropped).
    fn next_log<T>(&self, mut pick: impl FnMut(&str) -> Option<T>) -> T {
        loop {
            let line = self
                .log
                .recv_timeout(Duration::from_secs(60))
                .expect("an access-log line within 60 s");
            if let Some(v) = pick(&line) {
                return v;
            }
        }
    }

    /// The next JSON access-log line for `path`.
    fn next_json_log(&self, path: &str) -> Value {
        self.next_log(|l| {
            serde_json::from_str::<Value>(l)
                .ok()
                .filter(|v| v["path"] == path)
        })
    }
}

impl Drop for LoggedServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn greedy(prompt: &str, extra: Value) -> Value {
    let mut b = chat_body(
        prompt,
        &data_url("scene.png"),
        json!({"max_tokens": 8, "num_beams": 1}),
    );
    if let (Some(b), Value::Object(e)) = (b.as_object_mut(), extra) {
        b.extend(e);
    }
    b
}

const CHAT: &str = "/v1/chat/completions";

#[test]
fn plain_text_runs_the_default_task_unknown_models_are_404_and_each_request_is_logged() {
    let server = LoggedServer::start(&["--log-format", "json"]);

    // A plain question runs <MORE_DETAILED_CAPTION> (which takes no text) and says so.
    let r = server.chat(&greedy("What is in this image?", json!({})));
    assert_eq!(r.status, 200, "{}", r.text());
    let plain = r.json();
    let f2 = &plain["choices"][0]["message"]["florence2_result"];
    assert_eq!(f2["task"], "<MORE_DETAILED_CAPTION>");
    assert_eq!(
        f2["default_task"],
        json!({"task": "<MORE_DETAILED_CAPTION>", "text_used": false})
    );
    let line = server.next_json_log(CHAT);
    assert_eq!(line["method"], "POST");
    assert_eq!(line["status"], 200);
    assert_eq!(line["tokens"], plain["usage"]["completion_tokens"]);
    assert!(line["ms"].as_f64().is_some_and(|ms| ms > 0.0), "{line}");

    // The same answer as the marker itself, which carries no default_task.
    let r = server.chat(&greedy("<MORE_DETAILED_CAPTION>", json!({})));
    let marked = r.json();
    let m2 = &marked["choices"][0]["message"]["florence2_result"];
    assert_eq!(m2["token_ids"], f2["token_ids"]);
    assert_eq!(m2.get("default_task"), None);
    assert_eq!(server.next_json_log(CHAT)["status"], 200);

    // Streamed: logged when the stream ends, with its tokens.
    let r = server.chat(&greedy("", json!({"stream": true})));
    assert_eq!(r.status, 200);
    let chunk = r
        .sse_data()
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|c| c["choices"][0]["delta"].get("florence2_result").cloned())
        .expect("a chunk with florence2_result");
    assert_eq!(chunk["default_task"]["task"], "<MORE_DETAILED_CAPTION>");
    let line = server.next_json_log(CHAT);
    let generated = chunk["token_ids"].as_array().unwrap().len() - 1;
    assert_eq!(
        (line["status"].clone(), line["tokens"].clone()),
        (json!(200), json!(generated))
    );

    // Another model's name: 404 in the OpenAI shape, nothing run.
    let r = server.chat(&greedy("<OD>", json!({"model": "gpt-4o"})));
    assert_eq!(r.status, 404, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!(e["code"], "model_not_found");
    assert_eq!(e["type"], "invalid_request_error");
    assert_eq!(e["param"], "model");
    assert!(e["message"].as_str().unwrap().contains("gpt-4o"), "{e}");
    let line = server.next_json_log(CHAT);
    assert_eq!(
        (line["status"].clone(), line["tokens"].clone()),
        (json!(404), Value::Null)
    );

    // The served id in another case is the served model (then the prompt is judged: 400).
    let r = server.chat(&greedy("<NOPE>", json!({"model": "TINY4"})));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "invalid_prompt");
    assert_eq!(server.next_json_log(CHAT)["status"], 400);

    // /v1/models/{id} by the same rule.
    assert_eq!(
        request(server.addr, "GET", "/v1/models/TINY4", &[], b"").status,
        200
    );
    let r = request(server.addr, "GET", "/v1/models/gpt-4o", &[], b"");
    assert_eq!(
        (r.status, &r.json()["error"]["code"]),
        (404, &json!("model_not_found"))
    );
    assert_eq!(server.next_json_log("/v1/models/TINY4")["status"], 200);
    assert_eq!(server.next_json_log("/v1/models/gpt-4o")["status"], 404);
}

#[test]
fn the_default_task_is_a_flag_and_the_text_log_is_one_line_per_request() {
    let server = LoggedServer::start(&["--default-task", "od"]);
    let r = server.chat(&greedy("anything at all", json!({})));
    assert_eq!(r.status, 200, "{}", r.text());
    let answer = r.json();
    let f2 = &answer["choices"][0]["message"]["florence2_result"];
    assert_eq!(
        f2["default_task"],
        json!({"task": "<OD>", "text_used": false})
    );
    let tokens = answer["usage"]["completion_tokens"].as_u64().unwrap();
    let want = format!("florence2 serve: POST {CHAT} 200 tokens={tokens} ms=");
    let line = server.next_log(|l| l.contains(" POST ").then(|| l.to_string()));
    assert!(line.starts_with(&want), "{line}");
    let ms: f64 = line[want.len()..].parse().unwrap();
    assert!(ms > 0.0, "{line}");

    // A flag value that is not a built-in task without input is a usage error.
    let o = Command::new(env!("CARGO_BIN_EXE_florence2"))
        .args(["serve", "--model", "x", "--default-task", "<OD>cats"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--default-task"));
}
