//! What keeps `florence2 serve` safe and up: remote image fetches connect only to public addresses
//! (after resolving the host, with an injected resolver, `FLORENCE2_SERVE_TEST_RESOLVE`) unless
//! `--allow-private-remote-images`; `--max-queued-image-bytes` bounds the decoded images admitted
//! requests hold (429 beyond it); running out of GPU memory answers 503 with `Retry-After` and the server
//! goes on (the out-of-memory error is injected through the worker's test hook).

use serde_json::json;

use crate::serve_util::*;
use crate::{assert_error, Origin};

#[test]
fn remote_fetches_reach_only_public_addresses() {
    let png = std::fs::read(fixtures().join("images/scene.png")).unwrap();
    let origin = Origin::start(png, "png");
    let port = origin.addr.port();
    let resolve = "images.test=127.0.0.1,metadata.test=169.254.169.254";
    let body = |url: &str| chat_body("<CAPTION>", url, json!({"max_tokens": 4, "num_beams": 1}));

    let server = Server::start(
        "tiny4",
        &["--allow-remote-images", "--remote-image-timeout", "5"],
        &[("FLORENCE2_SERVE_TEST_RESOLVE", resolve)],
    );
    server.wait_ready();
    for url in [
        origin.url("/img"),
        format!("http://images.test:{port}/img"),
        format!("http://localhost:{port}/img"),
        format!("http://[::ffff:127.0.0.1]:{port}/img"),
        "http://metadata.test/latest/meta-data/".to_string(),
        "http://169.254.169.254/latest/meta-data/".to_string(),
        "http://10.0.0.1/x.png".to_string(),
    ] {
        let r = server.post_json("/v1/chat/completions", &body(&url));
        let e = assert_error(&r, 400, "remote_image_address_refused", &url);
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .contains("--allow-private-remote-images"),
            "{e}"
        );
    }
    assert_eq!(origin.hits(), 0, "refused before connecting");
    drop(server);

    let open = Server::start(
        "tiny4",
        &["--allow-remote-images", "--allow-private-remote-images"],
        &[("FLORENCE2_SERVE_TEST_RESOLVE", resolve)],
    );
    open.wait_ready();
    let url = format!("http://images.test:{port}/img");
    let r = open.post_json("/v1/chat/completions", &body(&url));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(origin.hits(), 1);
}

#[test]
fn queued_images_are_bounded_and_out_of_memory_is_a_503() {
    let dir = std::env::temp_dir().join(format!("florence2-serve-guards-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hold = dir.join("hold");
    let _ = std::fs::remove_file(&hold);
    let scene = florence2_wasm::processor::image::decode_image(
        &std::fs::read(fixtures().join("images/scene.png")).unwrap(),
        &Default::default(),
    )
    .unwrap();
    let pixels = u64::from(scene.width()) * u64::from(scene.height());
    // Room for one scene.png and 10 bytes more.
    let budget = (pixels * 3 + 10).to_string();
    let server = Server::start(
        "tiny4",
        &[
            "--max-queued-image-bytes",
            &budget,
            "--max-image-pixels",
            &pixels.to_string(),
        ],
        &[("FLORENCE2_SERVE_HOLD_FILE", hold.to_str().unwrap())],
    );
    server.wait_ready();
    let body = serde_json::to_vec(&chat_body(
        "<CAPTION>",
        &data_url("scene.png"),
        json!({"max_tokens": 8, "num_beams": 1}),
    ))
    .unwrap();
    let json_h = [("Content-Type", "application/json")];
    let post = || request(server.addr, "POST", "/v1/chat/completions", &json_h, &body);
    let alone = post();
    assert_eq!(alone.status, 200, "{}", alone.text());

    // A held request holds its decoded image: a second one does not fit.
    std::fs::write(&hold, "").unwrap();
    let decodes = server.metric("florence2_phase_seconds_count{phase=\"image_decode\"}");
    let a = send(server.addr, "POST", "/v1/chat/completions", &json_h, &body);
    server.wait_metric(
        "florence2_phase_seconds_count{phase=\"image_decode\"}",
        decodes + 1.0,
    );
    let r = post();
    assert_error(
        &r,
        429,
        "queued_images_full",
        "second image over the budget",
    );
    assert_eq!(r.header("retry-after"), Some("1"));
    std::fs::remove_file(&hold).unwrap();
    let a = read_response(a).unwrap();
    assert_eq!(a.status, 200, "{}", a.text());
    // Released with the answer: it fits again.
    assert_eq!(post().status, 200);

    // Out of GPU memory: 503 with Retry-After, and the next request is answered as before.
    std::fs::write(&hold, "oom").unwrap();
    let r = post();
    assert_error(&r, 503, "out_of_memory", "injected out-of-memory");
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(server.get("/health").status, 200, "the server stays up");
    std::fs::remove_file(&hold).unwrap();
    let after = post();
    assert_eq!(after.status, 200, "{}", after.text());
    assert_eq!(
        after.json()["choices"][0]["message"],
        alone.json()["choices"][0]["message"]
    );
    let _ = std::fs::remove_dir_all(&dir);
}
