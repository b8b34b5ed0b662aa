#!/usr/bin/env bash
# Build the npm package `florence2-wasm` into pkg/ (wasm-pack, ES-module target for browsers), with the
# package README (scripts/npm/README.md) and the MIT license text generated from Cargo.toml's metadata.
#   scripts/build.sh          release build
#   scripts/build.sh --dev    unoptimised, faster build (tests)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
profile=--release
if [ "${1:-}" = "--dev" ]; then profile=--dev; fi
wasm-pack build --target web "$profile" --mode no-install --out-dir pkg --out-name florence2_wasm

cp scripts/npm/README.md pkg/README.md
license=$(awk -F'"' '/^license *=/ { print $2; exit }' Cargo.toml)
if [ "$license" != "MIT" ]; then
  echo "build: Cargo.toml's license is '$license'; scripts/build.sh only knows the MIT text" >&2
  exit 1
fi
cat > pkg/LICENSE <<LICENSE
MIT License

Copyright (c) $(date -u +%Y) the florence2-wasm authors

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
LICENSE
# package.json: list README/LICENSE explicitly (npm includes them anyway) and keep the name.
node -e '
const fs = require("fs");
const p = JSON.parse(fs.readFileSync("pkg/package.json", "utf8"));
if (p.name !== "florence2-wasm") { console.error("build: package name is " + p.name); process.exit(1); }
p.files = Array.from(new Set([...(p.files || []), "README.md", "LICENSE"]));
p.license = "MIT";
fs.writeFileSync("pkg/package.json", JSON.stringify(p, null, 2) + "\n");
'
echo "built pkg/ ($(du -h pkg/florence2_wasm_bg.wasm | cut -f1) of wasm)"
