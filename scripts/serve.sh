#!/usr/bin/env bash
# The main job: build the npm package (wasm-pack -> pkg/) if it is missing or older than the sources, then
# serve www/ (the demo) and pkg/ on 127.0.0.1 and print the URL to open.
#   scripts/serve.sh [--port 8080] [--model-dir DIR] [--no-build]
# --model-dir serves a local model directory at /model/ (use ?model=/model/ in the demo). The demo model
# (www/models/florence2-shapes) is always served with the page: ?model=demo, or its preset in the page.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
port=8080
model_dir=""
build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port="$2"; shift 2 ;;
    --model-dir) model_dir="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    *) echo "usage: scripts/serve.sh [--port N] [--model-dir DIR] [--no-build]" >&2; exit 2 ;;
  esac
done

if [ "$build" = 1 ]; then
  if [ ! -f pkg/florence2_wasm_bg.wasm ] || [ -n "$(find src shaders scripts/npm/*.js scripts/npm/*.d.ts scripts/build.sh Cargo.toml -newer pkg/florence2_wasm_bg.wasm -print -quit)" ]; then
    scripts/build.sh
  fi
fi

exec python3 scripts/serve.py --port "$port" ${model_dir:+--model-dir "$model_dir"}
