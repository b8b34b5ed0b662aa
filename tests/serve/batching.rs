//! Continuous batching (`--max-batch`) on the committed demo model: 12 concurrent requests (every task
//! of three samples; greedy, 2 and 3 beams; limits that cut some answers; some streamed) get, token for
//! token, the answers the same requests get one at a time (`--max-batch 1`), and `/metrics` shows decode
//! steps that ran several requests together. Exact equality: batched decoding does not change a
//! request's arithmetic (tests/model/decode_batch.rs, tests/model/text_decoder.rs).

use std::path::Path;

use serde_json::{json, Value};

use crate::serve_util::*;

/// Relative to tests/fixtures/models (where `Server::start` looks).
pub(crate) const DEMO: &str = "../../../www/models/florence2-shapes";

/// (prompt, image data URL, extra fields) of every request.
pub(crate) fn requests() -> Vec<(String, String, Value)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("www/models/florence2-shapes/samples");
    let meta: Value =
        serde_json::from_slice(&std::fs::read(dir.join("targets.json")).unwrap()).unwrap();
    let mut out = Vec::new();
    for s in meta.as_array().unwrap().iter().take(3) {
        use base64::Engine as _;
        let bytes = std::fs::read(dir.join(s["file"].as_str().unwrap())).unwrap();
        let url = format!(
            "data:image/png;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        );
        for (task, t) in s["targets"].as_object().unwrap() {
            let n = out.len();
            let extra = json!({
                "num_beams": 1 + n % 3,
                "max_tokens": if n % 4 == 3 { 9 } else { 96 },
                "stream": n % 5 == 1,
            });
            out.push((
                format!("{task}{}", t["text_input"].as_str().unwrap()),
                url.clone(),
                extra,
            ));
        }
    }
    out.truncate(12);
    out
}

/// The answer's token ids and content (streamed: the deltas and the final chunk's result).
pub(crate) fn answer_of(r: &Resp, streamed: bool) -> (Value, String) {
    assert_eq!(r.status, 200, "{}", r.text());
    if !streamed {
        let v = r.json();
        let msg = &v["choices"][0]["message"];
        return (
            msg["florence2_result"]["token_ids"].clone(),
            msg["content"].as_str().unwrap().to_string(),
        );
    }
    let chunks: Vec<Value> = r
        .sse_data()
        .iter()
        .filter(|d| d.as_str() != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let content = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    let result = chunks
        .iter()
        .find_map(|c| c["choices"][0]["delta"].get("florence2_result"))
        .expect("a chunk with florence2_result");
    (result["token_ids"].clone(), content)
}

pub(crate) fn body(r: &(String, String, Value)) -> Vec<u8> {
    let mut b = chat_body(&r.0, &r.1, r.2.clone());
    b["model"] = json!("florence2-shapes");
    serde_json::to_vec(&b).unwrap()
}

#[test]
fn concurrent_requests_get_their_one_at_a_time_answers() {
    let reqs = requests();
    assert_eq!(reqs.len(), 12);
    let streamed = |r: &(String, String, Value)| r.2["stream"] == true;
    let json_h = [("Content-Type", "application/json")];

    let alone = {
        let server = Server::start(DEMO, &["--max-batch", "1"], &[]);
        server.wait_ready();
        let answers: Vec<(Value, String)> = reqs
            .iter()
            .map(|r| {
                let resp = request(
                    server.addr,
                    "POST",
                    "/v1/chat/completions",
                    &json_h,
                    &body(r),
                );
                answer_of(&resp, streamed(r))
            })
            .collect();
        assert_eq!(
            server.metric("florence2_batch_size_bucket{le=\"1\"}"),
            server.metric("florence2_batch_size_count")
        );
        answers
    };

    let dir = std::env::temp_dir().join(format!("florence2-serve-batch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hold = dir.join("hold");
    let server = Server::start(
        DEMO,
        &["--max-batch", "8"],
        &[("FLORENCE2_SERVE_HOLD_FILE", hold.to_str().unwrap())],
    );
    server.wait_ready();
    // All requests at once: they queue, and join the running batch between decode steps. The worker
    // is held at its first request until the other 11 are queued, so that the batch forms however
    // slowly a busy machine sends and decodes them (an event, not a race with the worker).
    std::fs::write(&hold, "").unwrap();
    let sockets: Vec<_> = reqs
        .iter()
        .map(|r| {
            send(
                server.addr,
                "POST",
                "/v1/chat/completions",
                &json_h,
                &body(r),
            )
        })
        .collect();
    server.wait_metric("florence2_queue_depth", (reqs.len() - 1) as f64);
    std::fs::remove_file(&hold).unwrap();
    for ((r, s), want) in reqs.iter().zip(sockets).zip(&alone) {
        let got = answer_of(&read_response(s).unwrap(), streamed(r));
        assert_eq!(&got, want, "{} {}", r.0, r.2);
    }
    let text = server.get("/metrics").text();
    let steps = metric(&text, "florence2_batch_size_count");
    let single = metric(&text, "florence2_batch_size_bucket{le=\"1\"}");
    let mean = metric(&text, "florence2_batch_size_sum") / steps;
    assert!(
        steps > 0.0 && single < steps,
        "no step ran several requests: {text}"
    );
    assert!(mean > 2.0, "mean batch {mean} (max 8): {text}");
    assert_eq!(
        metric(&text, "florence2_requests_total{outcome=\"ok\"}"),
        12.0
    );
    // The last answer reaches its client just before the worker lowers the gauge.
    assert!(
        poll_until(|| server.metric("florence2_running") == 0.0),
        "a request still running after every answer"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
