#!/usr/bin/env bash
# Model bench in the browser: one task through the demo page (www/) in headless Chromium's WebGPU
# (SwiftShader when the machine has no GPU), on a Florence-2-shaped checkpoint, printing the page's
# load time, the task's phase timings and the wall time. Not part of the test suite (minutes at base
# shapes on a CPU adapter).
#
#   MODEL_BENCH_MEMORY=1 cargo bench --bench model     # writes target/bench-model/base-f32 (random weights)
#   TOKENIZER=/path/to/tokenizer.json scripts/bench/browser_model.sh
#
# MODEL_DIR (default target/bench-model/base-f32): any checkpoint directory; TOKENIZER: a tokenizer.json
# linked into it when it has none (the bench checkpoint has none). BENCH_TASK (<CAPTION>), BENCH_MAX (20
# new tokens), BENCH_BEAMS (1), BENCH_DTYPE (fp16), BENCH_IMAGE (tests/fixtures/images/scene.png; the
# processor resizes it to the config's image size, 768 for base). BENCH_WEBGPU=0: Chromium without WebGPU
# (the page's CPU backend). BENCH_NODE=1: then the same task in Node.js (scripts/bench/node_model.mjs,
# the package's CPU backend), for the Node / Chromium ratio in one run. BENCH_PKG: serve another release
# build of the package (a directory like pkg/, e.g. an earlier commit's) instead of pkg/, unbuilt.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$HOME/.cargo/bin:$PATH"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
MODEL_DIR=${MODEL_DIR:-target/bench-model/base-f32}
[ -f "$MODEL_DIR/config.json" ] || { echo "no checkpoint in $MODEL_DIR (see the header of $0)" >&2; exit 2; }
if [ ! -f "$MODEL_DIR/tokenizer.json" ]; then
  [ -n "${TOKENIZER:-}" ] || { echo "$MODEL_DIR has no tokenizer.json: set TOKENIZER" >&2; exit 2; }
  ln -sf "$(realpath "$TOKENIZER")" "$MODEL_DIR/tokenizer.json"
fi
mount=()
if [ -n "${BENCH_PKG:-}" ]; then
  mount=(--mount "/pkg/=$(realpath "$BENCH_PKG")")
elif [ -n "$(scripts/serve.sh --check pkg | grep '^rebuild')" ]; then
  scripts/build.sh
fi
[ -d www/node_modules/playwright-core ] || (cd www && npm ci --no-audit --no-fund)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p target/bench-browser
python3 scripts/serve.py --port "$port" --model-dir "$MODEL_DIR" --mount /fixtures/=tests/fixtures "${mount[@]}" \
  >target/bench-browser/serve.log 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 1 50); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/index.html')" 2>/dev/null && break
  sleep 0.2
done
BENCH_BASE_URL="http://127.0.0.1:$port/" node scripts/bench/browser_model.mjs
if [ "${BENCH_NODE:-0}" = 1 ]; then
  echo "--- Node.js"
  node scripts/bench/node_model.mjs "$MODEL_DIR" "tests/fixtures/images/$(basename "${BENCH_IMAGE:-scene.png}")"
fi
