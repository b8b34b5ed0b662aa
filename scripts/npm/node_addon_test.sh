#!/usr/bin/env bash
# Builds the native Node addon (debug unless PROFILE=release) and runs its Node tests against the CLI.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
profile="${PROFILE:-debug}"
"$root/scripts/build/node_addon_build.sh" "$root/target/node-addon" >/dev/null
(cd "$root" && cargo build --bin florence2 $([ "$profile" = release ] && echo --release))
export FLORENCE2_NODE_ADDON="$root/target/node-addon/florence2-wasm-linux-x64-gnu/florence2.linux-x64-gnu.node"
export FLORENCE2_CLI="$root/target/$profile/florence2"
exec node --test "$root/scripts/npm/node_addon_test.mjs"
