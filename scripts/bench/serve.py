#!/usr/bin/env python3
"""Load benchmark for `florence2 serve` (standard library only).

Starts the server on a free loopback port (default: the tiny4 fixture model), warms it up, records its
resident memory (VmRSS) as the baseline, then runs N concurrent clients for a bounded time. Each client
loops over a mix of requests:
  - valid: <CAPTION> / <OD> / <OCR_WITH_REGION>, greedy or 2 beams, some streamed (SSE);
  - invalid: unknown task, markup in a text input, a corrupt PNG, no image, two images, n = 2, a body over
    --max-body-bytes (413);
  - abandoned: a streamed request whose client disconnects after the first bytes (cancellation path).
Every non-abandoned request must get exactly one well-formed answer: the status expected for its kind
(valid: 200, or 429 when the queue is full, after which the client backs off 50-200 ms; invalid: its
4xx, or 429 for a corrupt image, which is decoded only after admission), a JSON body of the right shape (a
chat.completion, an SSE stream of chunks ending in [DONE], or {"error": {message, type, param, code}}).
Afterwards the server must be idle (in-flight 0) and its RSS must come back to the baseline (within
--rss-tolerance-mib, default 32 MiB: allocator caches, lavapipe's pipeline caches), after the same warm-up
request mix is run again.

Prints throughput (answers/s, and valid 200s/s), p50/p99 latency per kind, the outcome table, and RSS
before/after. Exit status 1 if any assertion fails.

Usage: python3 scripts/bench/serve.py [--bin target/debug/florence2] [--clients 8] [--seconds 30]
       [--model tests/fixtures/models/tiny4] [--max-queue 16]
"""

import argparse
import base64
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "tests" / "fixtures" / "images"


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def data_url(name):
    kind = "png" if name.endswith(".png") else "jpeg"
    return f"data:image/{kind};base64," + base64.b64encode((IMAGES / name).read_bytes()).decode()


def body(prompt, urls, **extra):
    content = [{"type": "text", "text": prompt}] + [
        {"type": "image_url", "image_url": {"url": u}} for u in urls
    ]
    b = {"model": "bench", "messages": [{"role": "user", "content": content}]}
    b.update(extra)
    return json.dumps(b).encode()


def make_mix(max_body):
    scene, jpg, rgba = data_url("scene.png"), data_url("scene.jpg"), data_url("rgba.png")
    corrupt = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 64).decode()
    valid = [
        ("valid", body("<CAPTION>", [scene], max_tokens=16, num_beams=1), False),
        ("valid", body("<OD>", [jpg], max_tokens=16, num_beams=2), False),
        ("valid", body("<OCR_WITH_REGION>", [rgba], max_tokens=16, num_beams=1), False),
        ("valid_stream", body("<CAPTION>", [jpg], max_tokens=16, num_beams=1, stream=True), True),
    ]
    invalid = [
        ("invalid", body("<NOT_A_TASK>", [scene]), False, 400),
        ("invalid", body("<OPEN_VOCABULARY_DETECTION>a <s> cat", [scene]), False, 400),
        # Decoded after admission (admission bounds the memory of decoding): 429 when the queue is full.
        ("invalid_image", body("<OD>", [corrupt]), False, (400, 429)),
        ("invalid", body("<OD>", []), False, 400),
        ("invalid", body("<OD>", [scene, scene]), False, 400),
        ("invalid", body("<OD>", [scene], n=2), False, 400),
        ("too_large", b" " * (max_body + 1), False, 413),
    ]
    abandon = ("abandoned", body("<CAPTION>", [scene], max_tokens=32, num_beams=1, stream=True), True)
    return valid, invalid, abandon


def check_error(status, raw):
    v = json.loads(raw)
    e = v["error"]
    assert isinstance(e["message"], str) and isinstance(e["type"], str), v
    assert "param" in e and "code" in e, v
    return e["code"]


def check_completion(raw):
    v = json.loads(raw)
    assert v["object"] == "chat.completion", v
    m = v["choices"][0]["message"]
    assert m["role"] == "assistant" and isinstance(m["content"], str), v
    assert "florence2_result" in m and v["usage"]["completion_tokens"] >= 0, v


def check_stream(raw):
    events = [e for e in raw.decode().split("\n\n") if e.strip()]
    data = [l[len("data: "):] for e in events for l in e.splitlines() if l.startswith("data: ")]
    assert data and data[-1] == "[DONE]", data[-3:]
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c.get("object") == "chat.completion.chunk" for c in chunks), chunks
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]) == 1, chunks


def one_request(addr, payload, stream, key=None):
    conn = http.client.HTTPConnection(addr[0], addr[1], timeout=600)
    try:
        headers = {"Content-Type": "application/json"}
        conn.request("POST", "/v1/chat/completions", body=payload, headers=headers)
        r = conn.getresponse()
        raw = r.read()
        return r.status, r.getheader("Content-Type") or "", raw
    finally:
        conn.close()


def abandon_request(addr, payload):
    s = socket.create_connection(addr, timeout=600)
    try:
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n").encode()
        s.sendall(head + payload)
        s.recv(1)  # the response started (headers, or a 429/4xx): leave
    finally:
        s.close()


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def get_json(addr, path):
    conn = http.client.HTTPConnection(addr[0], addr[1], timeout=30)
    conn.request("GET", path)
    r = conn.getresponse()
    return r.status, r.read()


def metric(addr, sample):
    _, raw = get_json(addr, "/metrics")
    for line in raw.decode().splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=None)
    ap.add_argument("--model", default=str(ROOT / "tests" / "fixtures" / "models" / "tiny4"))
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--max-queue", type=int, default=16)
    ap.add_argument("--max-body-bytes", type=int, default=256 << 10)
    ap.add_argument("--rss-tolerance-mib", type=float, default=32.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    binary = args.bin
    if binary is None:
        rel = ROOT / "target" / "release" / "florence2"
        binary = str(rel if rel.exists() else ROOT / "target" / "debug" / "florence2")

    env = dict(os.environ, NODEVICE_SELECT="1")
    env.pop("FLORENCE2_API_KEY", None)
    proc = subprocess.Popen(
        [binary, "serve", "--model", args.model, "--model-id", "bench", "--port", "0", "--max-queue", str(args.max_queue),
         "--max-body-bytes", str(args.max_body_bytes), "--shutdown-timeout", "10"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    failures = []
    try:
        line = proc.stdout.readline()
        host, port = line.strip().rsplit("http://", 1)[1].rsplit(":", 1)
        addr = (host, int(port))
        for _ in range(1200):
            try:
                if get_json(addr, "/health")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        else:
            raise SystemExit("server not ready after 120 s")

        valid, invalid, abandon = make_mix(args.max_body_bytes)

        def warm():
            for kind, payload, stream in valid:
                st, _, raw = one_request(addr, payload, stream)
                assert st == 200, (kind, st, raw[:200])
            for kind, payload, stream, want in invalid:
                st, _, _ = one_request(addr, payload, stream)
                assert st in (want if isinstance(want, tuple) else (want,)), (kind, st)

        for _ in range(3):
            warm()
        rss_base = rss_mib(proc.pid)

        results = []  # (kind, status, seconds)
        lock = threading.Lock()
        deadline = time.monotonic() + args.seconds

        def client(i):
            rng = random.Random(args.seed * 1000 + i)
            while time.monotonic() < deadline:
                r = rng.random()
                t0 = time.monotonic()
                try:
                    if r < 0.05:
                        abandon_request(addr, abandon[1])
                        rec = ("abandoned", 0, time.monotonic() - t0)
                    elif r < 0.45:
                        kind, payload, stream, want = rng.choice(invalid)
                        st, ctype, raw = one_request(addr, payload, stream)
                        want = want if isinstance(want, tuple) else (want,)
                        assert st in want, f"{kind}: status {st}, wanted {want}: {raw[:200]!r}"
                        check_error(st, raw)
                        rec = (kind, st, time.monotonic() - t0)
                    else:
                        kind, payload, stream = rng.choice(valid)
                        st, ctype, raw = one_request(addr, payload, stream)
                        if st == 200 and stream:
                            assert ctype.startswith("text/event-stream"), ctype
                            check_stream(raw)
                        elif st == 200:
                            check_completion(raw)
                        elif st == 429:
                            assert check_error(st, raw) == "queue_full"
                        else:
                            raise AssertionError(f"{kind}: status {st}: {raw[:200]!r}")
                        rec = (kind, st, time.monotonic() - t0)
                        if st == 429:
                            time.sleep(rng.uniform(0.05, 0.2))  # back off, as Retry-After asks
                except Exception as e:  # noqa: BLE001 - every failure is reported
                    with lock:
                        failures.append(f"client {i}: {type(e).__name__}: {e}")
                    continue
                with lock:
                    results.append(rec)

        t0 = time.monotonic()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        rss_peak_after_load = rss_mib(proc.pid)

        # Idle again: nothing in flight (bounded wait), then the warm-up mix once more.
        for _ in range(600):
            if metric(addr, "florence2_in_flight") == 0:
                break
            time.sleep(0.1)
        else:
            failures.append("requests still in flight 60 s after the load")
        warm()
        rss_after = rss_mib(proc.pid)
        answered = [r for r in results if r[0] != "abandoned"]
        ok = [r for r in answered if r[1] == 200]

        print(f"florence2 serve load: {args.clients} clients, {wall:.1f} s, model {Path(args.model).name}, "
              f"binary {Path(binary).parent.name}, max-queue {args.max_queue}")
        print(f"  answers: {len(answered)} ({len(answered) / wall:.1f}/s); valid 200s: {len(ok)} "
              f"({len(ok) / wall:.2f}/s); abandoned: {len(results) - len(answered)}; failures: {len(failures)}")
        kinds = sorted({(k, s) for k, s, _ in results})
        print(f"  {'kind':14} {'status':>6} {'count':>6} {'p50 ms':>9} {'p99 ms':>9}")
        for k, s in kinds:
            lat = [t for kk, ss, t in results if kk == k and ss == s]
            print(f"  {k:14} {s:>6} {len(lat):>6} {percentile(lat, 50) * 1e3:>9.1f} "
                  f"{percentile(lat, 99) * 1e3:>9.1f}")
        all_ok = [t for k, s, t in results if s == 200]
        print(f"  all 200s: p50 {percentile(all_ok, 50) * 1e3:.1f} ms, p99 {percentile(all_ok, 99) * 1e3:.1f} ms")
        print(f"  RSS MiB: baseline {rss_base:.1f}, right after load {rss_peak_after_load:.1f}, "
              f"after settle + warm-up mix {rss_after:.1f} (tolerance {args.rss_tolerance_mib:.0f})")
        m = {o: metric(addr, f'florence2_requests_total{{outcome="{o}"}}')
             for o in ["ok", "invalid", "too_large", "queue_full", "cancelled", "error"]}
        print(f"  server counters: {m}")
        if m["error"]:
            failures.append(f"{m['error']:.0f} requests ended in a server error")
        if not ok:
            failures.append("no valid request succeeded")
        if rss_after > rss_base + args.rss_tolerance_mib:
            failures.append(f"RSS {rss_after:.1f} MiB did not return to the baseline {rss_base:.1f} MiB")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        if code != 0:
            failures.append(f"exit status {code} after SIGTERM")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for f in failures[:20]:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
