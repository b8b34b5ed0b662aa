#!/usr/bin/env bash
# Build the npm package into pkg/ (wasm-pack, ES-module target for browsers).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
wasm-pack build --target web --release --mode no-install --out-dir pkg --out-name florence2_wasm
echo "built pkg/ ($(du -h pkg/florence2_wasm_bg.wasm | cut -f1) of wasm)"
