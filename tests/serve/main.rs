//! `florence2 serve` end to end: the server runs as a child process on a free loopback port with the
//! `tiny4` fixture model; the tests speak HTTP to it over `TcpStream` (tests/serve_util). Covered: every
//! route, every error status (400 validation, 401, 404, 405, 413, 429, 503 loading), answers equal to
//! `florence2 run --json` (token ids, content, result) greedy and with beam search, streaming (SSE, equal
//! to the non-streamed answer), isolation (B after A equals B alone), disconnect cancellation while
//! queued (no encoder pass) and while decoding (within one step), SIGTERM (exit 0), and remote image
//! URLs (`--allow-remote-images`) against a loopback origin written in the test. `web_clients.rs`: CORS,
//! a model's own task markers, WebP/GIF/BMP inputs; `guards.rs`: the remote-image address guard, the
//! queued-image budget, the out-of-memory answer; `download.rs`: a hub id downloaded while the server
//! listens (the loopback hub of tests/common/hub.rs).
//!
//! Waits are bounded polls of `/health` or `/metrics`; the worker-hold test hook
//! (`FLORENCE2_SERVE_HOLD_FILE`, see src/bin/florence2/serve/worker.rs) makes the queue and cancellation
//! tests deterministic instead of timed.
#![cfg(not(target_arch = "wasm32"))]

#[path = "../common/mod.rs"]
mod common;
#[path = "../serve_util/mod.rs"]
mod serve_util;

mod batching;
mod contract;
mod download;
mod guards;
mod soak;
mod tiles;
mod web_clients;

use serde_json::{json, Value};
use serve_util::*;

/// The reference case of `tiny4` for `task` (image, prompt, max_new_tokens).
fn case(task: &str) -> Value {
    common::fixtures::cases("tiny4")
        .into_iter()
        .find(|c| c["task"] == task)
        .unwrap_or_else(|| panic!("no tiny4 case for {task}"))
}

fn prompt_of(c: &Value) -> String {
    format!(
        "{}{}",
        c["task"].as_str().unwrap(),
        c["text_input"].as_str().unwrap()
    )
}

/// A chat body for a reference case, with `extra` fields.
fn case_body(c: &Value, extra: Value) -> Value {
    let mut extra = extra;
    extra["max_tokens"] = c["max_new_tokens"].clone();
    chat_body(
        &prompt_of(c),
        &data_url(c["image"].as_str().unwrap()),
        extra,
    )
}

/// The answer must equal `florence2 run --json` on the same case: token ids, rendered text, result.
fn assert_same_as_cli(answer: &Value, cli: &Value, what: &str) {
    let msg = &answer["choices"][0]["message"];
    let f2 = &msg["florence2_result"];
    assert_eq!(f2["token_ids"], cli["token_ids"], "{what}: token ids");
    assert_eq!(
        f2["generated_text"], cli["generated_text"],
        "{what}: generated text"
    );
    assert_eq!(f2["result"], cli["result"], "{what}: result");
    assert_eq!(f2["task"], cli["task"], "{what}: task");
    assert_eq!(msg["content"], cli["text"], "{what}: content");
}

fn error_of(r: &Resp) -> Value {
    let v = r.json();
    let e = &v["error"];
    assert!(e["message"].is_string(), "error shape: {v}");
    assert!(e["type"].is_string(), "error shape: {v}");
    assert!(
        e.get("param").is_some() && e.get("code").is_some(),
        "error shape: {v}"
    );
    e.clone()
}

fn assert_error(r: &Resp, status: u16, code: &str, what: &str) -> Value {
    assert_eq!(r.status, status, "{what}: {}", r.text());
    let e = error_of(r);
    assert_eq!(e["code"], code, "{what}: {e}");
    e
}

#[test]
fn answers_match_the_cli_and_streaming_and_isolation() {
    let server = Server::start("tiny4", &[], &[]);
    server.wait_ready();

    // Routes.
    let h = server.get("/health");
    assert_eq!(h.status, 200);
    assert_eq!(h.json()["status"], "ok");
    let m = server.get("/v1/models").json();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], "tiny4");
    assert_eq!(m["data"][0]["object"], "model");
    assert_eq!(server.get("/v1/models/tiny4").status, 200);
    assert_error(
        &server.get("/v1/models/other"),
        404,
        "model_not_found",
        "unknown model",
    );
    assert_error(
        &server.get("/v1/nothing"),
        404,
        "not_found",
        "unknown route",
    );
    assert_error(
        &server.get("/v1/chat/completions"),
        405,
        "method_not_allowed",
        "GET chat",
    );

    // Greedy and beam search answers equal the CLI's, for a text task and located tasks.
    for (task, beams) in [
        ("<CAPTION>", 1),
        ("<OD>", 3),
        ("<CAPTION_TO_PHRASE_GROUNDING>", 1),
    ] {
        let c = case(task);
        let cli = common::fixtures::cli_run("tiny4", &c, &["--num-beams", &beams.to_string()]);
        let r = server.post_json(
            "/v1/chat/completions",
            &case_body(&c, json!({"num_beams": beams})),
        );
        assert_eq!(r.status, 200, "{task}: {}", r.text());
        let a = r.json();
        assert_same_as_cli(&a, &cli, task);
        assert_eq!(a["object"], "chat.completion");
        assert_eq!(a["model"], "tiny4");
        assert_eq!(a["choices"][0]["message"]["role"], "assistant");
        let ids = cli["token_ids"].as_array().unwrap();
        let usage = &a["usage"];
        assert_eq!(usage["completion_tokens"], ids.len() - 1, "{task}: usage");
        let encoder_tokens = c["num_image_tokens"].as_u64().unwrap()
            + c["prompt_ids"].as_array().unwrap().len() as u64;
        assert_eq!(
            usage["prompt_tokens"], encoder_tokens,
            "{task}: encoder tokens"
        );
        assert_eq!(
            usage["total_tokens"].as_u64().unwrap(),
            encoder_tokens + ids.len() as u64 - 1
        );
        let eos_last = ids.last().unwrap().as_u64() == Some(2) && ids.len() > 1;
        let reason = if eos_last { "stop" } else { "length" };
        assert_eq!(a["choices"][0]["finish_reason"], reason, "{task}");
    }

    // Streaming: role chunk, one content chunk with florence2_result, finish chunk, usage, [DONE]; the
    // content equals the non-streamed answer.
    let c = case("<OD>");
    let plain = server
        .post_json(
            "/v1/chat/completions",
            &case_body(&c, json!({"num_beams": 1})),
        )
        .json();
    let r = server.post_json(
        "/v1/chat/completions",
        &case_body(
            &c,
            json!({"num_beams": 1, "stream": true, "stream_options": {"include_usage": true}}),
        ),
    );
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let events = r.sse_data();
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    assert!(chunks.iter().all(|c| c["id"] == chunks[0]["id"]));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    let plain_msg = &plain["choices"][0]["message"];
    assert_eq!(content, plain_msg["content"].as_str().unwrap());
    let streamed_result = chunks
        .iter()
        .find_map(|c| c["choices"][0]["delta"].get("florence2_result"))
        .expect("a chunk with florence2_result");
    assert_eq!(streamed_result, &plain_msg["florence2_result"]);
    let finish: Vec<&Value> = chunks
        .iter()
        .filter(|c| !c["choices"][0]["finish_reason"].is_null())
        .collect();
    assert_eq!(finish.len(), 1);
    assert_eq!(
        finish[0]["choices"][0]["finish_reason"],
        plain["choices"][0]["finish_reason"]
    );
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"], plain["usage"]);

    // A greedy text task streams its answer as it grows: several content deltas that concatenate to the
    // CLI's rendering.
    let c = case("<CAPTION>");
    let cli = common::fixtures::cli_run("tiny4", &c, &["--num-beams", "1"]);
    let r = server.post_json(
        "/v1/chat/completions",
        &case_body(&c, json!({"num_beams": 1, "stream": true})),
    );
    let deltas: Vec<String> = r
        .sse_data()
        .iter()
        .filter(|d| d.as_str() != "[DONE]")
        .filter_map(|d| {
            let v: Value = serde_json::from_str(d).unwrap();
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .filter(|d| !d.is_empty())
        .collect();
    assert_eq!(deltas.concat(), cli["text"].as_str().unwrap());
    let tokens = cli["token_ids"].as_array().unwrap().len();
    assert!(
        deltas.len() >= 2 || tokens <= 3,
        "a {tokens}-token caption came in {} delta(s): {deltas:?}",
        deltas.len()
    );

    // Isolation: B, then A (another task, image and beam count), then B again: identical answers, and
    // equal to the CLI's (a fresh process: B alone).
    let b = case_body(&case("<OCR_WITH_REGION>"), json!({"num_beams": 1}));
    let a = case_body(&case("<REGION_TO_DESCRIPTION>"), json!({"num_beams": 3}));
    let b1 = server.post_json("/v1/chat/completions", &b).json();
    let a1 = server.post_json("/v1/chat/completions", &a).json();
    let b2 = server.post_json("/v1/chat/completions", &b).json();
    assert_eq!(a1["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        b1["choices"][0]["message"], b2["choices"][0]["message"],
        "B after A must equal B before it"
    );
    let cli_b =
        common::fixtures::cli_run("tiny4", &case("<OCR_WITH_REGION>"), &["--num-beams", "1"]);
    assert_same_as_cli(&b2, &cli_b, "B after A vs the CLI");

    // Metrics (Prometheus text).
    let text = server.get("/metrics").text();
    assert!(
        text.contains("# TYPE florence2_requests_total counter"),
        "{text}"
    );
    // 3 parity + 2 streaming comparison + 1 text streaming + 3 isolation requests.
    assert_eq!(
        metric(&text, "florence2_requests_total{outcome=\"ok\"}"),
        9.0,
        "{text}"
    );
    assert_eq!(metric(&text, "florence2_ready"), 1.0);
    assert_eq!(
        metric(&text, "florence2_phase_seconds_count{phase=\"generate\"}"),
        9.0
    );
    assert!(metric(&text, "florence2_generated_tokens_total") > 0.0);
}

#[test]
fn validation_errors_are_400_in_the_openai_shape() {
    // Small limits so that the fixture images trip them: 200x150 = 30000 pixels > 20000.
    let server = Server::start(
        "tiny4",
        &[
            "--max-image-pixels",
            "20000",
            "--max-body-bytes",
            "300000",
            "--max-image-bytes",
            "60000",
        ],
        &[],
    );
    server.wait_ready();
    let url = data_url("scene.png");
    let post = |body: &Value| server.post_json("/v1/chat/completions", body);
    let bad = |body: Value, code: &str, what: &str| {
        let e = assert_error(&post(&body), 400, code, what);
        assert_eq!(e["type"], "invalid_request_error", "{what}");
        e
    };

    // Prompt rules (the library's).
    let e = bad(
        chat_body("<NOPE>", &url, json!({})),
        "invalid_prompt",
        "unknown task",
    );
    assert!(
        e["message"].as_str().unwrap().contains("<OCR_WITH_REGION>"),
        "{e}"
    );
    // A prompt without a marker runs --default-task (tests/serve/contract.rs).
    bad(
        chat_body("<OD>extra", &url, json!({})),
        "invalid_prompt",
        "input on a no-input task",
    );
    bad(
        chat_body("<OPEN_VOCABULARY_DETECTION>", &url, json!({})),
        "invalid_prompt",
        "missing input",
    );
    bad(
        chat_body("<OPEN_VOCABULARY_DETECTION>a <b>cat</b>", &url, json!({})),
        "invalid_prompt",
        "markup in free text",
    );
    bad(
        chat_body("<OPEN_VOCABULARY_DETECTION>a\u{7}cat", &url, json!({})),
        "invalid_prompt",
        "control character",
    );
    bad(
        chat_body("<REGION_TO_CATEGORY><loc_1><loc_2><loc_3>", &url, json!({})),
        "invalid_prompt",
        "three location bins",
    );
    bad(
        chat_body(
            "<REGION_TO_CATEGORY><loc_1><loc_2><loc_3><loc_1000>",
            &url,
            json!({}),
        ),
        "invalid_prompt",
        "bin 1000",
    );
    let long = format!("<OPEN_VOCABULARY_DETECTION>{}", "a".repeat(3000));
    let e = bad(
        chat_body(&long, &url, json!({})),
        "invalid_prompt",
        "input over 2048 bytes",
    );
    assert!(
        e["message"].as_str().unwrap().len() < 400,
        "error echo is bounded: {e}"
    );

    // Images.
    let e = bad(
        chat_body("<OD>", &data_url("big.png"), json!({})),
        "invalid_image",
        "pixels over the limit",
    );
    assert!(e["message"].as_str().unwrap().contains("200x150"), "{e}");
    bad(
        chat_body("<OD>", &url.replace("image/png", "image/gif"), json!({})),
        "invalid_image_type",
        "gif media type",
    );
    bad(
        chat_body("<OD>", &url.replace("image/png", "image/jpeg"), json!({})),
        "invalid_image_type",
        "declared type differs from the bytes",
    );
    bad(
        chat_body(
            "<OD>",
            "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAA",
            json!({}),
        ),
        "invalid_image",
        "truncated PNG",
    );
    bad(
        chat_body("<OD>", "data:image/png;base64,@@@@", json!({})),
        "invalid_image_url",
        "bad base64",
    );
    let big = format!("data:image/png;base64,{}", "A".repeat(100_000));
    bad(
        chat_body("<OD>", &big, json!({})),
        "image_too_large",
        "image bytes over the limit",
    );
    bad(
        chat_body("<OD>", "https://example.com/cat.png", json!({})),
        "remote_image_refused",
        "remote URL",
    );
    bad(
        chat_body("<OD>", "file:///etc/passwd", json!({})),
        "invalid_image_url",
        "file URL",
    );
    let two = json!({"model": "tiny4", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "<OD>"},
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "image_url", "image_url": {"url": url}},
    ]}]});
    bad(two, "too_many_images", "two images");
    let none = json!({"model": "tiny4", "messages": [{"role": "user", "content": "<OD>"}]});
    bad(none, "image_required", "no image");

    // Request fields.
    let ok = |extra: Value| chat_body("<OD>", &url, extra);
    bad(ok(json!({"n": 2})), "invalid_value", "n = 2");
    bad(
        ok(json!({"max_tokens": 0})),
        "invalid_value",
        "max_tokens 0",
    );
    let e = bad(
        ok(json!({"max_completion_tokens": -1})),
        "invalid_value",
        "negative max_completion_tokens",
    );
    assert_eq!(e["param"], "max_completion_tokens");
    bad(
        ok(json!({"max_tokens": "ten"})),
        "invalid_value",
        "max_tokens string",
    );
    bad(ok(json!({"num_beams": 65})), "invalid_value", "65 beams");
    bad(
        ok(json!({"tools": [{"type": "function", "function": {"name": "f"}}]})),
        "unsupported_parameter",
        "tools",
    );
    bad(
        ok(json!({"response_format": {"type": "json_object"}})),
        "unsupported_parameter",
        "response_format",
    );
    bad(
        ok(json!({"stream": "yes"})),
        "invalid_value",
        "stream string",
    );
    bad(json!({"model": "tiny4"}), "invalid_value", "no messages");
    bad(json!({"messages": []}), "invalid_value", "empty messages");
    bad(
        json!({"messages": [{"role": "wizard", "content": "<OD>"}]}),
        "invalid_value",
        "unknown role",
    );
    bad(
        json!({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}),
        "unsupported_content",
        "audio part",
    );
    let r = server.post_raw("/v1/chat/completions", b"{not json");
    assert_error(&r, 400, "invalid_json", "malformed JSON");
    let r = server.post_raw("/v1/chat/completions", b"[1, 2]");
    assert_error(&r, 400, "invalid_json", "JSON array body");

    // 413: a body over --max-body-bytes, refused from Content-Length before it is read.
    let huge = vec![b' '; 400_000];
    assert_error(
        &server.post_raw("/v1/chat/completions", &huge),
        413,
        "request_too_large",
        "body over the limit",
    );

    // The worker still serves a valid request after all of that. max_tokens beyond the model's positions
    // (tiny4: 128, so 127 new tokens) is clamped: the same answer as at the bound.
    let at_bound = post(&ok(json!({"max_tokens": 127, "num_beams": 1})));
    assert_eq!(at_bound.status, 200, "{}", at_bound.text());
    let beyond = post(&ok(json!({"max_tokens": 100_000, "num_beams": 1})));
    assert_eq!(beyond.status, 200, "{}", beyond.text());
    assert_eq!(
        beyond.json()["choices"][0]["message"],
        at_bound.json()["choices"][0]["message"]
    );
    let text = server.get("/metrics").text();
    assert!(
        metric(&text, "florence2_requests_total{outcome=\"invalid\"}") >= 30.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "florence2_requests_total{outcome=\"too_large\"}"),
        1.0
    );
}

#[test]
fn a_model_that_does_not_load_exits_1_with_the_reason() {
    let dir = std::env::temp_dir().join(format!("florence2-serve-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_florence2"))
        .env("NODEVICE_SELECT", "1")
        .args(["serve", "--port", "0", "--model"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("config.json"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn api_key_is_required_when_set() {
    let server = Server::start("tiny4", &["--api-key", "sekrit"], &[]);
    server.wait_ready();
    let body = serde_json::to_vec(&chat_body(
        "<CAPTION>",
        &data_url("scene.png"),
        json!({"max_tokens": 4}),
    ))
    .unwrap();
    for headers in [
        vec![],
        vec![("Authorization", "Bearer wrong")],
        vec![("Authorization", "sekrit")],
    ] {
        let r = request(server.addr, "POST", "/v1/chat/completions", &headers, &body);
        let e = assert_error(&r, 401, "invalid_api_key", "chat without the key");
        assert!(!e["message"].as_str().unwrap().contains("sekrit"));
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    }
    let r = request(server.addr, "GET", "/v1/models", &[], b"");
    assert_error(&r, 401, "invalid_api_key", "models without the key");
    assert_eq!(
        request(server.addr, "GET", "/metrics", &[], b"").status,
        401
    );
    // /health stays open for load balancers.
    assert_eq!(request(server.addr, "GET", "/health", &[], b"").status, 200);
    // With the key.
    let r = server.post_raw("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(server.get("/v1/models").status, 200);
}

#[test]
fn loading_queue_full_and_disconnect_cancellation() {
    let dir = std::env::temp_dir().join(format!("florence2-serve-hold-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hold = dir.join("hold");
    std::fs::write(&hold, "").unwrap();
    // One request at a time (--max-batch 1): capacity is 1 running + 1 waiting.
    let server = Server::start(
        "tiny4",
        &["--max-queue", "1", "--max-batch", "1"],
        &[("FLORENCE2_SERVE_HOLD_FILE", hold.to_str().unwrap())],
    );
    let url = data_url("scene.png");
    let body = |extra: Value| {
        let mut e = json!({"max_tokens": 20, "num_beams": 1});
        if let (Some(m), Value::Object(x)) = (e.as_object_mut(), extra) {
            m.extend(x);
        }
        serde_json::to_vec(&chat_body("<CAPTION>", &url, e)).unwrap()
    };
    let json_h = [("Content-Type", "application/json")];

    // 503 while loading (the worker is held before it reports ready), on /health and on chat.
    assert!(
        poll_until(|| try_request(server.addr, "GET", "/health", &[], b"").is_ok()),
        "the server never listened"
    );
    let h = server.get("/health");
    assert_eq!(h.status, 503);
    assert_eq!(h.json()["status"], "loading");
    let r = request(
        server.addr,
        "POST",
        "/v1/chat/completions",
        &json_h,
        &body(json!({})),
    );
    assert_error(&r, 503, "model_loading", "chat while loading");
    assert_eq!(server.metric("florence2_ready"), 0.0);
    std::fs::remove_file(&hold).unwrap();
    server.wait_ready();

    // The answer a request gets when nothing goes wrong, for comparison below.
    let alone = request(
        server.addr,
        "POST",
        "/v1/chat/completions",
        &json_h,
        &body(json!({})),
    );
    assert_eq!(alone.status, 200, "{}", alone.text());
    let alone = alone.json();

    // Queue full: hold the worker; capacity is 1 running + 1 waiting.
    std::fs::write(&hold, "").unwrap();
    let a = send(
        server.addr,
        "POST",
        "/v1/chat/completions",
        &json_h,
        &body(json!({})),
    );
    server.wait_metric("florence2_in_flight", 1.0);
    let b = send(
        server.addr,
        "POST",
        "/v1/chat/completions",
        &json_h,
        &body(json!({})),
    );
    server.wait_metric("florence2_in_flight", 2.0);
    let r = request(
        server.addr,
        "POST",
        "/v1/chat/completions",
        &json_h,
        &body(json!({})),
    );
    assert_error(&r, 429, "queue_full", "third request");
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");

    // Disconnect while queued: B's client goes away; it must be cancelled without an encoder pass.
    drop(b);
    server.wait_metric("florence2_client_disconnects_total", 1.0);
    let encodes_before = server.metric("florence2_phase_seconds_count{phase=\"encode\"}");
    std::fs::remove_file(&hold).unwrap();
    let a = read_response(a).unwrap();
    assert_eq!(a.status, 200, "{}", a.text());
    server.wait_metric("florence2_requests_total{outcome=\"cancelled\"}", 1.0);
    let text = server.get("/metrics").text();
    assert_eq!(
        metric(&text, "florence2_phase_seconds_count{phase=\"encode\"}"),
        encodes_before + 1.0,
        "only A was encoded: {text}"
    );
    assert_eq!(
        metric(&text, "florence2_requests_total{outcome=\"cancelled\"}"),
        1.0
    );

    // Disconnect while decoding: hold before each decode step, read the first step, then leave.
    std::fs::write(&hold, "step").unwrap();
    let steps_before = server.metric("florence2_decode_steps_total");
    let mut s = send(
        server.addr,
        "POST",
        "/v1/chat/completions",
        &json_h,
        &body(json!({"stream": true})),
    );
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains(": step") {
        use std::io::Read;
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "stream ended before a decode step");
        seen.extend_from_slice(&buf[..n]);
    }
    drop(s);
    server.wait_metric("florence2_client_disconnects_total", 2.0);
    std::fs::remove_file(&hold).unwrap();
    server.wait_metric("florence2_requests_total{outcome=\"cancelled\"}", 2.0);
    // It was held before its first step and stopped at that step's cancellation poll: no step ran.
    assert_eq!(server.metric("florence2_decode_steps_total"), steps_before);

    // The next request is served, and answers as if nothing had happened.
    let next = request(
        server.addr,
        "POST",
        "/v1/chat/completions",
        &json_h,
        &body(json!({})),
    );
    assert_eq!(next.status, 200, "{}", next.text());
    assert_eq!(
        next.json()["choices"][0]["message"],
        alone["choices"][0]["message"]
    );
    assert_eq!(server.metric("florence2_in_flight"), 0.0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client that leaves while its image is still being decoded (admitted, not yet queued for the
/// worker) is counted as a disconnect and a cancelled request, and its slot is freed. Under load the
/// decoding takes longer, which is how `loading_queue_full_and_disconnect_cancellation` once missed
/// the disconnect of a client dropped in that window; the `decode` hold makes the window certain here.
#[test]
fn disconnect_while_the_image_decodes_is_counted() {
    let dir = std::env::temp_dir().join(format!("florence2-serve-decode-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hold = dir.join("hold");
    let server = Server::start(
        "tiny4",
        &["--max-batch", "1"],
        &[("FLORENCE2_SERVE_HOLD_FILE", hold.to_str().unwrap())],
    );
    server.wait_ready();
    std::fs::write(&hold, "decode").unwrap();
    let body = serde_json::to_vec(&chat_body(
        "<CAPTION>",
        &data_url("scene.png"),
        json!({"max_tokens": 20}),
    ))
    .unwrap();
    let json_h = [("Content-Type", "application/json")];
    let c = send(server.addr, "POST", "/v1/chat/completions", &json_h, &body);
    server.wait_metric("florence2_in_flight", 1.0);
    drop(c);
    server.wait_metric("florence2_client_disconnects_total", 1.0);
    server.wait_metric("florence2_requests_total{outcome=\"cancelled\"}", 1.0);
    std::fs::remove_file(&hold).unwrap();
    // The slot is free and nothing reached the worker: the next request is the only one encoded.
    assert!(
        poll_until(|| server.metric("florence2_in_flight") == 0.0),
        "the slot of the client that left was not freed"
    );
    let r = request(server.addr, "POST", "/v1/chat/completions", &json_h, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let text = server.get("/metrics").text();
    assert_eq!(
        metric(&text, "florence2_phase_seconds_count{phase=\"encode\"}"),
        1.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "florence2_requests_total{outcome=\"cancelled\"}"),
        1.0
    );
    assert_eq!(metric(&text, "florence2_client_disconnects_total"), 1.0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_cancels_in_flight_work_and_exits_0() {
    let dir = std::env::temp_dir().join(format!("florence2-serve-term-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hold = dir.join("hold");
    let server = Server::start(
        "tiny4",
        &["--shutdown-timeout", "1"],
        &[("FLORENCE2_SERVE_HOLD_FILE", hold.to_str().unwrap())],
    );
    server.wait_ready();
    // A streaming request held before its first decode step: it cannot finish by itself.
    std::fs::write(&hold, "step").unwrap();
    let body = serde_json::to_vec(&chat_body(
        "<CAPTION>",
        &data_url("scene.png"),
        json!({"stream": true, "max_tokens": 20}),
    ))
    .unwrap();
    let s = send(
        server.addr,
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        &body,
    );
    server.wait_metric("florence2_running", 1.0);
    let addr = server.addr;
    let code = server.terminate();
    assert_eq!(code, Some(0), "exit status after SIGTERM");
    // The held request was cancelled after the grace period and told so in the stream.
    let r = read_response(s).unwrap();
    let events = r.sse_data();
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    let err: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(err["error"]["code"], "shutting_down", "{err}");
    // Nothing listens anymore.
    assert!(std::net::TcpStream::connect(addr).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A tiny HTTP/1.1 origin on a loopback port (one thread per connection) for the remote image tests.
/// Paths: `/img` (the PNG or JPEG it was given), `/redirect` (302 to `img`, relative), `/loop` (302 to
/// itself), `/to-file` (302 to `file:///etc/passwd`), `/endless` (PNG magic then zeros, no length, until
/// the client hangs up), `/slow` (headers and 8 bytes of a 1000-byte body, then nothing until the client
/// hangs up), `/text` (an HTML page), anything else 404. Counts connections.
pub(crate) struct Origin {
    pub(crate) addr: std::net::SocketAddr,
    hits: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Origin {
    pub(crate) fn start(image: Vec<u8>, kind: &'static str) -> Origin {
        use std::io::{Read, Write};
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let image = Arc::new(image);
        let counter = hits.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { continue };
                counter.fetch_add(1, Ordering::SeqCst);
                let image = image.clone();
                std::thread::spawn(move || {
                    // Bounded: a test that fails must not leave threads blocked forever.
                    let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(120)));
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") && head.len() < 16384 {
                        match s.read(&mut byte) {
                            Ok(1) => head.push(byte[0]),
                            _ => return,
                        }
                    }
                    let head = String::from_utf8_lossy(&head).to_string();
                    let path = head.split(' ').nth(1).unwrap_or("").to_string();
                    let redirect = |to: &str| {
                        format!("HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    };
                    let _ = match path.as_str() {
                        "/img" => s
                            .write_all(
                                format!(
                                    "HTTP/1.1 200 OK\r\nContent-Type: image/{kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                                    image.len()
                                )
                                .as_bytes(),
                            )
                            .and_then(|_| s.write_all(&image)),
                        "/redirect" => s.write_all(redirect("img").as_bytes()),
                        "/loop" => s.write_all(redirect("/loop").as_bytes()),
                        "/to-file" => s.write_all(redirect("file:///etc/passwd").as_bytes()),
                        "/endless" => (|| {
                            s.write_all(
                                b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nConnection: close\r\n\r\n\x89PNG\r\n\x1a\n",
                            )?;
                            let zeros = vec![0u8; 64 * 1024];
                            // Until the client hangs up (a write fails): only a reader that stops at
                            // its limit while streaming gets an answer before the time limit.
                            loop {
                                s.write_all(&zeros)?;
                            }
                        })(),
                        "/slow" => s
                            .write_all(
                                b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n\x89PNG\r\n\x1a\n",
                            )
                            .map(|_| {
                                // Nothing more until the client hangs up.
                                let mut sink = [0u8; 64];
                                while s.read(&mut sink).is_ok_and(|n| n > 0) {}
                            }),
                        "/text" => s.write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 19\r\nConnection: close\r\n\r\n<html>hello</html>\n",
                        ),
                        _ => s.write_all(
                            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                        ),
                    };
                });
            }
        });
        Origin { addr, hits }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub(crate) fn hits(&self) -> usize {
        self.hits.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[test]
fn remote_images_only_with_allow_remote_images_and_within_limits() {
    let c = case("<CAPTION>");
    let image_name = c["image"].as_str().unwrap();
    let image = std::fs::read(fixtures().join("images").join(image_name)).unwrap();
    let kind = if image_name.ends_with(".png") {
        "png"
    } else {
        "jpeg"
    };
    let origin = Origin::start(image.clone(), kind);
    let with_url = |url: &str| {
        let mut extra = json!({});
        extra["max_tokens"] = c["max_new_tokens"].clone();
        chat_body(&prompt_of(&c), url, extra)
    };

    // Without the flag: refused, and the origin is never contacted.
    {
        let server = Server::start("tiny4", &[], &[]);
        server.wait_ready();
        let r = server.post_json("/v1/chat/completions", &with_url(&origin.url("/img")));
        let e = assert_error(&r, 400, "remote_image_refused", "no flag");
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .contains("--allow-remote-images"),
            "{e}"
        );
        assert_eq!(origin.hits(), 0, "a refused URL must not be fetched");
    }

    // The byte limit is the image limit: the fixture image fits, the endless body does not. The origin
    // is on loopback: allowed with --allow-private-remote-images (guards.rs tests the refusal).
    let max_bytes = (image.len() + 1000).to_string();
    let server = Server::start(
        "tiny4",
        &[
            "--allow-remote-images",
            "--allow-private-remote-images",
            "--remote-image-timeout",
            "3",
            "--max-remote-redirects",
            "3",
            "--max-image-bytes",
            &max_bytes,
        ],
        &[],
    );
    server.wait_ready();
    let post = |url: &str| server.post_json("/v1/chat/completions", &with_url(url));

    // A served image gives the same answer as the same image in a data URL (and as the CLI).
    let inline = post(&data_url(image_name));
    assert_eq!(inline.status, 200, "{}", inline.text());
    let inline = inline.json();
    let cli = common::fixtures::cli_run("tiny4", &c, &[]);
    assert_same_as_cli(&inline, &cli, "data URL");
    for path in ["/img", "/redirect"] {
        let r = post(&origin.url(path));
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        let remote = r.json();
        assert_eq!(
            remote["choices"][0]["message"], inline["choices"][0]["message"],
            "{path}: remote answer vs data URL"
        );
        assert_eq!(remote["usage"], inline["usage"], "{path}: usage");
    }

    // Each failure: its own 400.
    for (path, code) in [
        ("/endless", "image_too_large"),
        ("/slow", "remote_image_timeout"),
        ("/loop", "remote_image_redirects"),
        ("/to-file", "remote_image_redirect_refused"),
        ("/text", "invalid_image"),
        ("/missing", "remote_image_fetch_failed"),
    ] {
        let e = assert_error(&post(&origin.url(path)), 400, code, path);
        assert_eq!(
            e["param"], "messages[0].content[1].image_url.url",
            "{path}: {e}"
        );
    }
    // The redirect loop stopped at the bound: 1 + 3 requests for /loop.
    let before = origin.hits();
    post(&origin.url("/loop"));
    assert_eq!(origin.hits() - before, 4, "1 request + 3 redirects");
    // `file:` is refused even with the flag, without any fetch.
    let before = origin.hits();
    assert_error(
        &post("file:///etc/passwd"),
        400,
        "invalid_image_url",
        "file URL with the flag",
    );
    assert_eq!(origin.hits(), before);
    // Every fetch is timed in /metrics: 2 successful + 7 failed (after admission; file: is not fetched).
    assert_eq!(
        server.metric("florence2_phase_seconds_count{phase=\"image_fetch\"}"),
        9.0
    );
    assert_eq!(
        server.metric("florence2_requests_total{outcome=\"ok\"}"),
        3.0
    );
}

/// `--dtype` reaches the pipeline's load options: for each resident format, the server's answers (a
/// greedy text task and a beam-search located task) equal `florence2 run --json --dtype` of the same
/// format, and /health reports it. On tiny4, q4 changes the answers (checked below), so a server that
/// ignored `--dtype` would fail the q4 comparison.
#[test]
fn dtype_is_the_pipelines_load_option() {
    let mut ids: Vec<Vec<Value>> = Vec::new();
    for dtype in ["fp32", "q4"] {
        let mut per_dtype = Vec::new();
        let server = Server::start("tiny4", &["--dtype", dtype], &[]);
        server.wait_ready();
        let health = server.get("/health").json();
        assert_eq!(health["dtype"], dtype, "{health}");
        for (task, beams) in [("<CAPTION>", 1), ("<OD>", 3)] {
            let c = case(task);
            let cli = common::fixtures::cli_run(
                "tiny4",
                &c,
                &["--dtype", dtype, "--num-beams", &beams.to_string()],
            );
            assert_eq!(cli["dtype"], dtype, "the CLI ran {dtype}");
            per_dtype.push(cli["token_ids"].clone());
            let r = server.post_json(
                "/v1/chat/completions",
                &case_body(&c, json!({"num_beams": beams})),
            );
            assert_eq!(r.status, 200, "{dtype} {task}: {}", r.text());
            assert_same_as_cli(&r.json(), &cli, &format!("--dtype {dtype} {task}"));
        }
        ids.push(per_dtype);
    }
    assert_ne!(ids[0], ids[1], "q4 and fp32 answers differ on tiny4");
}

/// `--dtype` with a format per part: /health names the mix, and the answers equal `florence2 run
/// --json` with the same mix (the CLI's mixed load is checked against the uniform ones in
/// tests/model/dtype_mix.rs); a bad part stops the server with the named error.
#[test]
fn a_dtype_mix_is_the_pipelines_load_option() {
    let mix = "vision=fp16,text=q4";
    let server = Server::start("tiny4", &["--dtype", "text=q4,vision=fp16"], &[]);
    server.wait_ready();
    let health = server.get("/health").json();
    assert_eq!(health["dtype"], mix, "{health}");
    let c = case("<OD>");
    let cli = common::fixtures::cli_run("tiny4", &c, &["--dtype", mix, "--num-beams", "3"]);
    assert_eq!(cli["dtype"], mix);
    let r = server.post_json(
        "/v1/chat/completions",
        &case_body(&c, json!({"num_beams": 3})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_same_as_cli(&r.json(), &cli, &format!("--dtype {mix}"));
    drop(server);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_florence2"))
        .args(["serve", "--model", "x", "--dtype", "vision=fp16,txt=q4"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("unknown model part 'txt'"), "{err}");
}

/// `--dtype auto`: the server loads the format the estimate chooses for its device (every format fits
/// tiny4, so fp16) and /health reports it with the reason; a fixed format reports no reason.
#[test]
fn dtype_auto_reports_its_choice_in_health() {
    let server = Server::start("tiny4", &["--dtype", "auto"], &[]);
    server.wait_ready();
    let health = server.get("/health").json();
    assert_eq!(health["dtype"], "fp16", "{health}");
    let reason = health["dtype_reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("auto chose fp16 for this "), "{health}");
    drop(server);
    let server = Server::start("tiny4", &["--dtype", "q8"], &[]);
    server.wait_ready();
    let health = server.get("/health").json();
    assert_eq!(health["dtype"], "q8", "{health}");
    assert!(health["dtype_reason"].is_null(), "{health}");
}

/// `--tuning`: the server runs the kernel tuner at load as `florence2 run` does, reports what it did in
/// /health, caches the choices per adapter (here under a fresh XDG_CACHE_HOME), and a second start
/// reads them; `--tuning off` times and writes nothing.
#[test]
fn tuning_runs_at_load_and_is_cached() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("serve-tuning");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cache_files = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(dir.join("florence2-wasm"))
            .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default()
    };
    let xdg = dir.to_str().unwrap();
    let tuning_of = |args: &[&str]| -> Value {
        // On the GPU: `auto` would pick the CPU backend over a software adapter, and it tunes nothing.
        let args = [&["--device", "gpu"], args].concat();
        let server = Server::start("tiny4", &args, &[("XDG_CACHE_HOME", xdg)]);
        server.wait_ready();
        let health = server.get("/health").json();
        assert_eq!(health["status"], "ok", "{health}");
        // The model answers with the tuned kernels.
        let r = server.post_json(
            "/v1/chat/completions",
            &case_body(&case("<CAPTION>"), json!({})),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        health["tuning"].clone()
    };
    let n = |v: &Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));

    let off = tuning_of(&["--tuning", "off"]);
    assert_eq!(off["mode"], "off", "{off}");
    assert_eq!(
        n(&off, "timed") + n(&off, "cached") + n(&off, "skipped"),
        0,
        "{off}"
    );
    assert!(cache_files().is_empty(), "off writes no cache");

    let first = tuning_of(&[]);
    assert_eq!(first["mode"], "auto", "auto is the default: {first}");
    let classes = n(&first, "timed") + n(&first, "cached") + n(&first, "skipped");
    assert!(classes >= 10, "tiny4 has its linear shape classes: {first}");
    assert_eq!(n(&first, "cached"), 0, "a fresh cache directory: {first}");
    assert!(n(&first, "timed") >= 1, "{first}");
    let files = cache_files();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(
        first["cache"].as_str().unwrap().contains("florence2-wasm"),
        "{first}"
    );

    // A second start reads what the first timed (and continues with what it left).
    let second = tuning_of(&["--tuning", "auto"]);
    // (a class the first cut short is resumed, so it counts as timed again).
    assert!(
        n(&second, "cached") + n(&second, "timed") >= n(&first, "timed"),
        "first {first}, second {second}"
    );
    assert!(
        n(&second, "skipped") <= n(&first, "skipped"),
        "first {first}, second {second}"
    );
    assert_eq!(
        n(&second, "timed") + n(&second, "cached") + n(&second, "skipped"),
        classes
    );
}
