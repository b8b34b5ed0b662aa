#!/usr/bin/env bash
# Builds the native Node addon for this machine (linux-x64-gnu) and packs its platform package
# `florence2-wasm-linux-x64-gnu` (package.json with os/cpu/libc, florence2.linux-x64-gnu.node, README.md,
# LICENSE) into OUT_DIR. The main package `florence2-wasm` names it in its optionalDependencies at the same
# version (scripts/build.sh); its node.js loads it at run time.
# Usage: scripts/build/node_addon_build.sh [OUT_DIR] (default target/node-addon); PROFILE=release for an
# optimized build (default: debug, which CI's other phases already compile).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-$root/target/node-addon}"
profile="${PROFILE:-debug}"
triple=linux-x64-gnu
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) ;;
  *) echo "node_addon_build: this script builds linux-x64-gnu only (see node_addon_targets.json)" >&2; exit 2 ;;
esac
flags=(--lib --features node)
[ "$profile" = release ] && flags+=(--release)
(cd "$root" && cargo build "${flags[@]}")
pkgdir="$out/florence2-wasm-$triple"
rm -rf "$pkgdir" && mkdir -p "$pkgdir"
cp "$root/target/$profile/libflorence2_wasm.so" "$pkgdir/florence2.$triple.node"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)"
cat > "$pkgdir/package.json" <<JSON
{
  "name": "florence2-wasm-$triple",
  "version": "$version",
  "description": "The native Node.js addon of florence2-wasm for $triple",
  "main": "florence2.$triple.node",
  "files": ["florence2.$triple.node", "README.md", "LICENSE"],
  "os": ["linux"],
  "cpu": ["x64"],
  "libc": ["glibc"],
  "license": "MIT"
}
JSON
cp "$root/src/npm/LICENSE" "$pkgdir/LICENSE"
cat > "$pkgdir/README.md" <<MD
# florence2-wasm-$triple

The native Node.js addon of the \`florence2-wasm\` package for $triple
(the same engine as the \`florence2\` CLI: all cores, SIMD, GPUs through wgpu). Install \`florence2-wasm\`,
not this package: npm adds it as an optional dependency where it fits, and \`Florence2.load\` uses it.
MD
(cd "$out" && npm pack --silent "./florence2-wasm-$triple" >/dev/null)
echo "$out/florence2-wasm-$triple-$version.tgz"
