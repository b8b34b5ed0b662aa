#!/usr/bin/env python3
"""Static server for the demo: www/ at /, pkg/ at /pkg/, an optional model directory at /model/.

`--mount /PREFIX/=DIR` (repeatable) serves more directories, e.g. the test fixtures for the end-to-end tests.

Binds 127.0.0.1 only. Serves .wasm as application/wasm (needed for streaming compilation) and supports
HTTP Range requests on model files (the package may read safetensors headers with a ranged request).
"""
import argparse
import functools
import http.server
import os
import sys
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".wasm": "application/wasm",
        ".js": "text/javascript",
        ".mjs": "text/javascript",
        ".json": "application/json",
        ".safetensors": "application/octet-stream",
    }
    model_dir = None
    mounts = []  # [(prefix "/x/", absolute dir)]

    def translate_path(self, path):
        clean = urllib.parse.unquote(path.split("?", 1)[0].split("#", 1)[0])
        mount = next(((p, d) for p, d in self.mounts if clean.startswith(p)), None)
        if mount:
            base, rest = mount[1], clean[len(mount[0]):]
        elif clean.startswith("/pkg/"):
            base, rest = os.path.join(ROOT, "pkg"), clean[len("/pkg/"):]
        elif clean.startswith("/model/") and self.model_dir:
            base, rest = self.model_dir, clean[len("/model/"):]
        else:
            base, rest = os.path.join(ROOT, "www"), clean.lstrip("/")
        base = os.path.normpath(base)
        full = os.path.normpath(os.path.join(base, rest))
        if full != base and not full.startswith(base + os.sep):
            return os.path.join(base, "__forbidden__")
        return full

    def end_headers(self):
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Access-Control-Allow-Origin", "*")
        super().end_headers()

    def log_message(self, fmt, *args):
        sys.stderr.write("serve: " + (fmt % args) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--model-dir")
    ap.add_argument("--mount", action="append", default=[], metavar="/PREFIX/=DIR")
    a = ap.parse_args()
    Handler.model_dir = os.path.abspath(a.model_dir) if a.model_dir else None
    for m in a.mount:
        prefix, sep, d = m.partition("=")
        if not sep or not prefix.startswith("/") or not os.path.isdir(d):
            ap.error(f"--mount takes /PREFIX/=DIR with an existing DIR, got {m!r}")
        Handler.mounts.append((prefix.rstrip("/") + "/", os.path.abspath(d)))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    print(f"florence2-wasm demo: http://127.0.0.1:{a.port}/", flush=True)
    if Handler.model_dir:
        print(f"local model at http://127.0.0.1:{a.port}/model/: open http://127.0.0.1:{a.port}/?model=/model/", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
