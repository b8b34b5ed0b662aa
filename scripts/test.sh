#!/usr/bin/env bash
# Run every test: native (cargo test on wgpu's Vulkan backend; lavapipe when there is no GPU) and browser
# (wasm-pack test in headless Chromium's WebGPU). Fails if any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
# Mesa prints a harmless XDG_RUNTIME_DIR warning without this.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"

# Each phase prints its heading; the time each one took is listed at the end (CI's budget is watched).
PHASES=""
phase_name=""
phase_start=$SECONDS
phase() {
  if [ -n "$phase_name" ]; then PHASES+="  $(( SECONDS - phase_start ))s  $phase_name"$'\n'; fi
  phase_name="$1"
  phase_start=$SECONDS
  if [ -n "$1" ]; then echo "== $1"; fi
}

phase "module graph: no circles between or inside the library's modules, nothing reached outside src/"
python3 scripts/ci/module_circles.py src

phase "native tests (stand-alone: nothing outside the repository is read)"
cargo test --all-targets --no-fail-fast

# The reference suite (tests/reference/) reads data that may not be copied into the repository:
# ../shared/reference beside the clone, or $FLORENCE2_REFERENCE_DIR. Run when it is there; otherwise say
# loudly that it was not run (and fail when FLORENCE2_REQUIRE_REFERENCE=1, as .ci/run sets).
REFERENCE_DIR="${FLORENCE2_REFERENCE_DIR:-$PWD/../shared/reference}"
REFERENCE_NOTE=""
if [ -d "$REFERENCE_DIR" ]; then
  phase "reference suite (data: $REFERENCE_DIR)"
  FLORENCE2_REFERENCE_DIR="$(cd "$REFERENCE_DIR" && pwd)" \
    cargo test --features reference-data --test reference --no-fail-fast
elif [ "${FLORENCE2_REQUIRE_REFERENCE:-0}" = 1 ]; then
  echo "== reference suite: FAILED, the reference data $REFERENCE_DIR is missing and FLORENCE2_REQUIRE_REFERENCE=1" >&2
  exit 1
else
  REFERENCE_NOTE="NOT RUN: the reference suite (tests/reference/, real tokenizer + checkpoint key lists) needs $REFERENCE_DIR, which is missing. Its tests were neither run nor counted."
  phase "reference suite $REFERENCE_NOTE"
fi

# Every fuzz target briefly (coverage-guided, libFuzzer on stable; scripts/ci/fuzz.sh runs them longer).
phase "fuzzing: every target ${FLORENCE2_FUZZ_SECONDS:-15} s"
scripts/ci/fuzz.sh "${FLORENCE2_FUZZ_SECONDS:-15}"

# The server, batch, tuner and pipeline suites again, with two busy processes on the machine: tests wait
# on events, not on time, and must pass on a loaded machine (CI runs on a developer's).
phase "contention check: serve + load-sensitive model suites beside 2 busy processes"
scripts/ci/contention.sh 2 native

phase "florence2 serve with the official openai Python client"
cargo build --bin florence2
scripts/.cache/venv/bin/python scripts/ci/test_openai_client.py --bin target/debug/florence2
# README.md and docs/: `florence2 ...` command lines name real subcommands and flags (--help); JS blocks are
# the package README's (run by its docs test) or marked not run (< 5 s).
python3 scripts/ci/docs_cli_test.py target/debug/florence2

phase "installs (cargo install from the debug build, cargo publish --dry-run, serve.sh's build check)"
scripts/ci/install_check.sh

phase "Node native addon (napi): ids equal the CLI's, named errors, abort, dispose"
scripts/npm/node_addon_test.sh

# Every test and bench target compiled for wasm32 (the browser-only benches under scripts/bench/ are not
# run below; this catches a wasm-only target broken by a native-looking change).
phase "wasm32 compile check of every test target"
cargo check --target wasm32-unknown-unknown --tests

phase "browser tests (headless Chromium, WebGPU)"
export WASM_BINDGEN_TEST_TIMEOUT="${WASM_BINDGEN_TEST_TIMEOUT:-600}"
wasm-pack test --headless --chrome --mode no-install -- --test browser --test browser_model --test wasm32_limits --test browser_gpu

# The browser tests that wait on GPU events again, beside two busy processes (their binaries are built).
phase "contention check: browser tests that wait on GPU events beside 2 busy processes"
scripts/ci/contention.sh 2 browser

# The release build (both wasm builds, SIMD128 and relaxed SIMD): the package as it ships; the end-to-end
# demo tests after it reuse it.
phase "npm package (npm pack, offline install, ES-module page in headless Chromium, Node.js)"
PKG_PROFILE=release scripts/ci/npm_package_test.sh

if [ -x scripts/ci/e2e.sh ]; then
  phase "end-to-end demo tests"
  scripts/ci/e2e.sh
fi

if [ -n "$REFERENCE_NOTE" ]; then
  echo
  echo "!! $REFERENCE_NOTE"
fi

phase ""
echo
echo "== time per phase (total ${SECONDS}s)"
printf '%s' "$PHASES"
