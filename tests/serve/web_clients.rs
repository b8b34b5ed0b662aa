//! What browser and app clients need from `florence2 serve`: CORS with preflight (`--cors-origin`), a
//! fine-tune's own task markers (accepted as `florence2 run` accepts them, listed by /v1/models), and
//! WebP, GIF and BMP data URLs (answered exactly as the same pixels in a PNG).

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::assert_error;
use crate::common::fixtures::fixtures;
use crate::serve_util::*;

#[test]
fn cors_answers_listed_origins_and_preflights() {
    let server = Server::start(
        "tiny4",
        &[
            "--cors-origin",
            "https://app.example",
            "--cors-origin",
            "http://localhost:5173",
            "--api-key",
            "k",
        ],
        &[],
    );
    server.wait_ready();
    let preflight = |origin: &str| {
        request(
            server.addr,
            "OPTIONS",
            "/v1/chat/completions",
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", "POST"),
                (
                    "Access-Control-Request-Headers",
                    "authorization, content-type",
                ),
            ],
            b"",
        )
    };
    // A listed origin: 204 without the API key, the origin itself, the methods and headers asked for.
    let r = preflight("https://app.example");
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert!(r
        .header("access-control-allow-methods")
        .unwrap()
        .contains("POST"));
    assert_eq!(
        r.header("access-control-allow-headers"),
        Some("authorization, content-type")
    );
    assert_eq!(r.header("vary"), Some("Origin"));
    // Another origin: no CORS headers (the browser refuses), the route's own answer.
    let r = preflight("https://elsewhere.example");
    assert_eq!(r.header("access-control-allow-origin"), None);
    assert_eq!(r.status, 405);

    // Real requests: the answer, and errors too (a page reads the 401's message), carry the headers.
    let models = |headers: &[(&str, &str)]| request(server.addr, "GET", "/v1/models", headers, b"");
    let ok = models(&[
        ("Origin", "http://localhost:5173"),
        ("Authorization", "Bearer k"),
    ]);
    assert_eq!(ok.status, 200);
    assert_eq!(
        ok.header("access-control-allow-origin"),
        Some("http://localhost:5173")
    );
    assert_eq!(
        ok.header("access-control-expose-headers"),
        Some("Retry-After")
    );
    let denied = models(&[("Origin", "https://app.example")]);
    assert_eq!(denied.status, 401);
    assert_eq!(
        denied.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    // Without an Origin (not a cross-origin browser request): no CORS headers, but the answer says it
    // depends on the origin (caches keep the two apart).
    let plain = models(&[("Authorization", "Bearer k")]);
    assert_eq!(plain.status, 200);
    assert_eq!(plain.header("access-control-allow-origin"), None);
    assert_eq!(plain.header("vary"), Some("Origin"));
    drop(server);

    // `*`: any origin, answered with `*`.
    let any = Server::start("tiny4", &["--cors-origin", "*"], &[]);
    any.wait_ready();
    let r = request(
        any.addr,
        "GET",
        "/health",
        &[("Origin", "https://whoever.example")],
        b"",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    assert_eq!(r.header("vary"), None);
}

/// tiny4 with a processor config that declares `<MY_CAPTION>` (with `<CAPTION>`'s encoder text) and
/// a plain `<GENERATE_TAGS>`, in a directory of its own under target/.
fn tiny4_with_own_tasks() -> PathBuf {
    let src = fixtures().join("models/tiny4");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("serve_own_tasks_tiny4");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    let path = dir.join("processor_config.json");
    let mut cfg: Value = match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b).unwrap(),
        Err(_) => json!({}),
    };
    cfg["task_prompts_without_inputs"] = json!({"<MY_CAPTION>": "What does the image describe?"});
    cfg["tasks"] = json!(["<GENERATE_TAGS>"]);
    std::fs::write(&path, cfg.to_string()).unwrap();
    dir
}

fn answer(server: &Server, prompt: &str, image: &str) -> Value {
    let body = chat_body(
        prompt,
        &data_url(image),
        json!({"max_tokens": 12, "num_beams": 1}),
    );
    let r = server.post_json("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{prompt} on {image}: {}", r.text());
    r.json()["choices"][0]["message"].clone()
}

#[test]
fn own_task_markers_and_more_image_formats() {
    let dir = tiny4_with_own_tasks();
    // Served under the fixture's id, which the requests name.
    let server = Server::start(dir.to_str().unwrap(), &["--model-id", "tiny4"], &[]);
    server.wait_ready();

    // /v1/models lists the 15 built-in markers and the model's own.
    let models = server.get("/v1/models").json();
    let tasks: Vec<&str> = models["data"][0]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tasks.len(), 17, "{tasks:?}");
    for t in ["<CAPTION>", "<OD>", "<GENERATE_TAGS>", "<MY_CAPTION>"] {
        assert!(tasks.contains(&t), "{t} in {tasks:?}");
    }

    // An own marker with <CAPTION>'s encoder text answers with <CAPTION>'s tokens, keyed by its marker.
    let caption = answer(&server, "<CAPTION>", "scene.png");
    let mine = answer(&server, "<MY_CAPTION>", "scene.png");
    let (c, m) = (&caption["florence2_result"], &mine["florence2_result"]);
    assert_eq!(m["task"], "<MY_CAPTION>");
    assert_eq!(m["token_ids"], c["token_ids"]);
    assert_eq!(mine["content"], caption["content"]);
    assert_eq!(m["result"]["<MY_CAPTION>"], c["result"]["<CAPTION>"]);
    let tags = answer(&server, "<GENERATE_TAGS>", "scene.png");
    assert_eq!(tags["florence2_result"]["task"], "<GENERATE_TAGS>");
    let r = server.post_json(
        "/v1/chat/completions",
        &chat_body("<OTHER>", &data_url("scene.png"), json!({})),
    );
    let e = assert_error(&r, 400, "invalid_prompt", "undeclared marker");
    assert!(
        e["message"].as_str().unwrap().contains("<GENERATE_TAGS>"),
        "{e}"
    );

    // WebP (lossless) and BMP hold scene.png's pixels; the GIF's first frame is scene.gif.png's.
    for (file, same_as) in [
        ("formats/scene.webp", &caption),
        ("formats/scene.bmp", &caption),
    ] {
        let got = answer(&server, "<CAPTION>", file);
        assert_eq!(
            got["florence2_result"]["token_ids"], same_as["florence2_result"]["token_ids"],
            "{file}"
        );
    }
    let gif = answer(&server, "<CAPTION>", "formats/scene.gif");
    let gif_png = answer(&server, "<CAPTION>", "formats/scene.gif.png");
    assert_eq!(
        gif["florence2_result"]["token_ids"],
        gif_png["florence2_result"]["token_ids"]
    );
    // The declared type must match the bytes.
    let url = data_url("formats/scene.webp").replace("image/webp", "image/png");
    let r = server.post_json(
        "/v1/chat/completions",
        &chat_body("<CAPTION>", &url, json!({})),
    );
    assert_error(&r, 400, "invalid_image_type", "WebP bytes declared PNG");
}
