#!/usr/bin/env bash
# Build the npm package `florence2-wasm` into pkg/ (wasm-pack, ES-module target for browsers) plus the
# package's own files from scripts/npm/ (entries for browsers and Node.js, worker module, README, LICENSE)
# and its package.json.
#   scripts/build.sh          release build
#   scripts/build.sh --dev    unoptimised, faster build (tests)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
profile=--release
if [ "${1:-}" = "--dev" ]; then profile=--dev; fi
wasm-pack build --target web "$profile" --mode no-install --out-dir pkg --out-name florence2_wasm

# The package's own files (scripts/npm/): the entry that makes init() optional, the Node.js entry (the
# "node" export condition: wasm and models from files), the worker module and its client, their types,
# README and LICENSE.
for f in README.md LICENSE index.js node.js index.d.ts client.js client.d.ts worker.js worker.d.ts; do
  cp "scripts/npm/$f" "pkg/$f"
done
license=$(awk -F'"' '/^license *=/ { print $2; exit }' Cargo.toml)
if [ "$license" != "MIT" ] || ! head -1 pkg/LICENSE | grep -qx "MIT License"; then
  echo "build: Cargo.toml's license is '$license'; scripts/npm/LICENSE must hold that license's text" >&2
  exit 1
fi
# package.json: ES module, an exports map (types + default per entry; Node.js takes node.js), side effects
# declared (index.js adds init-on-first-use to Florence2's statics, node.js makes them read files,
# worker.js serves requests when imported in a worker). `engines`: the Node.js versions node.js needs.
node -e '
const fs = require("fs");
const p = JSON.parse(fs.readFileSync("pkg/package.json", "utf8"));
if (p.name !== "florence2-wasm") { console.error("build: package name is " + p.name); process.exit(1); }
const out = {
  name: p.name,
  version: p.version,
  description: p.description,
  license: "MIT",
  repository: { type: "git", url: "git+" + String(p.repository && p.repository.url || "").replace(/^git\+/, "").replace(/(\.git)?$/, ".git") },
  keywords: p.keywords,
  type: "module",
  main: "./index.js",
  module: "./index.js",
  types: "./index.d.ts",
  exports: {
    ".": { types: "./index.d.ts", node: "./node.js", default: "./index.js" },
    "./worker": { types: "./worker.d.ts", default: "./worker.js" },
    "./raw": { types: "./florence2_wasm.d.ts", default: "./florence2_wasm.js" },
    "./florence2_wasm_bg.wasm": "./florence2_wasm_bg.wasm",
    "./package.json": "./package.json",
  },
  engines: { node: ">=20" },
  files: [
    "index.js", "node.js", "index.d.ts", "client.js", "client.d.ts", "worker.js", "worker.d.ts",
    "florence2_wasm.js", "florence2_wasm.d.ts", "florence2_wasm_bg.wasm", "florence2_wasm_bg.wasm.d.ts",
    "README.md", "LICENSE",
  ],
  sideEffects: ["./index.js", "./node.js", "./worker.js", "./snippets/*"],
};
for (const f of out.files) {
  if (!fs.existsSync("pkg/" + f)) { console.error("build: pkg/ lacks " + f); process.exit(1); }
}
if (fs.existsSync("pkg/snippets")) out.files.push("snippets/");
fs.writeFileSync("pkg/package.json", JSON.stringify(out, null, 2) + "\n");
'
echo "built pkg/ ($(du -h pkg/florence2_wasm_bg.wasm | cut -f1) of wasm)"
