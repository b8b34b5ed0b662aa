#!/usr/bin/env bash
# Install what a fresh Debian machine needs to build, serve and test florence2-wasm. Idempotent: every
# step checks first, so a second run costs seconds.
#   - Debian: Mesa's lavapipe (Vulkan on the CPU) for native wgpu tests; Chromium + ChromeDriver for the
#     browser tests (WebGPU on SwiftShader); g++ for libFuzzer (scripts/ci/fuzz.sh); libjpeg-turbo's
#     TurboJPEG library and headers (libturbojpeg0-dev) and pkg-config, which the native build links for
#     JPEG decoding (the `libjpeg-turbo` feature; scripts/build/link_libjpeg_turbo.rs).
#   - Rust: the wasm32-unknown-unknown target, wasm-pack, and wasm-bindgen-cli at exactly the version
#     pinned in Cargo.lock (the CLI and the crate must match).
#   - npm: the packages the end-to-end tests and the demo server use (www/package.json), and the bundlers
#     and TypeScript compiler of the npm package tests (scripts/npm/bundlers/package.json).
#   - Python: a virtual environment in scripts/.cache/venv (gitignored) with the official `openai` client,
#     pinned, for the `florence2 serve` client test (scripts/ci/test_openai_client.py).
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null; then SUDO=sudo; fi

need=()
# g++: libFuzzer (C++) is compiled by the fuzz targets' libfuzzer-sys (scripts/ci/fuzz.sh).
# libturbojpeg0-dev + pkg-config: native JPEG decoding through libjpeg-turbo (Pillow's decoder).
for p in mesa-vulkan-drivers libvulkan1 chromium chromium-driver g++ python3-venv libturbojpeg0-dev pkg-config; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
fi

if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
  rustup target add wasm32-unknown-unknown
fi

export PATH="$HOME/.cargo/bin:$PATH"
if ! command -v wasm-pack >/dev/null; then
  cargo install wasm-pack --version 0.15.1
fi

wb_version=$(awk '$0 == "name = \"wasm-bindgen\"" { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)
if [ -z "$wb_version" ]; then
  echo "setup: no wasm-bindgen version in Cargo.lock" >&2
  exit 1
fi
if ! wasm-bindgen --version 2>/dev/null | grep -qF "$wb_version"; then
  cargo install wasm-bindgen-cli --version "$wb_version"
fi

if [ -f www/package.json ] && [ ! -d www/node_modules ]; then
  (cd www && npm ci --no-audit --no-fund)
fi
OPENAI_VERSION=3.51.0
venv=scripts/.cache/venv
if ! "$venv/bin/python" -c "import openai, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION')" 2>/dev/null; then
  echo "setup: python venv with openai $OPENAI_VERSION in $venv"
  mkdir -p scripts/.cache
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "openai==$OPENAI_VERSION"
fi

# The bundlers the npm package tests build apps with (Vite, webpack 5) and the TypeScript compiler and
# @types/node they type-check the package's declarations with: pinned by their package-lock.json.
if [ -f scripts/npm/bundlers/package.json ] && { [ ! -d scripts/npm/bundlers/node_modules/vite ] ||
  [ ! -d scripts/npm/bundlers/node_modules/typescript ] || [ ! -d scripts/npm/bundlers/node_modules/@types/node ]; }; then
  (cd scripts/npm/bundlers && npm ci --no-audit --no-fund)
fi
echo "setup: ok ($(wasm-pack --version), wasm-bindgen $wb_version)"
