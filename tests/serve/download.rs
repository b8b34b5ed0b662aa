//! `florence2 serve --model org/name` against the loopback hub (tests/common/hub.rs): the server listens
//! before the download ends; `/health` says `downloading` with the observer's progress while the hub
//! holds the weights' second half, requests get the loading answer, then the model loads and answers as
//! on the fixture directory. SIGTERM mid-download exits 0 and keeps the partial blob; a model the hub
//! lacks, a corrupt download and offline mode with an empty cache end the server with the named error
//! (exit 1, as a failed load).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

use crate::common::hub::{fake_etag, fixture, Gate, Hub, Quirks};
use crate::serve_util::*;

fn tempdir(tag: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("serve-hub-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The environment that points the server at `hub` and the cache `cache` (no token, online).
fn hub_env<'a>(hub: &'a Hub, cache: &'a Path) -> Vec<(&'a str, &'a str)> {
    vec![
        ("HF_ENDPOINT", hub.endpoint.as_str()),
        ("HF_HUB_CACHE", cache.to_str().unwrap()),
        ("HF_TOKEN", ""),
        ("HF_HUB_OFFLINE", ""),
    ]
}

/// A hub whose storage host sends half the weights, then holds until the returned gate opens.
fn held_hub() -> (Hub, Gate) {
    let gate = Gate::default();
    let hub = Hub::start(Quirks {
        hold_mid_body: Some(gate.clone()),
        ..Default::default()
    });
    (hub, gate)
}

fn weights() -> Vec<u8> {
    std::fs::read(fixture("tiny4").join("model.safetensors")).unwrap()
}

/// Poll `/health` until it says `downloading` with half the weights on disk; that answer.
fn wait_half_downloaded(server: &Server) -> Value {
    let half = (weights().len() / 2) as u64;
    let mut last = Value::Null;
    let held = poll_until(|| {
        let Ok(r) = try_request(server.addr, "GET", "/health", &[], b"") else {
            return false;
        };
        last = r.json();
        assert_eq!(r.status, 503, "/health before the model is ready: {last}");
        last["progress"]["file"] == "acme/tiny4/model.safetensors"
            && last["progress"]["file_bytes"].as_u64() >= Some(half)
    });
    assert!(held, "the download never reached half the weights: {last}");
    last
}

/// The small files the snapshot downloads before the weights (all of tiny4 but its weights), distinct
/// by content (a blob named by its ETag is downloaded once): (count, bytes).
fn small_files() -> (u64, u64) {
    let mut seen = std::collections::BTreeMap::new();
    for e in std::fs::read_dir(fixture("tiny4")).unwrap() {
        let p = e.unwrap().path();
        if p.file_name().unwrap() != "model.safetensors" {
            let b = std::fs::read(&p).unwrap();
            seen.insert(fake_etag(&b, false), b.len() as u64);
        }
    }
    (seen.len() as u64, seen.values().sum())
}

#[test]
fn health_says_downloading_with_progress_then_ok_and_the_model_answers_as_from_its_directory() {
    let (hub, gate) = held_hub();
    let cache = tempdir("progress");
    let server = Server::start_with("acme/tiny4".as_ref(), &[], &hub_env(&hub, &cache));
    let h = wait_half_downloaded(&server);

    // Exactly what the observer saw: the small files whole, the weights' first half.
    let w = weights().len() as u64;
    let (files, small_bytes) = small_files();
    assert_eq!(h["status"], "downloading", "{h}");
    let p = &h["progress"];
    assert_eq!(p["file_bytes"], w / 2, "{h}");
    assert_eq!(p["file_total"], w, "{h}");
    assert_eq!(p["files_done"], files, "{h}");
    assert_eq!(p["bytes"], small_bytes + w / 2, "{h}");
    assert_eq!(
        server.metric("florence2_download_bytes"),
        (small_bytes + w / 2) as f64
    );
    assert_eq!(server.metric("florence2_ready"), 0.0);

    // A request meanwhile gets the loading answer.
    let c = crate::case("<OD>");
    let r = server.post_json("/v1/chat/completions", &crate::case_body(&c, json!({})));
    crate::assert_error(&r, 503, "model_loading", "chat while downloading");
    assert_eq!(r.header("retry-after"), Some("1"), "{}", r.text());

    // The rest of the weights: the model loads and answers as `florence2 run` on the fixture directory.
    gate.open();
    server.wait_ready();
    let h = server.get("/health").json();
    assert_eq!(h["status"], "ok", "{h}");
    assert_eq!(h["model"], "acme/tiny4", "{h}");
    assert_eq!(
        server.metric("florence2_download_bytes"),
        (small_bytes + w) as f64
    );
    let cli = common_cli(&c);
    let r = server.post_json("/v1/chat/completions", &crate::case_body(&c, json!({})));
    assert_eq!(r.status, 200, "{}", r.text());
    let a = r.json();
    crate::assert_same_as_cli(&a, &cli, "<OD> after the download");
    assert_eq!(a["model"], "acme/tiny4");
    assert_eq!(server.terminate(), Some(0));
}

fn common_cli(c: &Value) -> Value {
    crate::common::fixtures::cli_run("tiny4", c, &[])
}

#[test]
fn sigterm_mid_download_exits_0_and_keeps_the_partial_blob_for_a_resume() {
    let (hub, gate) = held_hub();
    let cache = tempdir("sigterm");
    let server = Server::start_with("acme/tiny4".as_ref(), &[], &hub_env(&hub, &cache));
    wait_half_downloaded(&server);
    // The hub still holds the rest (the gate opens only below): the server exits without the download.
    assert_eq!(server.terminate(), Some(0));
    gate.open();
    let w = weights();
    let blobs = cache.join("models--acme--tiny4/blobs");
    let part = blobs.join(format!("{}.incomplete", fake_etag(&w, true)));
    assert_eq!(
        std::fs::metadata(&part).map(|m| m.len()).ok(),
        Some((w.len() / 2) as u64),
        "the partial blob"
    );
    assert!(
        !blobs.join(fake_etag(&w, true)).exists(),
        "a half blob under its final name"
    );
}

/// `florence2 serve --model MODEL` with `env` until it ends by itself (bounded only by [`LAST_GUARD`]):
/// (stdout, stderr, exit status).
fn serve_until_it_ends(model: &str, env: &[(&str, &str)]) -> (String, String, Option<i32>) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_florence2"));
    cmd.env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .args(["serve", "--model", model, "--port", "0", "--dtype", "fp32"])
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A few lines of output: the pipes cannot fill while the server runs.
    let ended = poll_until(|| child.try_wait().unwrap().is_some());
    if !ended {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    assert!(ended, "the server did not end within {LAST_GUARD:?}");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (text(&out.stdout), text(&out.stderr), out.status.code())
}

#[test]
fn a_failed_download_ends_the_server_with_the_named_error() {
    // The hub lacks the model (404 on its config).
    let hub = Hub::start(Quirks::default());
    let cache = tempdir("missing");
    let (stdout, stderr, code) = serve_until_it_ends("acme/nosuch", &hub_env(&hub, &cache));
    assert!(
        stdout.contains("listening on http://"),
        "bound first: {stdout}"
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("acme/nosuch/config.json") && stderr.contains("not found on the hub"),
        "{stderr}"
    );

    // The weights' bytes do not hash to the announced ETag.
    let hub = Hub::start(Quirks {
        corrupt: true,
        ..Default::default()
    });
    let cache = tempdir("corrupt");
    let (stdout, stderr, code) = serve_until_it_ends("acme/tiny4", &hub_env(&hub, &cache));
    assert!(
        stdout.contains("listening on http://"),
        "bound first: {stdout}"
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("checksum mismatch for acme/tiny4/model.safetensors"),
        "{stderr}"
    );

    // Offline with nothing cached.
    let cache = tempdir("offline");
    let mut env = hub_env(&hub, &cache);
    env.retain(|(k, _)| *k != "HF_HUB_OFFLINE");
    env.push(("HF_HUB_OFFLINE", "1"));
    let (_, stderr, code) = serve_until_it_ends("acme/tiny4", &env);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("acme/tiny4@main") && stderr.contains("offline mode"),
        "{stderr}"
    );
}
