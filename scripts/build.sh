#!/usr/bin/env bash
# Build the npm package `florence2-wasm` into pkg/ (wasm-pack, ES-module target for browsers) plus the
# package's own files from src/npm/ (entries for browsers and Node.js, worker module, README, LICENSE)
# and its package.json.
#   scripts/build.sh          release build
#   scripts/build.sh --dev    unoptimised, faster build (tests)
# The profile is recorded in pkg/.build-profile (release or dev; not a package file), written last, so a
# failed build leaves none: scripts/serve.sh rebuilds unless it says release.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
profile=--release
if [ "${1:-}" = "--dev" ]; then profile=--dev; fi
rm -f pkg/.build-profile
wasm-pack build --target web "$profile" --mode no-install --out-dir pkg --out-name florence2_wasm

# The relaxed-SIMD build, pkg/florence2_wasm_relaxed_bg.wasm (src/npm/wasm_build.js picks it where the
# engine validates relaxed SIMD; the CPU backend's GEMM then fuses its multiply-adds): the same crate built
# with +relaxed-simd, in its own target dir so neither build invalidates the other's artifacts. The package
# ships one glue for both, so the build fails if this build's code differs (its comments name closure
# shims by their index in the wasm's function table, which differs between the builds; the code does not).
relaxed=target/wasm-relaxed
CARGO_TARGET_DIR="$relaxed" RUSTFLAGS="-C target-feature=+simd128,+relaxed-simd" \
  wasm-pack build --target web "$profile" --mode no-install --out-dir "$PWD/$relaxed/pkg" --out-name florence2_wasm
glue_code() { grep -v '^[[:space:]]*//' "$1"; }
if ! cmp -s <(glue_code "$relaxed/pkg/florence2_wasm.js") <(glue_code pkg/florence2_wasm.js); then
  echo "build: the relaxed-SIMD build's glue ($relaxed/pkg/florence2_wasm.js) differs from the SIMD128 build's" >&2
  exit 1
fi
cp "$relaxed/pkg/florence2_wasm_bg.wasm" pkg/florence2_wasm_relaxed_bg.wasm

# wasm-bindgen's declarations name what only some libs declare: init()'s input and output use web-only
# names (RequestInfo, BufferSource, WebAssembly.*) that a Node.js project without the DOM lib lacks, and
# each class has a `[Symbol.dispose]` member, which needs lib esnext.disposable (or @types/node). They
# become api.d.ts's conditional types, which are exactly those types where the program's libs declare
# them (Request | string for RequestInfo), and a `DisposableMember` interface merged into each class. The
# package test's `types` part type-checks a Node.js and a browser project against them.
node -e '
const fs = require("fs");
const f = "pkg/florence2_wasm.d.ts";
const src = fs.readFileSync(f, "utf8");
let n = 0;
let generic = 0;
let cls = null;
const disposable = [];
const out = src.split("\n").map((line) => {
  if (/^\s*(\*|\/\*\*|\/\/)/.test(line)) return line;
  const c = /^export class (\w+) /.exec(line);
  if (c) cls = c[1];
  if (/^\s*\[Symbol\.dispose\]\(\): void;$/.test(line)) {
    disposable.push(cls);
    return null;
  }
  // runTask is generic in its prompt, so a literal prompt types the output (TaskOutputFor, api.d.ts);
  // wasm-bindgen cannot declare a generic method.
  if (/^\s*runTask\(.*prompt: string.*\): Promise<TaskOutput>;$/.test(line)) {
    generic++;
    return line.replace("runTask(", "runTask<P extends string>(").replace("prompt: string", "prompt: P")
      .replace("Promise<TaskOutput>", "Promise<TaskOutputFor<P>>");
  }
  const fixed = line
    .replace(/\bRequestInfo\b/g, "GlobalType<\"Request\"> | string")
    .replace(/\bBufferSource\b/g, "WebAssemblySource")
    .replace(/\bWebAssembly\.(\w+)\b/g, "WebAssemblyType<\"$1\">");
  if (fixed !== line) n++;
  return fixed;
}).filter((line) => line !== null).join("\n");
if (n < 3 || generic !== 1 || !disposable.includes("Florence2") || !/export type WebAssemblySource\b/.test(out)) {
  console.error("build: " + f + " has not the init types and runTask this script rewrites (" + n + " lines, " +
    generic + " runTask)");
  process.exit(1);
}
const merged = disposable.map((c) => `export interface ${c} extends DisposableMember {}\n`).join("");
fs.writeFileSync(f, out + merged);
'

# The package's own files (src/npm/): the entry that makes init() optional, the Node.js entry (the
# "node" export condition: wasm and models from files), the worker module and its client, their types,
# the WebGPU probe (support.js: also a wasm-bindgen snippet of the wasm), README and LICENSE.
for f in README.md LICENSE index.js node.js node_addon.js index.d.ts client.js client.d.ts worker.js \
  worker.d.ts support.js wasm_build.js draw.js draw.d.ts; do
  cp "src/npm/$f" "pkg/$f"
done
license=$(awk -F'"' '/^license *=/ { print $2; exit }' Cargo.toml)
if [ "$license" != "MIT" ] || ! head -1 pkg/LICENSE | grep -qx "MIT License"; then
  echo "build: Cargo.toml's license is '$license'; src/npm/LICENSE must hold that license's text" >&2
  exit 1
fi
# package.json: ES module, an exports map (types + default per entry; Node.js takes node.js), side effects
# declared (index.js adds init-on-first-use to Florence2's statics, node.js makes them read files,
# worker.js serves requests when imported in a worker). `engines`: the Node.js versions node.js needs.
# `optionalDependencies`: the native Node addon's platform packages (src/npm/node_addon_targets.json,
# the napi-rs convention), at the package's own version: npm installs the one whose os/cpu/libc fit, and
# node.js falls back to the wasm when none does.
node -e '
const fs = require("fs");
const p = JSON.parse(fs.readFileSync("pkg/package.json", "utf8"));
const targets = JSON.parse(fs.readFileSync("src/npm/node_addon_targets.json", "utf8")).targets;
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
    "./florence2_wasm_relaxed_bg.wasm": "./florence2_wasm_relaxed_bg.wasm",
    "./package.json": "./package.json",
  },
  engines: { node: ">=20" },
  optionalDependencies: Object.fromEntries(targets.map((t) => [p.name + "-" + t.triple, p.version])),
  files: [
    "index.js", "node.js", "node_addon.js", "index.d.ts", "client.js", "client.d.ts", "worker.js", "worker.d.ts",
    "support.js", "wasm_build.js", "draw.js", "draw.d.ts",
    "florence2_wasm.js", "florence2_wasm.d.ts", "florence2_wasm_bg.wasm", "florence2_wasm_bg.wasm.d.ts",
    "florence2_wasm_relaxed_bg.wasm",
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
echo "${profile#--}" > pkg/.build-profile
echo "built pkg/ (${profile#--}; wasm: $(du -h pkg/florence2_wasm_bg.wasm | cut -f1) SIMD128," \
  "$(du -h pkg/florence2_wasm_relaxed_bg.wasm | cut -f1) relaxed SIMD)"
