#!/usr/bin/env python3
"""The load targets of continuous batching, side by side in one run (standard library only).

1. Server: `florence2 serve --max-batch B` on a free loopback port. First one client sends `<CAPTION>`
   requests one after another (one at a time: its answers/s and median latency), then C clients send
   the same requests at once (answers/s and median latency under load). Prints both, their ratios
   (targets: throughput >= 3x one at a time, median latency <= 2x a single request) and, with
   --compare-unbatched, the same C clients against `--max-batch 1` (the server before batching). Every
   answer must be the same whatever the load (token ids compared).
2. CLI (--cli-images N, 0 skips): scripts/bench/cli_batch.py on N images: one `florence2 run` batch vs
   one process per image (target: >= 2x).

Usage: python3 scripts/bench/load.py [--bin target/release/florence2]
       [--model www/models/florence2-shapes] [--device gpu|cpu|auto] [--dtype fp16]
       [--clients 8] [--requests 48] [--max-batch 8] [--compare-unbatched] [--cli-images 200]
"""

import argparse
import base64
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "www" / "models" / "florence2-shapes"


def images(model):
    """Data URLs of the model's samples (the demo model's), else the fixture images."""
    samples = Path(model) / "samples"
    files = sorted(samples.glob("*.png")) if samples.is_dir() else []
    if not files:
        files = [ROOT / "tests" / "fixtures" / "images" / n for n in ("scene.png", "scene.jpg")]
    out = []
    for f in files:
        kind = "png" if f.suffix == ".png" else "jpeg"
        out.append(f"data:image/{kind};base64," + base64.b64encode(f.read_bytes()).decode())
    return out


class Server:
    def __init__(self, a, max_batch):
        args = [a.bin, "serve", "--model", a.model, "--model-id", "m", "--port", "0", "--dtype", a.dtype,
                "--device", a.device, "--max-batch", str(max_batch),
                "--max-queue", str(max(16, a.clients * 2))]
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.p.stdout.readline()
        self.host, port = line.strip().rsplit("http://", 1)[1].rsplit(":", 1)
        self.port = int(port)
        for _ in range(6000):
            try:
                c = http.client.HTTPConnection(self.host, self.port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise SystemExit("the server did not become ready")

    def ask(self, url, max_tokens):
        body = json.dumps({
            "model": "m", "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "<CAPTION>"},
                {"type": "image_url", "image_url": {"url": url}}]}],
        })
        t = time.perf_counter()
        c = http.client.HTTPConnection(self.host, self.port, timeout=600)
        c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        dt = time.perf_counter() - t
        if r.status != 200:
            raise SystemExit(f"HTTP {r.status}: {data[:300]!r}")
        ids = json.loads(data)["choices"][0]["message"]["florence2_result"]["token_ids"]
        return dt, ids

    def close(self):
        self.p.terminate()
        self.p.wait()


def one_at_a_time(server, urls, n, max_tokens):
    t = time.perf_counter()
    lat, answers = [], {}
    for i in range(n):
        dt, ids = server.ask(urls[i % len(urls)], max_tokens)
        lat.append(dt)
        answers[i % len(urls)] = ids
    return n / (time.perf_counter() - t), statistics.median(lat), answers


def concurrent(server, urls, clients, n, max_tokens):
    lat, answers, lock = [], {}, threading.Lock()
    per = [list(range(c, n, clients)) for c in range(clients)]

    def client(mine):
        for i in mine:
            dt, ids = server.ask(urls[i % len(urls)], max_tokens)
            with lock:
                lat.append(dt)
                prev = answers.setdefault(i % len(urls), ids)
                if prev != ids:
                    raise SystemExit(f"image {i % len(urls)}: answers differ under load")

    threads = [threading.Thread(target=client, args=(m,)) for m in per]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return n / (time.perf_counter() - t), statistics.median(lat), answers


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "florence2"))
    ap.add_argument("--model", default=str(DEMO))
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=48, help="requests per measurement")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--compare-unbatched", action="store_true")
    ap.add_argument("--cli-images", type=int, default=200)
    a = ap.parse_args()
    urls = images(a.model)
    print(f"model {a.model} ({a.dtype}, device {a.device}), <CAPTION>, {len(urls)} images, "
          f"{a.requests} requests per measurement, {os.cpu_count()} cores")

    s = Server(a, a.max_batch)
    try:
        s.ask(urls[0], a.max_tokens)  # warm-up: pipelines, tuning cache
        tp1, p50_1, ans1 = one_at_a_time(s, urls, a.requests, a.max_tokens)
        tpc, p50_c, ansc = concurrent(s, urls, a.clients, a.requests, a.max_tokens)
    finally:
        s.close()
    same = all(ans1[k] == v for k, v in ansc.items() if k in ans1)
    print(f"one at a time:       {tp1:6.2f} answers/s, median latency {p50_1 * 1e3:7.1f} ms")
    print(f"{a.clients} clients, batch {a.max_batch}: {tpc:6.2f} answers/s, median latency "
          f"{p50_c * 1e3:7.1f} ms")
    print(f"throughput {tpc / tp1:.2f}x one at a time (target >= 3x); median latency "
          f"{p50_c / p50_1:.2f}x a single request (target <= 2x)")
    if a.compare_unbatched:
        u = Server(a, 1)
        try:
            u.ask(urls[0], a.max_tokens)
            tpu, p50_u, ansu = concurrent(u, urls, a.clients, a.requests, a.max_tokens)
        finally:
            u.close()
        same = same and all(ans1[k] == v for k, v in ansu.items() if k in ans1)
        print(f"{a.clients} clients, batch 1: {tpu:6.2f} answers/s, median latency {p50_u * 1e3:7.1f} ms "
              f"(batching: {tpc / tpu:.2f}x the throughput)")
    print("answers identical across the runs" if same else "FAIL: answers differ across the runs")

    if a.cli_images > 0:
        print()
        r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench" / "cli_batch.py"),
                            "--bin", a.bin, "--model", a.model, "--images", str(a.cli_images),
                            "--dtype", a.dtype, "--device", a.device])
        if r.returncode != 0:
            return r.returncode
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
