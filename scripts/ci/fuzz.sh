#!/usr/bin/env bash
# Coverage-guided fuzzing of every parser that takes untrusted input (scripts/fuzz/README.md).
#
#   scripts/ci/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 60 s each, every target)
#
# Targets: header stream config index prompt postprocess image json pickle hub. libFuzzer (libfuzzer-sys) on the
# STABLE toolchain: coverage comes from rustc's stable `-C passes=sancov-module` + `-C llvm-args` flags,
# added by scripts/fuzz/rustc-wrapper.sh to our crates only. Seeds: scripts/fuzz/corpus/TARGET (committed);
# what the fuzzer adds goes to target/fuzz/corpus/TARGET; crashes to target/fuzz/artifacts/TARGET/.
# Fails if any target finds a crash, a timeout (10 s per input), or exceeds its memory bound.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$HOME/.cargo/bin:$PATH"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"

SECS="${1:-60}"
shift || true
ALL=(header stream config index prompt postprocess image json pickle hub)
if [ "$#" -gt 0 ]; then TARGETS=("$@"); else TARGETS=("${ALL[@]}"); fi

ROOT="$PWD"
export CARGO_TARGET_DIR="$ROOT/target/fuzz"
# Reuse the dependencies the tests built (same profile): seed once from target/debug.
if [ ! -d "$CARGO_TARGET_DIR/debug" ] && [ -d "$ROOT/target/debug/deps" ]; then
  mkdir -p "$CARGO_TARGET_DIR"
  cp -a "$ROOT/target/debug" "$CARGO_TARGET_DIR/debug"
fi
export RUSTC_WRAPPER="$ROOT/scripts/fuzz/rustc-wrapper.sh"
export FLORENCE2_FUZZ_RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table -Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks"

echo "== building fuzz targets"
cargo build --manifest-path scripts/fuzz/Cargo.toml --bins

status=0
summary=""
total=0
for t in "${TARGETS[@]}"; do
  seeds="$ROOT/scripts/fuzz/corpus/$t"
  work="$CARGO_TARGET_DIR/corpus/$t"
  art="$CARGO_TARGET_DIR/artifacts/$t/"
  mkdir -p "$work" "$art"
  log="$CARGO_TARGET_DIR/$t.log"
  echo "== fuzz_$t: ${SECS} s"
  set +e
  "$CARGO_TARGET_DIR/debug/fuzz_$t" "$work" "$seeds" \
    -max_total_time="$SECS" -timeout=10 -rss_limit_mb=4096 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$art" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  execs=${execs:-0}
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || true)
  total=$((total + execs))
  if [ "$rc" -ne 0 ]; then
    status=1
    echo "!! fuzz_$t FAILED (exit $rc); log $log, artifacts in $art"
    grep -E "panicked|ERROR: libFuzzer|allocated for|SUMMARY" "$log" | head -5 || true
    summary+=$(printf '%-12s %10s execs  cov %-6s FAILED\n' "$t" "$execs" "${cov:-?}")$'\n'
  else
    summary+=$(printf '%-12s %10s execs  cov %-6s ok\n' "$t" "$execs" "${cov:-?}")$'\n'
  fi
done
echo "== fuzz summary (${SECS} s per target)"
printf '%s' "$summary"
echo "total executions: $total"
exit "$status"
