#!/usr/bin/env bash
# Browser CPU GEMM bench (headless Chromium's wasm engine, one thread): GFLOP/s of every GEMM backend
# on Florence-2-base shapes, from release builds with `+simd128` and with `+simd128,+relaxed-simd`
# (scripts/bench/browser_cpu_gemm.rs). Needs what scripts/setup.sh installs. A few minutes per build.
set -euo pipefail
cd "$(dirname "$0")/../.."
export WASM_BINDGEN_TEST_TIMEOUT=${WASM_BINDGEN_TEST_TIMEOUT:-1800}
# Each build in the target dir scripts/build.sh gives it (the relaxed one: target/wasm-relaxed), so
# neither invalidates the other's artifacts.
for build in "+simd128 target" "+simd128,+relaxed-simd target/wasm-relaxed"; do
  read -r features dir <<<"$build"
  echo "== wasm built with $features"
  CARGO_TARGET_DIR="$dir" RUSTFLAGS="-C target-feature=$features" wasm-pack test --release --headless \
    --chrome --mode no-install -- --test browser_cpu_gemm_bench -- --nocapture
done
