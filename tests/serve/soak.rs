//! A soak of the server on the CPU backend (`--device cpu`, the `auto` choice on machines without a
//! hardware GPU): 8 clients send the demo model's mixed requests (every task of three samples; greedy
//! and beams; some cut by their limit; some streamed) for several rounds at once. Every answer equals the
//! answer the same request gets alone, nothing fails, the counters add up, and a SIGTERM while
//! every client waits loses no accepted request; the idle server's resident set is back within 5% of
//! its baseline after the load. Bounded: 8 x 2 requests of warm-up, 8 x 4 after it, on the
//! 192 px demo model (a few minutes on 2 loaded cores at most).

use std::thread;

use serde_json::Value;

use crate::batching::{answer_of, body, requests, DEMO};
use crate::serve_util::*;

const CLIENTS: usize = 8;
const ROUNDS: usize = 4;
const WARM_UP: usize = 2;

/// The server's resident set in KiB, once it is idle: every request answered and then the worker
/// waiting for work, which it does only after handing the memory its requests freed back (the gauge
/// `florence2_worker_idle`). (VmRSS, RssAnon, RssFile) of `/proc/PID/status`.
fn idle_rss_kib(server: &Server) -> [f64; 3] {
    assert!(
        poll_until(|| server.metric("florence2_in_flight") == 0.0),
        "requests still in flight"
    );
    server.wait_metric("florence2_worker_idle", 1.0);
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
    ["VmRSS:", "RssAnon:", "RssFile:"].map(|key| {
        let line = status.lines().find(|l| l.starts_with(key)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    })
}

/// Each of the 8 clients sends `rounds` requests, one after another; client `c` starts at request `c`
/// of the list, so all tasks run at once. Returns (request index, answer) of every response.
fn load(server: &Server, rounds: usize) -> Vec<(usize, (Value, String))> {
    let reqs = requests();
    let addr = server.addr;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let reqs = reqs.clone();
            thread::spawn(move || {
                (0..rounds)
                    .map(|k| {
                        let i = (c + k * CLIENTS) % reqs.len();
                        let r = &reqs[i];
                        let h = [("Content-Type", "application/json")];
                        let resp = request(addr, "POST", "/v1/chat/completions", &h, &body(r));
                        (i, answer_of(&resp, r.2["stream"] == true))
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    clients
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect()
}

#[test]
fn eight_clients_on_the_cpu_backend_get_their_alone_answers_and_shutdown_loses_none() {
    let reqs = requests();
    let server = Server::start(
        DEMO,
        &[
            "--device",
            "cpu",
            "--max-batch",
            "8",
            "--shutdown-timeout",
            "600",
        ],
        &[],
    );
    server.wait_ready();
    let h = [("Content-Type", "application/json")];
    let alone: Vec<(Value, String)> = reqs
        .iter()
        .map(|r| {
            let resp = request(server.addr, "POST", "/v1/chat/completions", &h, &body(r));
            answer_of(&resp, r.2["stream"] == true)
        })
        .collect();
    let check = |got: &[(usize, (Value, String))], what: &str| {
        for (i, answer) in got {
            assert_eq!(
                answer, &alone[*i],
                "{what}: request {i} ({} {})",
                reqs[*i].0, reqs[*i].2
            );
        }
    };

    // Warm-up: the same load, so that the sizes the batch reaches (rows, scratch, recorded steps) are
    // allocated once before the baseline; what grows after it grows per request.
    check(&load(&server, WARM_UP), "warm-up");
    let baseline = idle_rss_kib(&server);

    let got = load(&server, ROUNDS);
    assert_eq!(got.len(), CLIENTS * ROUNDS);
    check(&got, "soak");
    // The idle server's resident set is back within 5% of the idle baseline (issue 36's bound): what
    // the requests allocated went back to the system. Both readings are taken at the same point, the
    // worker idle after its trim; the warm-up's load pages in the code and makes the allocations of
    // once (the model's, the runtime's) that a first request would otherwise add to the figure. Only
    // growth is bounded: less resident memory is no leak.
    let after = idle_rss_kib(&server);
    let growth = (after[0] / baseline[0] - 1.0) * 100.0;
    println!(
        "RSS: {:.0} KiB after the warm-up (anon {:.0}, file {:.0}), {:.0} KiB after {} requests \
         (anon {:.0}, file {:.0}): {growth:+.1}%",
        baseline[0],
        baseline[1],
        baseline[2],
        after[0],
        got.len(),
        after[1],
        after[2]
    );
    assert!(
        growth <= 5.0,
        "resident set {growth:+.1}% after {} requests: {baseline:?} -> {after:?} KiB",
        got.len()
    );

    // The counters add up: every request answered ok, nothing queued or running, steps batched.
    let text = server.get("/metrics").text();
    let sent = (reqs.len() + CLIENTS * (WARM_UP + ROUNDS)) as f64;
    assert_eq!(
        metric(&text, "florence2_requests_total{outcome=\"ok\"}"),
        sent,
        "{text}"
    );
    for outcome in ["invalid", "queue_full", "cancelled", "error", "unavailable"] {
        let sample = format!("florence2_requests_total{{outcome=\"{outcome}\"}}");
        assert_eq!(metric(&text, &sample), 0.0, "{sample}: {text}");
    }
    for gauge in [
        "florence2_queue_depth",
        "florence2_running",
        "florence2_in_flight",
    ] {
        assert_eq!(metric(&text, gauge), 0.0, "{gauge}: {text}");
    }
    let steps = metric(&text, "florence2_batch_size_count");
    let mean = metric(&text, "florence2_batch_size_sum") / steps;
    assert!(
        steps > 0.0 && (1.0..=8.0).contains(&mean),
        "mean batch {mean}: {text}"
    );
    assert_eq!(
        metric(&text, "florence2_batch_size_bucket{le=\"+Inf\"}"),
        steps
    );
    assert_eq!(metric(&text, "florence2_client_disconnects_total"), 0.0);

    // SIGTERM while 8 accepted requests wait or run: each is answered (a generous --shutdown-timeout
    // lets them finish), and the server exits 0.
    let addr = server.addr;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let r = reqs[i].clone();
            let s = send(addr, "POST", "/v1/chat/completions", &h, &body(&r));
            (i, r, s)
        })
        .collect();
    server.wait_metric("florence2_in_flight", CLIENTS as f64);
    let code = server.terminate();
    for (i, r, s) in clients {
        let resp = read_response(s).unwrap();
        assert_eq!(
            answer_of(&resp, r.2["stream"] == true),
            alone[i],
            "request {i} at shutdown"
        );
    }
    assert_eq!(code, Some(0));
}
