#!/usr/bin/env python3
"""Static server for the demo: www/ at /, pkg/ at /pkg/, an optional model directory at /model/.

`--mount /PREFIX/=DIR` (repeatable) serves more directories, e.g. the test fixtures for the end-to-end tests.
`--hub /PREFIX/=DIR` serves model directories in the hub's path layout: `/PREFIX/ORG/NAME/resolve/REV/FILE` is
`DIR/NAME/FILE` for any ORG and REV (each request's revision is logged), so `Florence2.load("org/NAME",
{remoteHost: "http://127.0.0.1:PORT/PREFIX/"})` loads `DIR/NAME/`.
`--spa-fallback html|octet` answers every path that does not exist with 200 and the index page, as a
single-page-app server (Vite's dev server) does: with `Content-Type: text/html` (`html`) or with a generic
`application/octet-stream` type (`octet`, to test detection by content).

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
    hubs = []  # [(prefix "/x/", absolute dir)]
    spa_fallback = None  # None | "html" | "octet"
    index_page = os.path.join(ROOT, "www", "index.html")

    def translate_path(self, path):
        clean = urllib.parse.unquote(path.split("?", 1)[0].split("#", 1)[0])
        hub = next(((p, d) for p, d in self.hubs if clean.startswith(p)), None)
        if hub:
            parts = clean[len(hub[0]):].split("/")
            # ORG / NAME / resolve / REV / FILE...
            if len(parts) >= 5 and parts[2] == "resolve" and all(parts[:2] + parts[4:]):
                sys.stderr.write(f"serve: hub {parts[0]}/{parts[1]} revision {parts[3]}\n")
                base, rest = hub[1], "/".join([parts[1]] + parts[4:])
            else:
                base, rest = hub[1], "__not_a_hub_path__"
        elif (mount := next(((p, d) for p, d in self.mounts if clean.startswith(p)), None)):
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

    def send_head(self):
        if self.spa_fallback and not os.path.exists(self.translate_path(self.path)):
            # Single-page-app fallback: any missing path is the index page, 200.
            with open(self.index_page, "rb") as f:
                body = f.read()
            self.send_response(200)
            ctype = "text/html; charset=utf-8" if self.spa_fallback == "html" else "application/octet-stream"
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            import io
            return io.BytesIO(body)
        return super().send_head()

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
    ap.add_argument("--hub", action="append", default=[], metavar="/PREFIX/=DIR")
    ap.add_argument("--spa-fallback", choices=["html", "octet"])
    ap.add_argument("--index", help="the page the SPA fallback answers with (default www/index.html)")
    a = ap.parse_args()
    Handler.spa_fallback = a.spa_fallback
    if a.index:
        Handler.index_page = os.path.abspath(a.index)
    Handler.model_dir = os.path.abspath(a.model_dir) if a.model_dir else None
    for m in a.mount:
        prefix, sep, d = m.partition("=")
        if not sep or not prefix.startswith("/") or not os.path.isdir(d):
            ap.error(f"--mount takes /PREFIX/=DIR with an existing DIR, got {m!r}")
        Handler.mounts.append((prefix.rstrip("/") + "/", os.path.abspath(d)))
    for m in a.hub:
        prefix, sep, d = m.partition("=")
        if not sep or not prefix.startswith("/") or not os.path.isdir(d):
            ap.error(f"--hub takes /PREFIX/=DIR with an existing DIR, got {m!r}")
        Handler.hubs.append((prefix.rstrip("/") + "/", os.path.abspath(d)))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    print(f"florence2-wasm demo: http://127.0.0.1:{a.port}/", flush=True)
    if Handler.model_dir:
        print(f"local model at http://127.0.0.1:{a.port}/model/: open http://127.0.0.1:{a.port}/?model=/model/", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
