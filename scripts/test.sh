#!/usr/bin/env bash
# Run every test: native (cargo test on wgpu's Vulkan backend; lavapipe when there is no GPU) and browser
# (wasm-pack test in headless Chromium's WebGPU). Fails if any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
# Mesa prints a harmless XDG_RUNTIME_DIR warning without this.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"

echo "== native tests"
cargo test --all-targets --no-fail-fast

echo "== browser tests (headless Chromium, WebGPU)"
export WASM_BINDGEN_TEST_TIMEOUT="${WASM_BINDGEN_TEST_TIMEOUT:-600}"
wasm-pack test --headless --chrome --mode no-install -- --test browser --test browser_model

echo "== npm package (npm pack, offline install, ES-module page in headless Chromium)"
scripts/npm_package_test.sh

if [ -x scripts/e2e.sh ]; then
  echo "== end-to-end demo tests"
  scripts/e2e.sh
fi
