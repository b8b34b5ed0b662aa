#!/usr/bin/env bash
# Browser kernel bench (SwiftShader in headless Chromium): every linear variant's GFLOP/s from the wasm
# build and the tuner's pick, printed as a table (scripts/bench/browser_kernels.rs). Needs what
# scripts/setup.sh installs (Chromium, chromedriver, wasm-pack, the wasm32 target). A few minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
export WASM_BINDGEN_TEST_TIMEOUT=${WASM_BINDGEN_TEST_TIMEOUT:-1800}
wasm-pack test --headless --chrome --mode no-install -- --test browser_kernels_bench -- --nocapture
