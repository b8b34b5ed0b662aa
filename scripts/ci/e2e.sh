#!/usr/bin/env bash
# End-to-end tests of the demo (www/) in headless Chromium: Playwright (playwright-core, www/package.json)
# drives Debian's /usr/bin/chromium with WebGPU. Builds pkg/ if missing or stale and the native CLI (the
# reference the page's answers are compared with), serves the demo on a free loopback port with the tiny
# fixture model at /model/ and tests/fixtures at /fixtures/, runs www/tests/*.test.mjs with node's test
# runner, then stops the server. Screenshots go to test-output/.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$HOME/.cargo/bin:$PATH"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
export NODEVICE_SELECT=1

if [ ! -f pkg/florence2_wasm_bg.wasm ] || [ ! -f pkg/florence2_wasm_relaxed_bg.wasm ] || [ -n "$(find src shaders scripts/build.sh Cargo.toml -newer pkg/florence2_wasm_bg.wasm -print -quit)" ]; then
  scripts/build.sh
fi
cargo build --bin florence2
if [ ! -d www/node_modules/playwright-core ]; then
  (cd www && npm ci --no-audit --no-fund)
fi

mkdir -p test-output
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 scripts/serve.py --port "$port" --model-dir tests/fixtures/models/tiny4 --mount /fixtures/=tests/fixtures \
  >test-output/e2e-serve.log 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 1 50); do
  if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/index.html')" 2>/dev/null; then break; fi
  sleep 0.2
done

E2E_BASE_URL="http://127.0.0.1:$port/" node --test --test-reporter=spec www/tests/*.test.mjs
