#!/usr/bin/env bash
# The main job: build the npm package (wasm-pack -> pkg/) in release unless pkg/ already holds a release
# build no older than the sources, then serve www/ (the demo) and pkg/ on 127.0.0.1 and print the URL.
#   scripts/serve.sh [--port 8080] [--model-dir DIR] [--no-build]
#   scripts/serve.sh --check [PKG_DIR]   print what the build step would do (and why), build nothing
# A pkg/ built by `scripts/build.sh --dev` (the npm test phase's build: unoptimised, about 20x slower) is
# never served as it is: scripts/build.sh records the profile in pkg/.build-profile, and anything but
# `release` is rebuilt, saying so. With --no-build a dev build is served with a warning.
# --model-dir serves a local model directory at /model/ (use ?model=/model/ in the demo). The demo model
# (www/models/florence2-shapes) is always served with the page: ?model=demo, or its preset in the page.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

# Why PKG_DIR ($1) needs a release build, on stdout; nothing when it holds a fresh release build.
build_reason() {
  local pkg="$1"
  if [ ! -f "$pkg/florence2_wasm_bg.wasm" ]; then
    echo "$pkg holds no build"
    return
  fi
  if [ ! -f "$pkg/florence2_wasm_relaxed_bg.wasm" ]; then
    echo "$pkg holds no relaxed-SIMD build (built by an older scripts/build.sh)"
    return
  fi
  if [ ! -f "$pkg/.build-profile" ]; then
    echo "$pkg records no build profile (built before scripts/build.sh recorded it, or a build failed)"
    return
  fi
  local built
  built=$(cat "$pkg/.build-profile")
  if [ "$built" != release ]; then
    echo "$pkg holds a $built build, not a release one"
    return
  fi
  local newer
  newer=$(find src shaders scripts/build.sh Cargo.toml \
    -newer "$pkg/florence2_wasm_bg.wasm" -print -quit)
  if [ -n "$newer" ]; then
    echo "$newer is newer than the build in $pkg"
  fi
}

port=8080
model_dir=""
build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port="$2"; shift 2 ;;
    --model-dir) model_dir="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    --check)
      reason=$(build_reason "${2:-pkg}")
      if [ -n "$reason" ]; then echo "rebuild: $reason"; else echo "fresh: ${2:-pkg} holds a current release build"; fi
      exit 0 ;;
    *) echo "usage: scripts/serve.sh [--port N] [--model-dir DIR] [--no-build] | --check [PKG_DIR]" >&2; exit 2 ;;
  esac
done

reason=$(build_reason pkg)
if [ -n "$reason" ]; then
  if [ "$build" = 1 ]; then
    echo "serve: building pkg/ in release: $reason" >&2
    scripts/build.sh
  else
    echo "serve: warning: --no-build: $reason" >&2
  fi
fi

exec python3 scripts/serve.py --port "$port" ${model_dir:+--model-dir "$model_dir"}
