#!/bin/sh
# RUSTC_WRAPPER for scripts/ci/fuzz.sh: adds libFuzzer's coverage instrumentation (stable rustc flags) to our
# own crates only (the library and the fuzz targets). Dependencies build exactly as for the tests, so
# their artifacts are reused and never instrumented.
rustc="$1"
shift
case " $* " in
*" --crate-name florence2_wasm "* | *" --crate-name fuzz_"*)
  # shellcheck disable=SC2086
  exec "$rustc" "$@" $FLORENCE2_FUZZ_RUSTFLAGS
  ;;
esac
exec "$rustc" "$@"
