// The packed package in Node.js: node scripts/npm/node_test.mjs APP_DIR (a scratch npm project with the
// tarball installed; scripts/ci/npm_package_test.sh makes it). `import { Florence2 } from "florence2-wasm"`
// from that project must resolve to the package's Node entry (the "node" export condition) and, on the
// CPU backend (`device: "auto"` without WebGPU), answer exactly as the native CLI
// (target/debug/florence2 run --device cpu --json) for the tiny4 fixture model:
//   - loaded from a directory path, a `file:` URL and an http URL (a loopback server in this script);
//   - `<OD>` and `<OCR>` on scene.png given as a Buffer, a Uint8Array, an ArrayBuffer, decoded
//     `{data, width, height}` RGBA (decoded here), an `EncodedImage`, and scene.jpg as a file path;
//   - `wasmBuild()` names the build this Node runs (SIMD128 or relaxed SIMD), and a child Node with the
//     V8 flag that switches relaxed SIMD the other way answers as the CLI too (also with q4 text
//     weights, whose decode GEMV dots in int8); in Node 20, whose flag gives a draft of relaxed SIMD,
//     the probe keeps both on the SIMD128 build;
//   - `profile: true` times every CPU op (`cpu:NAME`, performance.now()) per phase;
//   - isSupported() reports the CPU backend and no native addon (this app has only the main tarball:
//     `device: "auto"` runs the wasm, `device: "wasm"` asks for it); cacheInfo()/clearCache() work
//     without a Cache API;
//   - hostile input rejects with a named error and leaves the model answering as before: an unknown
//     task, empty/garbage/truncated image bytes, RGBA of the wrong length, a missing model directory,
//     `device: "webgpu"`, an aborted load, a hub id the (local) hub does not have;
//   - `Florence2.estimate` equals `florence2 estimate --device cpu` for every format, over http without
//     the weights being sent (the server's log: HEAD and ranged GETs of the safetensors header only);
//     mocked `adapterLimits` (a phone with a small budget) make `dtype: "auto"` choose q8, then q4, then
//     reject naming the closest (also for buffers over the limit); `load` with `dtype: "auto"` reports its choice in a `dtype` progress
//     event and `memory()`, holds the estimated weight bytes, and a forced q8 answers as the CLI's q8.
// The wall time of one task here and in the CLI is printed (a figure, not an assertion).
import { readFileSync, writeFileSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { createServer } from "node:http";
import { join, dirname, normalize, relative } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { inflateSync } from "node:zlib";
import assert from "node:assert/strict";

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const [app] = process.argv.slice(2);
assert.ok(app, "usage: node scripts/npm/node_test.mjs APP_DIR");
const cliBin = join(root, "target/debug/florence2");
const modelDir = join(root, "tests/fixtures/models/tiny4");
const images = join(root, "tests/fixtures/images");
const MAX_NEW = 20;
const TASKS = ["<OD>", "<OCR>"];

// ---- the native CLI's answers ----------------------------------------------------------------------
/** `florence2 run --json` for every task of `TASKS` on `image`: {task: {tokenIds, result}}, wall ms. */
function cli(image) {
  const args = ["run", "--model", modelDir, "--image", join(images, image), "--json", "--device", "cpu",
    "--max-new-tokens", String(MAX_NEW)];
  for (const t of TASKS) args.push("--task", t);
  const t0 = performance.now();
  const out = JSON.parse(execFileSync(cliBin, args, { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] }));
  const ms = performance.now() - t0;
  const byTask = {};
  for (const o of out) {
    assert.equal(o.device, "cpu");
    byTask[o.task] = { tokenIds: o.token_ids, result: o.result, ms: o.timings_ms };
  }
  return { byTask, ms };
}
const want = { png: cli("scene.png"), jpg: cli("scene.jpg") };

/** `out` answers task `task` exactly as the CLI did on `image`. */
function check(out, image, task, what) {
  const w = want[image].byTask[task];
  assert.equal(out.task, task, what);
  assert.equal(out.memory.device, "cpu", what);
  assert.equal(out.memory.engine, "wasm", what);
  assert.deepEqual(out.tokenIds, w.tokenIds, `${what}: ${task} token ids differ from the CLI's`);
  assert.deepEqual(out.result, w.result, `${what}: ${task} result differs from the CLI's`);
}

// ---- a PNG decoder for the RGBA input (8-bit RGB/RGBA, not interlaced: the fixtures' kind) -----------
function decodePng(buf) {
  assert.equal(buf.toString("latin1", 1, 4), "PNG");
  let off = 8;
  let w = 0, h = 0, type = 0;
  const idat = [];
  while (off < buf.length) {
    const len = buf.readUInt32BE(off);
    const kind = buf.toString("latin1", off + 4, off + 8);
    const data = buf.subarray(off + 8, off + 8 + len);
    if (kind === "IHDR") {
      w = data.readUInt32BE(0);
      h = data.readUInt32BE(4);
      assert.equal(data[8], 8, "8-bit PNG");
      type = data[9];
      assert.ok(type === 2 || type === 6, "RGB or RGBA PNG");
      assert.equal(data[12], 0, "not interlaced");
    } else if (kind === "IDAT") {
      idat.push(data);
    }
    off += 12 + len;
  }
  const bpp = type === 6 ? 4 : 3;
  const raw = inflateSync(Buffer.concat(idat));
  const stride = w * bpp;
  const px = new Uint8Array(stride * h);
  for (let y = 0; y < h; y++) {
    const f = raw[y * (stride + 1)];
    const line = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1));
    for (let x = 0; x < stride; x++) {
      const a = x >= bpp ? px[y * stride + x - bpp] : 0;
      const b = y > 0 ? px[(y - 1) * stride + x] : 0;
      const c = x >= bpp && y > 0 ? px[(y - 1) * stride + x - bpp] : 0;
      const p = a + b - c;
      const pa = Math.abs(p - a), pb = Math.abs(p - b), pc = Math.abs(p - c);
      const paeth = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      const pred = [0, a, b, (a + b) >> 1, paeth][f];
      assert.ok(pred !== undefined, `PNG filter ${f}`);
      px[y * stride + x] = (line[x] + pred) & 255;
    }
  }
  const rgba = new Uint8Array(w * h * 4);
  for (let i = 0; i < w * h; i++) {
    for (let k = 0; k < 3; k++) rgba[i * 4 + k] = px[i * bpp + k];
    rgba[i * 4 + 3] = bpp === 4 ? px[i * 4 + 3] : 255;
  }
  return { data: rgba, width: w, height: h };
}

// ---- a loopback server of the fixtures -------------------------------------------------------------
const served = [];
/** Every request: {method, path, range, bytes} (body bytes sent). */
const requests = [];
const server = createServer((req, res) => {
  const path = decodeURIComponent(new URL(req.url, "http://x").pathname);
  served.push(path);
  const log = { method: req.method, path, range: req.headers.range || null, bytes: 0 };
  requests.push(log);
  const file = normalize(join(root, "tests/fixtures", path));
  if (relative(join(root, "tests/fixtures"), file).startsWith("..")) {
    res.writeHead(403).end();
    return;
  }
  let body;
  try {
    body = readFileSync(file);
  } catch {
    res.writeHead(404, { "content-type": "text/plain" }).end("not found");
    return;
  }
  if (req.method === "HEAD") {
    res.writeHead(200, { "content-type": "application/octet-stream", "content-length": body.length }).end();
    return;
  }
  const m = /^bytes=(\d+)-(\d+)$/.exec(log.range || "");
  if (m) {
    const [start, end] = [Number(m[1]), Math.min(Number(m[2]), body.length - 1)];
    const part = body.subarray(start, end + 1);
    log.bytes = part.length;
    res.writeHead(206, {
      "content-type": "application/octet-stream",
      "content-length": part.length,
      "content-range": `bytes ${start}-${end}/${body.length}`,
    }).end(part);
    return;
  }
  log.bytes = body.length;
  res.writeHead(200, { "content-type": "application/octet-stream", "content-length": body.length }).end(body);
});
await new Promise((r) => server.listen(0, "127.0.0.1", r));
const origin = `http://127.0.0.1:${server.address().port}`;

// ---- the package as an app imports it --------------------------------------------------------------
const entryFile = join(app, "node_entry.mjs");
writeFileSync(entryFile, 'export * from "florence2-wasm";\nexport { default } from "florence2-wasm";\n');
const pkg = await import(pathToFileURL(entryFile).href);
const { Florence2 } = pkg;
assert.equal(typeof pkg.default, "function", "default export init()");

async function rejects(p, name, what, match) {
  let err = null;
  try {
    await p;
  } catch (e) {
    err = e;
  }
  assert.ok(err, `${what}: did not reject`);
  assert.equal(err.name, name, `${what}: ${err.name}: ${err.message}`);
  if (match) assert.match(err.message, match, what);
  return err;
}

let failures = 0;
async function step(name, f) {
  try {
    await f();
    console.log(`ok   ${name}`);
  } catch (e) {
    failures++;
    console.log(`FAIL ${name}: ${e.stack || e}`);
  }
}

const pngBytes = readFileSync(join(images, "scene.png"));
const jpgPath = join(images, "scene.jpg");
const runOpts = { maxNewTokens: MAX_NEW };
let byPath = null;

await step("isSupported(): the CPU backend, no WebGPU", async () => {
  const s = await Florence2.isSupported();
  assert.equal(s.supported, true, JSON.stringify(s));
  assert.equal(s.cpu, true);
  assert.equal(s.webgpu, false);
  assert.equal(s.device, "cpu");
  assert.match(s.reason, /navigator\.gpu/);
  assert.equal(s.addon, false, s.addonReason);
  assert.equal(s.wasm, true);
});

await step("load a directory path (device auto -> CPU), <OD> and <OCR> on Buffer/Uint8Array bytes", async () => {
  const events = [];
  byPath = await Florence2.load(modelDir, { onProgress: (e) => events.push({ ...e }) });
  assert.match(byPath.adapterInfo, /CPU backend/, byPath.adapterInfo);
  const files = new Set(events.filter((e) => e.status === "done").map((e) => e.file));
  for (const f of ["config.json", "tokenizer.json", "model.safetensors"]) assert.ok(files.has(f), `no done for ${f}`);
  assert.equal(events.at(-1).status, "ready");
  assert.ok(events.every((e) => e.cached === false));
  const weights = events.find((e) => e.status === "done" && e.file === "model.safetensors");
  assert.equal(weights.loaded, readFileSync(join(modelDir, "model.safetensors")).length);
  check(await byPath.runTask(pngBytes, "<OD>", runOpts), "png", "<OD>", "Buffer");
  check(await byPath.runTask(new Uint8Array(pngBytes), "<OCR>", runOpts), "png", "<OCR>", "Uint8Array");
  const ab = pngBytes.buffer.slice(pngBytes.byteOffset, pngBytes.byteOffset + pngBytes.length);
  check(await byPath.runTask(ab, "<OD>", runOpts), "png", "<OD>", "ArrayBuffer");
});

await step("{data, width, height} RGBA, an EncodedImage, a JPEG by file path", async () => {
  const rgba = decodePng(pngBytes);
  check(await byPath.runTask(rgba, "<OCR>", runOpts), "png", "<OCR>", "RGBA");
  const clamped = { ...rgba, data: new Uint8ClampedArray(rgba.data) };
  check(await byPath.runTask(clamped, "<OD>", runOpts), "png", "<OD>", "RGBA (clamped)");
  const enc = await byPath.encodeImage(pngBytes);
  assert.deepEqual([enc.width, enc.height], [rgba.width, rgba.height]);
  for (const t of TASKS) check(await byPath.runTask(enc, t, runOpts), "png", t, "EncodedImage");
  enc.dispose();
  for (const t of TASKS) check(await byPath.runTask(jpgPath, t, runOpts), "jpg", t, "JPEG path");
  check(await byPath.runTask(pathToFileURL(jpgPath), "<OD>", runOpts), "jpg", "<OD>", "JPEG file: URL");
});

const Q4_TEXT = "vision=fp16,text=q4";
await step("wasm builds: this Node's, and a child Node with relaxed SIMD switched the other way, answer as the CLI", async () => {
  // Node 20's V8 has a draft of relaxed SIMD behind a flag, whose dot product differs from the
  // standard's: the probe refuses it, so both Nodes run the SIMD128 build there. Later Node.js versions
  // run the relaxed-SIMD build by default, and the SIMD128 one with the flag off.
  const here = pkg.wasmBuild();
  assert.ok(here === "simd128" || here === "relaxed-simd", here);
  const flag = here === "simd128" ? "--experimental-wasm-relaxed-simd" : "--no-experimental-wasm-relaxed-simd";
  const major = Number(process.versions.node.split(".")[0]);
  const want = here === "relaxed-simd" || major === 20 ? "simd128" : "relaxed-simd";
  if (major === 20) assert.equal(here, "simd128");
  const child = `
    const pkg = await import(${JSON.stringify(pathToFileURL(entryFile).href)});
    const m = await pkg.Florence2.load(${JSON.stringify(modelDir)});
    const png = (await import("node:fs")).readFileSync(${JSON.stringify(join(images, "scene.png"))});
    const out = { build: pkg.wasmBuild(), tasks: [] };
    for (const t of ${JSON.stringify(TASKS)}) out.tasks.push(await m.runTask(png, t, ${JSON.stringify(runOpts)}));
    // q4 text weights: the decode GEMV's int8 dots (the relaxed build's own q4 kernel).
    const q4 = await pkg.Florence2.load(${JSON.stringify(modelDir)}, { dtype: ${JSON.stringify(Q4_TEXT)} });
    out.q4 = (await q4.runTask(png, "<OD>", ${JSON.stringify(runOpts)})).tokenIds;
    console.log(JSON.stringify(out));`;
  const got = JSON.parse(execFileSync(process.execPath, [flag, "--input-type=module", "-e", child],
    { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] }));
  assert.equal(got.build, want, `a child Node with ${flag}`);
  for (const out of got.tasks) check(out, "png", out.task, `the ${want} build (${flag})`);
  const cliQ4 = JSON.parse(execFileSync(cliBin, ["run", "--model", modelDir, "--image", join(images, "scene.png"),
    "--json", "--device", "cpu", "--max-new-tokens", String(MAX_NEW), "--task", "<OD>", "--dtype", Q4_TEXT],
  { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] }));
  assert.deepEqual(got.q4, cliQ4.token_ids, `the ${want} build with ${Q4_TEXT}: ids differ from the CLI's`);
});

await step("profile: true on the CPU backend: every op's wall time, by phase", async () => {
  const out = await byPath.runTask(pngBytes, "<OD>", { ...runOpts, profile: true });
  check(out, "png", "<OD>", "profiled");
  const p = out.profile;
  assert.equal(p.available, true, p.reason);
  assert.ok(p.entries.length > 0 && p.entries.every((e) => e.op.startsWith("cpu:") && e.ms >= 0),
    JSON.stringify(p.entries.slice(0, 3)));
  assert.deepEqual(p.phases.map((q) => q.phase), ["vision", "encoder", "decode"]);
  const sum = p.entries.reduce((a, e) => a + e.ms, 0);
  assert.ok(Math.abs(sum - p.totalMs) <= 1e-6 * Math.max(1, sum), `${sum} vs ${p.totalMs}`);
});

await step("load a file:// URL (device wasm)", async () => {
  const m = await Florence2.load(pathToFileURL(modelDir).href, { device: "wasm" });
  try {
    for (const t of TASKS) check(await m.runTask(pngBytes, t, runOpts), "png", t, "file: URL model");
  } finally {
    m.dispose();
  }
});

await step("load an http URL; the Node fetch reaches the caller's fetch option", async () => {
  const seen = [];
  const fetch = (url, init) => {
    seen.push(url);
    return globalThis.fetch(url, init);
  };
  served.length = 0;
  const m = await Florence2.load(`${origin}/models/tiny4/`, { fetch });
  try {
    assert.ok(served.includes("/models/tiny4/model.safetensors"), served.join(" "));
    assert.deepEqual(seen.map((u) => new URL(u).pathname), served);
    const t0 = performance.now();
    const out = await m.runTask(readFileSync(jpgPath), "<OCR>", runOpts);
    const ms = performance.now() - t0;
    check(out, "jpg", "<OCR>", "http model");
    check(await m.runTask(`${origin}/images/scene.png`, "<OD>", runOpts), "png", "<OD>", "http image URL");
    console.log(`     <OCR> on scene.jpg (tiny4, ${out.tokenIds.length} ids): node ${ms.toFixed(0)} ms ` +
      `(runTask: ${JSON.stringify(out.timings)}); CLI --device cpu ${want.jpg.ms.toFixed(0)} ms for the ` +
      `process (both tasks, load included; per task: ${JSON.stringify(want.jpg.byTask["<OCR>"].ms)})`);
  } finally {
    m.dispose();
  }
});

// ---- the memory estimate and dtype: "auto" -----------------------------------------------------------
/** `florence2 estimate --device cpu --json` on tiny4: the native estimates per format. */
const nativeEstimate = JSON.parse(
  execFileSync(cliBin, ["estimate", "--model", modelDir, "--device", "cpu"], { encoding: "utf8" }),
);
const nativeOf = (dtype) => nativeEstimate.estimates.find((e) => e.dtype === dtype);

await step("estimate over http: the native CLI's figures, no weight downloaded", async () => {
  requests.length = 0;
  const events = [];
  const e = await Florence2.estimate(`${origin}/models/tiny4/`, {
    dtype: "auto",
    onProgress: (ev) => events.push(ev.status),
  });
  // On the CPU backend every format fits tiny4: auto takes fp16.
  assert.equal(e.dtype, "fp16", JSON.stringify(e));
  assert.equal(e.fits, true);
  assert.match(e.reason, /^auto chose fp16 for this cpu device/);
  assert.equal(e.device.class, "cpu");
  // The four formats and the two mixes auto considers.
  assert.equal(e.estimates.length, 6);
  for (const x of e.estimates) {
    const n = nativeOf(x.dtype);
    assert.deepEqual(
      [x.weightsBytes, x.peakBytes, x.largestBufferBytes, x.downloadBytes],
      [n.weights_bytes, n.peak_bytes, n.largest_buffer_bytes, n.download_bytes],
      x.dtype,
    );
  }
  const weights = requests.filter((r) => r.path === "/models/tiny4/model.safetensors");
  const size = readFileSync(join(modelDir, "model.safetensors")).length;
  const headerLen = 8 + Number(readFileSync(join(modelDir, "model.safetensors")).readBigUInt64LE(0));
  const sent = weights.reduce((s, r) => s + r.bytes, 0);
  console.log(`     weights file: ${weights.map((r) => `${r.method} ${r.range || ""}`.trim()).join(", ")}; ` +
    `${sent} of ${size} bytes sent (header ${headerLen})`);
  assert.ok(weights.every((r) => r.method === "HEAD" || r.range), JSON.stringify(weights));
  assert.ok(sent <= headerLen + 8, `${sent} bytes of the weights file were sent`);
  assert.ok(!events.includes("tuning") && !events.includes("ready"), events.join(" "));
});

const MIX_TEXT_Q8 = "vision=q4,text=q8";
const MIX_EMBED_Q8 = "vision=q4,encoder=q4,decoder=q4,embed=q8";

await step("estimate with mocked adapter limits: a small budget forces q8, the q4 mixes, then q4; nothing fits names the closest", async () => {
  const fixed = {};
  for (const d of ["fp16", "q8", MIX_TEXT_Q8, MIX_EMBED_Q8, "q4"]) {
    fixed[d] = await Florence2.estimate(modelDir, { dtype: d });
  }
  assert.equal(fixed.q8.weightsBytes, nativeOf("q8").weights_bytes);
  const peak = (d) => fixed[d].peakBytes;
  assert.ok(peak("fp16") > peak("q8") && peak("q8") > peak("q4"), JSON.stringify([peak("fp16"), peak("q8"), peak("q4")]));
  // A phone whose budget is just under a format's peak (tiny4's formats share their largest buffer, the
  // vision arena's: buffers cannot tell them apart here).
  const phone = (budgetBytes, maxBufferSize = 1 << 30) =>
    ({ class: "mobile", budgetBytes, maxBufferSize, maxStorageBufferBindingSize: 1 << 30 });
  const q8 = await Florence2.estimate(modelDir, { dtype: "auto", adapterLimits: phone(peak("fp16") - 1) });
  assert.equal(q8.dtype, "q8", q8.reason);
  assert.equal(q8.device.class, "mobile");
  assert.equal(q8.device.budgetBytes, peak("fp16") - 1);
  assert.match(q8.reason, /not fp16: its peak .* exceeds the mobile budget/);
  assert.ok(peak("q8") > peak(MIX_TEXT_Q8) && peak(MIX_TEXT_Q8) > peak("q4"));
  const mix = await Florence2.estimate(modelDir, { dtype: "auto", adapterLimits: phone(peak("q8") - 1) });
  assert.equal(mix.dtype, MIX_TEXT_Q8, mix.reason);
  // tiny4's embedding rows are not whole 32-weight blocks: f16 in q8 and q4 alike, so the q8-embed mix
  // holds q4's bytes and auto passes over it to q4.
  assert.deepEqual(fixed[MIX_EMBED_Q8].partBytes, fixed.q4.partBytes);
  const q4 = await Florence2.estimate(modelDir, { dtype: "auto", adapterLimits: phone(peak(MIX_TEXT_Q8) - 1) });
  assert.equal(q4.dtype, "q4", q4.reason);
  const over = await rejects(
    Florence2.estimate(modelDir, { dtype: "auto", adapterLimits: phone(peak("q4") - 100) }),
    "Florence2LoadError",
    "nothing fits the budget",
    /q4 came closest \(its peak [0-9.]+ MB is 0\.0 MB over the budget\)/,
  );
  assert.match(over.message, /no weight format fits this mobile device/);
  const small = fixed.q4.largestBufferBytes - 1;
  await rejects(
    Florence2.estimate(modelDir, { dtype: "auto", adapterLimits: phone(1 << 30, small) }),
    "Florence2LoadError",
    "nothing fits the buffers",
    /came closest \(its largest buffer [0-9.]+ MB is 0\.0 MB over the buffer limit\)/,
  );
  await rejects(Florence2.estimate(modelDir, { dtype: "q5" }), "Florence2InputError", "a bad dtype", /auto/);
  await rejects(
    Florence2.estimate(modelDir, { adapterLimits: { class: "tablet" } }),
    "Florence2InputError",
    "a bad class",
  );
});

await step("estimate for shorter requests: maxNewTokens and numBeams shrink the decode phase as natively", async () => {
  const native = JSON.parse(execFileSync(cliBin, ["estimate", "--model", modelDir, "--device", "cpu", "--dtype",
    "fp32", "--max-new-tokens", "8", "--num-beams", "1"], { encoding: "utf8" })).estimates[0];
  const short = await Florence2.estimate(modelDir, { dtype: "fp32", maxNewTokens: 8, numBeams: 1 });
  assert.deepEqual([short.decodeBytes, short.peakBytes], [native.decode_bytes, native.peak_bytes]);
  assert.ok(short.decodeBytes < nativeOf("fp32").decode_bytes);
  await rejects(Florence2.estimate(modelDir, { numBeams: 0 }), "Florence2InputError", "numBeams 0");
});

await step("load with dtype auto: the choice in the progress events and memory(), the estimate's bytes", async () => {
  const events = [];
  const m = await Florence2.load(modelDir, { dtype: "auto", onProgress: (e) => events.push({ ...e }) });
  try {
    const ev = events.find((e) => e.status === "dtype");
    assert.ok(ev, events.map((e) => e.status).join(" "));
    assert.equal(ev.dtype, "fp16");
    assert.match(ev.reason, /^auto chose fp16/);
    const weightsDone = events.findIndex((e) => e.status === "done" && e.file === "model.safetensors");
    assert.ok(events.indexOf(ev) < weightsDone, "the dtype event comes before the weights");
    assert.equal(m.memory().dtype, "fp16");
    assert.equal(m.memory().weightsBytes, nativeOf("fp16").weights_bytes);
  } finally {
    m.dispose();
  }
  const q8Budget = (await Florence2.estimate(modelDir, { dtype: "fp16" })).peakBytes - 1;
  const small = await Florence2.load(modelDir, {
    dtype: "auto",
    adapterLimits: { class: "mobile", budgetBytes: q8Budget },
  });
  try {
    assert.equal(small.memory().dtype, "q8");
    assert.equal(small.memory().weightsBytes, nativeOf("q8").weights_bytes);
    // The q8 answer equals the native CLI's with --dtype q8.
    const cliQ8 = JSON.parse(execFileSync(cliBin, ["run", "--model", modelDir, "--image", join(images, "scene.png"),
      "--json", "--device", "cpu", "--max-new-tokens", String(MAX_NEW), "--task", "<OD>", "--dtype", "q8"],
    { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] }));
    const out = await small.runTask(pngBytes, "<OD>", runOpts);
    assert.deepEqual(out.tokenIds, cliQ8.token_ids);
  } finally {
    small.dispose();
  }
});

await step("dtype per part: an object or its text form, the native CLI's estimate and answer", async () => {
  const native = JSON.parse(execFileSync(cliBin, ["estimate", "--model", modelDir, "--device", "cpu", "--dtype",
    "vision=fp16,text=q4"], { encoding: "utf8" })).estimates[0];
  const e = await Florence2.estimate(modelDir, { dtype: { vision: "fp16", text: "q4" } });
  assert.equal(e.dtype, "vision=fp16,text=q4");
  assert.equal(e.dtype, native.dtype);
  assert.deepEqual([e.weightsBytes, e.peakBytes], [native.weights_bytes, native.peak_bytes]);
  assert.deepEqual(e.partBytes, native.part_bytes);
  const sum = Object.values(e.partBytes).reduce((a, b) => a + b, 0);
  assert.equal(sum, e.weightsBytes);
  const text = await Florence2.estimate(modelDir, { dtype: "text=q4,vision=fp16" });
  assert.equal(text.weightsBytes, e.weightsBytes);
  const m = await Florence2.load(modelDir, { dtype: { vision: "fp16", text: "q4" } });
  try {
    assert.equal(m.memory().dtype, "vision=fp16,text=q4");
    assert.equal(m.memory().weightsBytes, e.weightsBytes);
    const cli = JSON.parse(execFileSync(cliBin, ["run", "--model", modelDir, "--image", join(images, "scene.png"),
      "--json", "--device", "cpu", "--max-new-tokens", String(MAX_NEW), "--task", "<OD>", "--dtype",
      "vision=fp16,text=q4"], { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] }));
    const out = await m.runTask(pngBytes, "<OD>", runOpts);
    assert.deepEqual(out.tokenIds, cli.token_ids);
  } finally {
    m.dispose();
  }
  await rejects(Florence2.estimate(modelDir, { dtype: { visoin: "fp16" } }), "Florence2InputError", "a bad part",
    /unknown model part 'visoin'.*vision, projector, encoder, decoder, embed or text/);
  await rejects(Florence2.estimate(modelDir, { dtype: { vision: "q5" } }), "Florence2InputError", "a bad format",
    /fp32, fp16, q8 or q4/);
  await rejects(Florence2.estimate(modelDir, { dtype: { vision: 16 } }), "Florence2InputError", "a number",
    /dtype\.vision must be a format string/);
  await rejects(Florence2.load(modelDir, { dtype: ["fp16"] }), "Florence2InputError", "an array");
});

await step("no Cache API: cacheInfo() and clearCache() answer without an error", async () => {
  // Node 20 has no navigator.storage: storage is null (Node >= 21 has a navigator without a
  // StorageManager, so the same).
  const empty = { files: [], bytes: 0, absent: [], storage: null, failures: [] };
  assert.deepEqual(await Florence2.cacheInfo(), empty);
  assert.deepEqual(await Florence2.cacheInfo(modelDir), empty);
  assert.equal(await Florence2.clearCache(), false);
});

await step("hostile input: named errors, the model answers as before", async () => {
  const run = (image, prompt = "<OD>", opts = runOpts) => byPath.runTask(image, prompt, opts);
  const jpg = readFileSync(jpgPath);
  await rejects(run(pngBytes, "<NOT_A_TASK>"), "Florence2PromptError", "unknown task");
  await rejects(run(pngBytes, "<OD>", { maxNewTokens: -1 }), "Florence2InputError", "negative maxNewTokens");
  await rejects(run(new Uint8Array(0)), "Florence2ImageError", "empty bytes");
  await rejects(run(Buffer.from("not an image at all")), "Florence2ImageError", "garbage");
  await rejects(run(pngBytes.subarray(0, 200)), "Florence2ImageError", "truncated PNG");
  await rejects(run(jpg.subarray(0, jpg.length / 2)), "Florence2ImageError", "truncated JPEG");
  await rejects(run({ data: new Uint8Array(10), width: 83, height: 61 }), "Florence2ImageError", "short RGBA",
    /needs/);
  await rejects(run({ data: [1, 2, 3, 4], width: 1, height: 1 }), "Florence2ImageError", "RGBA as an Array");
  await rejects(run(join(images, "no-such.png")), "Florence2ImageError", "missing image file", /no-such\.png/);
  check(await run(pngBytes), "png", "<OD>", "after hostile input");
});

await step("hostile load: named errors", async () => {
  await rejects(Florence2.load(join(root, "no-such-model-dir")), "Florence2LoadError", "missing directory",
    /config\.json/);
  await rejects(Florence2.load(modelDir, { device: "webgpu" }), "WebGPUUnavailableError", "device webgpu");
  await rejects(Florence2.load(modelDir, { device: "tpu" }), "Florence2InputError", "unknown device");
  await rejects(Florence2.load(modelDir, { signal: AbortSignal.abort() }), "AbortError", "aborted load");
  // A string that is neither a path here nor a URL stays a hub id (here: a hub without that model).
  await rejects(Florence2.load("no-such-org/no-such-model", { remoteHost: `${origin}/hub/` }),
    "Florence2LoadError", "unknown hub id", /no-such-org\/no-such-model/);
});

byPath?.dispose();
server.close();
if (failures) {
  console.error(`node test: ${failures} step(s) failed`);
  process.exit(1);
}
console.log("node test: ok");
