#!/usr/bin/env bash
# CI phase "installs": what a user installs works, and what would be published is clean.
#  1. scripts/serve.sh --check decides to rebuild a pkg/ built by `scripts/build.sh --dev` (or of no
#     recorded profile, or none, or older than the sources) and keeps a current release build.
#  2. `cargo install --path . --debug` into a temporary root gives a `florence2` that runs from outside the
#     repository (parse, and run on the tiny2 fixture). It reuses the debug build of `cargo build --bin
#     florence2` (same target dir, profile, features and lock file): no second compile.
#  3. `cargo publish --dry-run` packages the crate (metadata, LICENSE, `include` list), checks it is
#     under the crate registry's 10 MB limit, and verifies it: the library and CLI compile from the
#     packaged sources alone (so the `include` list misses nothing the build reads); the dependencies are
#     reused from the debug build, the crate itself compiles once more (55 s measured on 2 busy cores).
#     --allow-dirty: the phase also runs in a working tree with changes.
# The npm package's `npm publish --dry-run` is checked by scripts/ci/npm_package_test.sh on its tarball.
#   scripts/ci/install_check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$HOME/.cargo/bin:$PATH"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "install_check: $*" >&2; exit 1; }

# 1. serve.sh's build decision on fake pkg/ directories (nothing is built or served).
fake_pkg() { # DIR PROFILE|- : a build of PROFILE (- records none), newer than every source
  mkdir -p "$1"
  touch -d '+1 hour' "$1/florence2_wasm_bg.wasm" "$1/florence2_wasm_relaxed_bg.wasm"
  if [ "$2" != - ]; then echo "$2" > "$1/.build-profile"; fi
}
expect_check() { # DIR WANT(rebuild|fresh) WORDS
  local got
  got=$(scripts/serve.sh --check "$1")
  case "$got" in
    "$2: "*"$3"*) echo "serve.sh --check $(basename "$1"): $got" ;;
    *) fail "serve.sh --check $1 said '$got', expected '$2: ...$3...'" ;;
  esac
}
fake_pkg "$tmp/dev" dev
expect_check "$tmp/dev" rebuild "a dev build"
fake_pkg "$tmp/unrecorded" -
expect_check "$tmp/unrecorded" rebuild "records no build profile"
fake_pkg "$tmp/no-relaxed" release
rm "$tmp/no-relaxed/florence2_wasm_relaxed_bg.wasm"
expect_check "$tmp/no-relaxed" rebuild "no relaxed-SIMD build"
mkdir -p "$tmp/empty"
expect_check "$tmp/empty" rebuild "no build"
fake_pkg "$tmp/release" release
expect_check "$tmp/release" fresh "current release build"
touch -d '-1 hour' "$tmp/release/florence2_wasm_bg.wasm"
expect_check "$tmp/release" rebuild "is newer than the build"
grep -q 'echo "${profile#--}" > pkg/.build-profile' scripts/build.sh ||
  fail "scripts/build.sh does not record its profile in pkg/.build-profile"

# 2. cargo install into a temporary root, reusing the debug build.
start=$SECONDS
CARGO_TARGET_DIR="$PWD/target" cargo install --path . --root "$tmp/root" --debug --locked --offline --quiet
echo "cargo install --debug: $(( SECONDS - start )) s"
bin="$tmp/root/bin/florence2"
repo=$PWD
(
  cd "$tmp"
  "$bin" --version | grep -q "^florence2 " || fail "the installed florence2 --version"
  parsed=$("$bin" parse --task od --image-size 100,100 --text '</s><s>cat<loc_0><loc_0><loc_999><loc_999></s>' --json)
  [ "$(printf '%s' "$parsed" | python3 -c 'import json,sys; print(json.load(sys.stdin)["result"]["<OD>"]["labels"])')" = "['cat']" ] ||
    fail "the installed florence2 parse printed $parsed"
  NODEVICE_SELECT=1 XDG_CACHE_HOME="$tmp/cache" "$bin" run --model "$repo/tests/fixtures/models/tiny2" \
    --image "$repo/tests/fixtures/images/scene.png" --task od --dtype fp32 --num-beams 1 --max-new-tokens 4 \
    --tuning off --json > "$tmp/run.json" 2> "$tmp/run.err" || { cat "$tmp/run.err" >&2; fail "the installed florence2 run"; }
  python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); assert v["task"] == "<OD>", v' "$tmp/run.json" ||
    fail "the installed florence2 run printed $(cat "$tmp/run.json")"
)
echo "cargo install: $bin runs (version, parse, run on tiny2)"

# 3. The crate as the registry would get it.
cmp -s LICENSE src/npm/LICENSE || fail "LICENSE and src/npm/LICENSE differ"
CARGO_TARGET_DIR="$PWD/target" cargo publish --dry-run --allow-dirty --quiet 2> "$tmp/publish.err" ||
  { cat "$tmp/publish.err" >&2; fail "cargo publish --dry-run failed"; }
# Expected warnings: the dry run's own, and the test and bench targets whose files `include` leaves out.
if grep -i "^warning" "$tmp/publish.err" | grep -v "aborting upload due to dry run" |
  grep -Ev "ignoring (test|benchmark) \`[a-z0-9_]+\` as \`(tests|scripts/bench)/[^ ]+\` is not included in the published package"; then
  fail "cargo publish --dry-run warned (above)"
fi
crate=$(find target/package -name 'florence2-wasm-*.crate' | head -1)
[ -n "$crate" ] || fail "cargo publish --dry-run left no .crate under target/package"
bytes=$(stat -c %s "$crate")
tar -tzf "$crate" > "$tmp/crate.list"
files=$(grep -vc '/$' "$tmp/crate.list")
echo "cargo publish --dry-run: clean; $crate: $bytes bytes, $files files"
[ "$bytes" -lt $(( 10 * 1000 * 1000 )) ] || fail "the crate is $bytes bytes, over the registry's 10 MB"
grep -q '/LICENSE$' "$tmp/crate.list" || fail "the crate lacks LICENSE"
