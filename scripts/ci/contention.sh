#!/usr/bin/env bash
# The contention check: the suites whose tests wait on events across processes (the server, the CLI's
# batches and crash tests, the tuner, the decode batch, and the browser tests that wait on the GPU's
# events: device loss and recovery, abort, queued calls and dispose, load progress and the cache, the
# fence) run while two busy processes hold the machine's
# cores, as on a developer's loaded machine where CI runs. They must pass: a test that waits on time
# instead of events fails here first.
#   scripts/ci/contention.sh [BUSY_PROCESSES] [PART]   (default 2; PART: native, browser or all, default all)
# scripts/test.sh runs `native` after the native tests and `browser` after the browser tests, so that
# neither part compiles its test binaries beside the busy loops (a cold wasm test build there took
# minutes of CI time).
set -euo pipefail
cd "$(dirname "$0")/../.."
busy="${1:-2}"
part="${2:-all}"
pids=()
stop_load() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop_load EXIT
# The load generator: busy loops, each bounded (30 min) should the trap never run.
for _ in $(seq "$busy"); do
  timeout 1800 sh -c 'while :; do :; done' &
  pids+=("$!")
done
echo "contention: $busy busy processes (${pids[*]}) beside the tests ($part)"
if [ "$part" = native ] || [ "$part" = all ]; then
  cargo test --test serve --no-fail-fast -- --skip soak::
  cargo test --test model --no-fail-fast -- cli_batch:: decode_batch:: tuning::
fi
[ "$part" = browser ] || [ "$part" = all ] || exit 0
# The browser subset: one headless Chromium run per filter (the test runner takes one filter).
export WASM_BINDGEN_TEST_TIMEOUT="${WASM_BINDGEN_TEST_TIMEOUT:-600}"
browser() { wasm-pack test --headless --chrome --mode no-install -- --test "$1" -- "$2"; }
browser browser_gpu recover
browser browser_model abort_mid_decode
browser browser_model concurrent_calls
browser browser_model progress_events
browser browser finished_waits
