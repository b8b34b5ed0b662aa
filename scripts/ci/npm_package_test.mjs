// Driven by scripts/ci/npm_package_test.sh: node scripts/ci/npm_package_test.mjs APP_DIR TARBALL.
// APP_DIR is a scratch npm project with the packed florence2-wasm installed. Checks the installed package
// (name, license, README, types without `any`), then serves a plain ES-module page importing
// "florence2-wasm" through an import map and runs the tiny2 fixture model in headless Chromium's WebGPU,
// after `Florence2.estimate(..., {dtype: "auto"})`, whose resident bytes must equal the load's and which
// may read only the safetensors header of the weights file (the server serves HEAD and Range and logs).
import { createRequire } from "node:module";
import { readFileSync, existsSync, statSync } from "node:fs";
import { createServer } from "node:http";
import { execFileSync } from "node:child_process";
import { join, normalize, extname, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import assert from "node:assert/strict";

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const [app, tarball] = process.argv.slice(2);
const require = createRequire(join(root, "www", "package.json"));
const { chromium } = require("playwright-core");

// ---- the installed package -------------------------------------------------------------------------
const pkgDir = join(app, "node_modules", "florence2-wasm");
const pkg = JSON.parse(readFileSync(join(pkgDir, "package.json"), "utf8"));
assert.equal(pkg.name, "florence2-wasm");
assert.equal(pkg.license, "MIT");
assert.equal(pkg.type, "module");
// Node.js takes node.js (wasm and models from files), everything else index.js.
assert.deepEqual(pkg.exports["."], { types: "./index.d.ts", node: "./node.js", default: "./index.js" });
assert.equal(pkg.engines.node, ">=20");
assert.deepEqual(pkg.exports["./worker"], { types: "./worker.d.ts", default: "./worker.js" });
// index.js and node.js patch Florence2's statics and worker.js serves on import: side effects, all three.
assert.deepEqual(pkg.sideEffects.filter((f) => !f.startsWith("./snippets")),
  ["./index.js", "./node.js", "./worker.js"]);
const entry = pkg.exports["."].default.replace(/^\.\//, "");
for (const f of [entry, pkg.exports["."].node, pkg.types, "florence2_wasm.js", "florence2_wasm.d.ts", "florence2_wasm_bg.wasm",
                 "florence2_wasm_relaxed_bg.wasm", "wasm_build.js", "worker.js", "worker.d.ts", "client.js", "client.d.ts",
                 "support.js", "draw.js", "draw.d.ts", "README.md", "LICENSE"]) {
  assert.ok(f && existsSync(join(pkgDir, f)), `package lacks ${f}`);
}
assert.match(readFileSync(join(pkgDir, "LICENSE"), "utf8"), /^MIT License/);
assert.match(readFileSync(join(pkgDir, "README.md"), "utf8"), /Florence2\.load/);
const dts = readFileSync(join(pkgDir, "florence2_wasm.d.ts"), "utf8");
// Public declarations: no `any` (comments stripped). `InitOutput` is excluded: it lists the raw wasm
// exports (externref slots are typed `any` by wasm-bindgen), which no user code calls.
for (const f of ["florence2_wasm.d.ts", "index.d.ts", "client.d.ts", "worker.d.ts", "draw.d.ts"]) {
  const code = readFileSync(join(pkgDir, f), "utf8").replace(/\/\*[\s\S]*?\*\//g, "").replace(/\/\/.*$/gm, "")
    .replace(/export interface InitOutput \{[\s\S]*?\n\}/, "");
  assert.ok(!/export interface InitOutput/.test(code), `${f}: InitOutput block not stripped`);
  const anys = code.split("\n").filter((l) => /\bany\b/.test(l));
  assert.deepEqual(anys, [], `\`any\` in the public TypeScript declarations (${f})`);
}
for (const t of ["TaskOutput", "LoadOptions", "RunTaskOptions", "ProgressEvent", "ModelSource", "ImageInput",
                 "CacheInfo", "remotePathTemplate",
                 "static load(source: ModelSource, options?: LoadOptions): Promise<Florence2>",
                 "static cacheInfo(source?: ModelSource, options?: LoadOptions): Promise<CacheInfo>",
                 "static clearCache(source?: ModelSource, options?: LoadOptions): Promise<boolean>",
                 "runTask<P extends string>(image: ImageInput | EncodedImage, prompt: P, options?: RunTaskOptions): Promise<TaskOutputFor<P>>",
                 "export type TaskOutputFor<P extends string>"]) {
  assert.ok(dts.includes(t), `declarations lack ${t}`);
}
const idx = readFileSync(join(pkgDir, "index.d.ts"), "utf8");
for (const t of ['export * from "./florence2_wasm.js"', "export default init", "Florence2Worker"]) {
  assert.ok(idx.includes(t), `index.d.ts lacks ${t}`);
}
console.log(`package ok: ${tarball} (${(statSync(tarball).size / 1e6).toFixed(2)} MB packed)`);

// ---- a plain ES-module page ------------------------------------------------------------------------
const Q4_TEXT = "vision=fp16,text=q4";
const page = `<!doctype html><meta charset="utf-8"><title>florence2-wasm package test</title>
<script type="importmap">{"imports": {"florence2-wasm": "/node_modules/florence2-wasm/${entry}"}}</script>
<script type="module">
import init, { Florence2, wasmBuild } from "florence2-wasm";
window.__result = (async () => {
  // isSupported() before anything else: it must not fetch (or instantiate) the wasm.
  const support = await Florence2.isSupported();
  const wasmBeforeInit = performance.getEntriesByType("resource").filter((e) => e.name.endsWith(".wasm")).length;
  const exports = await init();
  // The wasm's own isSupported export runs the same probe (support.js as a wasm-bindgen snippet).
  const wasmSupport = await exports.florence2_isSupported();
  const events = [];
  const est = await Florence2.estimate("/model/tiny2/", { dtype: "auto", cache: false });
  const model = await Florence2.load("/model/tiny2/", { cache: false, onProgress: (e) => events.push(e.status) });
  const memory = model.memory();
  const blob = await (await fetch("/images/scene.png")).blob();
  const out = await model.runTask(blob, "<CAPTION>", { maxNewTokens: 24 });
  const pp = Florence2.postProcess(out.generatedText, "<CAPTION>", 83, 61);
  let promptError = null;
  try { await model.runTask(blob, "<NOPE>"); } catch (e) { promptError = e.name; }
  model.dispose();
  // q4 text weights: the decode GEMV's int8 dots (in the relaxed build, its relaxed integer dot).
  const q4 = await Florence2.load("/model/tiny2/", { cache: false, dtype: "${Q4_TEXT}" });
  const outQ4 = await q4.runTask(blob, "<CAPTION>", { maxNewTokens: 24 });
  q4.dispose();
  const wasmFetched = performance.getEntriesByType("resource").filter((e) => e.name.endsWith(".wasm"))
    .map((e) => new URL(e.name).pathname.split("/").pop());
  return { out, outQ4, events, pp, promptError, est, memory, support, wasmSupport, wasmBeforeInit,
    build: wasmBuild(), wasmFetched };
})().catch((e) => ({ error: String((e && e.stack) || e), name: e && e.name }));
</script>`;
const types = { ".js": "text/javascript", ".wasm": "application/wasm", ".json": "application/json",
                ".png": "image/png", ".safetensors": "application/octet-stream" };
const mounts = [
  ["/node_modules/", join(app, "node_modules")],
  ["/model/tiny2/", join(root, "tests/fixtures/models/tiny2")],
  ["/images/", join(root, "tests/fixtures/images")],
];
/** Requests of the mounted files: {method, path, range, bytes} (body bytes sent). */
const requests = [];
const server = createServer((req, res) => {
  const path = decodeURIComponent(new URL(req.url, "http://x").pathname);
  if (path === "/" || path === "/index.html") {
    res.writeHead(200, { "content-type": "text/html" });
    return res.end(page);
  }
  for (const [prefix, dir] of mounts) {
    if (!path.startsWith(prefix)) continue;
    const file = normalize(join(dir, path.slice(prefix.length)));
    if (!file.startsWith(dir) || !existsSync(file) || !statSync(file).isFile()) break;
    const body = readFileSync(file);
    const type = types[extname(file)] || "application/octet-stream";
    const log = { method: req.method, path, range: req.headers.range || null, bytes: 0 };
    requests.push(log);
    if (req.method === "HEAD") {
      res.writeHead(200, { "content-type": type, "content-length": body.length });
      return res.end();
    }
    const m = /^bytes=(\d+)-(\d+)$/.exec(log.range || "");
    if (m) {
      const [start, end] = [Number(m[1]), Math.min(Number(m[2]), body.length - 1)];
      const part = body.subarray(start, end + 1);
      log.bytes = part.length;
      res.writeHead(206, { "content-type": type, "content-length": part.length,
                           "content-range": `bytes ${start}-${end}/${body.length}` });
      return res.end(part);
    }
    log.bytes = body.length;
    res.writeHead(200, { "content-type": type, "content-length": body.length });
    return res.end(body);
  }
  res.writeHead(404);
  res.end("not found");
});
await new Promise((r) => server.listen(0, "127.0.0.1", r));
const url = `http://127.0.0.1:${server.address().port}/`;

const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--enable-unsafe-webgpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
         "--disable-dev-shm-usage"],
});
try {
  const p = await browser.newPage();
  p.on("console", (m) => console.log("[page]", m.text()));
  await p.goto(url);
  const r = await p.waitForFunction(() => window.__result, null, { timeout: 300_000 })
    .then(() => p.evaluate(() => window.__result));
  assert.ok(!r.error, `page failed: ${r.name}: ${r.error}`);
  const want = JSON.parse(readFileSync(join(root, "tests/fixtures/browser/cli_expected.json"), "utf8"))
    .find((c) => c.model === "tiny2" && c.image === "scene.png" && c.prompt === "<CAPTION>").cli;
  assert.equal(r.out.task, want.task);
  assert.deepEqual(r.out.tokenIds, want.token_ids);
  assert.equal(r.out.generatedText, want.generated_text);
  assert.deepEqual(r.out.result, want.result);
  assert.equal(r.out.text, want.text);
  assert.deepEqual(r.pp, want.result);
  assert.equal(r.promptError, "Florence2PromptError");
  // isSupported(): answered by support.js without the wasm, equal to the wasm's own answer.
  assert.equal(r.wasmBeforeInit, 0, "isSupported() fetched the wasm");
  // Chromium has relaxed SIMD (since 114): the page fetches that build only, and the CPU backend (auto
  // passes over SwiftShader, below) answered the CLI's ids above with its fused GEMM.
  assert.equal(r.build, "relaxed-simd");
  assert.deepEqual(r.wasmFetched, ["florence2_wasm_relaxed_bg.wasm"]);
  // With q4 text weights the page's ids equal the native CLI's (its int8 dots give the same integers).
  const cli = join(root, "target/debug/florence2");
  assert.ok(existsSync(cli), `${cli} missing: cargo build --bin florence2`);
  const cliQ4 = JSON.parse(execFileSync(cli, ["run", "--model", join(root, "tests/fixtures/models/tiny2"), "--image",
    join(root, "tests/fixtures/images/scene.png"), "--task", "<CAPTION>", "--max-new-tokens", "24", "--device", "cpu",
    "--dtype", Q4_TEXT, "--json"], { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] }));
  assert.deepEqual(r.outQ4.tokenIds, cliQ4.token_ids, `${Q4_TEXT}: the page's ids differ from the CLI's`);
  assert.deepEqual(r.support, r.wasmSupport);
  assert.equal(r.support.webgpu, true, JSON.stringify(r.support));
  assert.equal(r.support.adapter.isFallbackAdapter, true, "SwiftShader is a fallback adapter");
  assert.equal(r.support.device, "cpu", "auto passes over a fallback adapter");
  assert.ok(r.support.limits.maxBufferSize > 0 && r.support.features.every((f) => typeof f === "string"));
  assert.equal(r.events[0], "initiate");
  assert.equal(r.events.at(-1), "ready");
  assert.ok(r.events.indexOf("dtype") > 0 && r.events.indexOf("dtype") < r.events.lastIndexOf("done"), r.events.join(" "));
  // Florence2.estimate in the browser: every format fits tiny2, so auto says fp16, and the resident bytes
  // it estimates are what the fp16 load then holds, on the same device; only the safetensors header was
  // sent for it (each load GETs the whole weights file once).
  assert.equal(r.est.dtype, "fp16", JSON.stringify(r.est));
  assert.equal(r.est.fits, true);
  // The four uniform formats and the two mixes `auto` considers (vision=q4,text=q8 and q4,embed=q8).
  assert.equal(r.est.estimates.length, 6);
  assert.equal(r.est.weightsBytes, r.memory.weightsBytes, JSON.stringify([r.est, r.memory]));
  const weights = requests.filter((q) => q.path === "/model/tiny2/model.safetensors");
  const whole = weights.filter((q) => q.method === "GET" && !q.range);
  const ranged = weights.filter((q) => q.range).reduce((s, q) => s + q.bytes, 0);
  const header = 8 + Number(readFileSync(join(root, "tests/fixtures/models/tiny2/model.safetensors")).readBigUInt64LE(0));
  // One whole GET per load (the fp16 one and the q4 one); the estimate reads ranges of the header only.
  assert.equal(whole.length, 2, JSON.stringify(weights));
  assert.ok(ranged <= header + 8, `${ranged} bytes sent for the estimate`);
  console.log(`page ok: estimate ${r.est.dtype} on a ${r.est.device.class} device, ${r.est.weightsBytes} weight bytes ` +
              `(the load holds ${r.memory.weightsBytes}); ${ranged} bytes of the weights file read for it`);
  console.log(`page ok: "${want.task}" answered like the CLI (${r.out.tokenIds.length} tokens, ` +
              `${r.out.timings.total.toFixed(0)} ms)`);
} finally {
  await browser.close();
  server.close();
}
