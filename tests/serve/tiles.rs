//! `florence2.tiles` on the demo model: a tiled request on a page of 2x2 of its scenes answers what
//! `florence2 run --tiles` answers (same device choice, fp32, greedy), with `florence2_result.tiles`; a
//! task that cannot tile is a 400 naming the parameter.

use std::process::Command;

use serde_json::{json, Value};

use crate::batching::DEMO;
use crate::serve_util::*;

const SCENES: [&str; 4] = [
    "heldout_000.png",
    "heldout_001.png",
    "heldout_008.png",
    "heldout_010.png",
];

/// The page as a PNG file in `dir`.
fn page_png(dir: &std::path::Path) -> std::path::PathBuf {
    let samples = model_dir(DEMO).join("samples");
    let mut page = image::RgbImage::new(384, 384);
    for (i, file) in SCENES.iter().enumerate() {
        let scene = image::open(samples.join(file)).unwrap().to_rgb8();
        let (x, y) = ((i % 2) as i64 * 192, (i / 2) as i64 * 192);
        image::imageops::replace(&mut page, &scene, x, y);
    }
    let path = dir.join("page.png");
    page.save(&path).unwrap();
    path
}

/// A chat body for the served model (no `model`: the served one).
fn body(prompt: &str, url: &str, extra: Value) -> Value {
    let mut b = chat_body(prompt, url, extra);
    b.as_object_mut().unwrap().remove("model");
    b
}

#[test]
fn a_tiled_request_answers_as_the_cli_does() {
    let dir = std::env::temp_dir().join(format!("florence2-serve-tiles-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let png = page_png(&dir);
    let cli = Command::new(env!("CARGO_BIN_EXE_florence2"))
        .args(["run", "--model"])
        .arg(model_dir(DEMO))
        .arg("--image")
        .arg(&png)
        .args([
            "--task",
            "<OD>",
            "--tiles",
            "2x2",
            "--num-beams",
            "1",
            "--max-new-tokens",
            "96",
        ])
        .args(["--dtype", "fp32", "--json"])
        .output()
        .unwrap();
    assert!(
        cli.status.success(),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    let cli: Value = serde_json::from_slice(&cli.stdout).unwrap();

    use base64::Engine as _;
    let url = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(&png).unwrap())
    );
    std::fs::remove_dir_all(&dir).unwrap();
    let server = Server::start(DEMO, &[], &[]);
    server.wait_ready();
    let extra = json!({"num_beams": 1, "max_tokens": 96, "florence2": {"tiles": "2x2"}});
    let resp = server.post_json("/v1/chat/completions", &body("<OD>", &url, extra));
    assert_eq!(resp.status, 200, "{}", resp.text());
    let v = resp.json();
    let r = &v["choices"][0]["message"]["florence2_result"];
    assert_eq!(r["tiles"], cli["tiles"]);
    assert_eq!(r["tiles"]["views"], 5);
    assert_eq!(r["result"], cli["result"]);
    assert_eq!(r["image_size"], json!([384, 384]));
    assert_eq!(v["choices"][0]["message"]["content"], cli["text"]);
    assert!(!cli["result"]["<OD>"]["bboxes"]
        .as_array()
        .unwrap()
        .is_empty());

    // A task that cannot tile: refused before it queues.
    let extra = json!({"florence2": {"tiles": "auto"}});
    let resp = server.post_json("/v1/chat/completions", &body("<CAPTION>", &url, extra));
    assert_eq!(resp.status, 400, "{}", resp.text());
    let e = &resp.json()["error"];
    assert_eq!(
        (e["param"].as_str(), e["code"].as_str()),
        (Some("florence2.tiles"), Some("invalid_prompt"))
    );
}
