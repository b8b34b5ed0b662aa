// Loading as servers and networks really behave, on the packed package: node scripts/npm/loading_test.mjs
// APP_DIR (a scratch npm project with the tarball installed; scripts/ci/npm_package_test.sh makes it).
//
// scripts/serve.py serves a plain ES-module page (import map -> the installed package), the tiny2 fixture
// model, a hub-shaped tree (`/hub/ORG/NAME/resolve/REV/FILE`) and the test images, in single-page-app
// fallback mode (every missing path answers 200 + index.html). Headless Chromium (WebGPU on SwiftShader,
// playwright-core from www/package.json) then checks:
//   - a load through the SPA fallback (the probed model.safetensors.index.json comes back as HTML) answers
//     like the native CLI (tests/fixtures/browser/cli_expected.json), and the cache lists the files
//     (bytes = the files' sizes) and the probed index as absent;
//   - the same with the server STOPPED: a second load comes entirely from the cache (every progress event
//     `cached: true`), for a model with and one without generation_config.json;
//   - a short (corrupted) cached model.safetensors is detected by its size and fetched again;
//   - a required file that comes back as HTML fails with a load error saying so, by Content-Type and (with
//     `--spa-fallback octet`) by content; a probed file sniffed as HTML by content counts as absent;
//   - hub model ids: "test-org/tiny2" via remoteHost (default revision main, a given revision, a custom
//     remotePathTemplate), and a hub page URL of the mirror;
//   - revalidation of cached files of branch revisions (HEAD, Last-Modified here): a changed file is
//     fetched again, the others stay cached; `revalidate: false`, commit revisions and a stopped server
//     use the cached copies;
//   - the package's worker (florence2-wasm/worker + Florence2Worker): isSupported without a model (equal to
//     the page's), load progress, encoded images (answers equal the CLI's, freed bytes), streamed tokens,
//     memory, profile, abort, reload (encodings released), dispose; a `fetch` option refused by name;
//   - clearCache() for one model and for all; cacheInfo() afterwards.
//   - cache writes that fail (Cache.prototype.put rejecting with QuotaExceededError) with `persist: true`:
//     the answer is the CLI's, one `cache_error` progress event per file, cacheInfo() lists the failures
//     and reports the origin's storage usage, quota and persistence.
// Cold- and cached-load wall times of the fixture are printed (figures, not assertions).
import { createRequire } from "node:module";
import { readFileSync, statSync, mkdirSync, copyFileSync, writeFileSync, readdirSync, utimesSync } from "node:fs";
import { spawn } from "node:child_process";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createServer } from "node:net";
import assert from "node:assert/strict";

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const [app] = process.argv.slice(2);
const require = createRequire(join(root, "www", "package.json"));
const { chromium } = require("playwright-core");

const tiny2 = join(root, "tests/fixtures/models/tiny2");
const expected = JSON.parse(readFileSync(join(root, "tests/fixtures/browser/cli_expected.json"), "utf8"));
const want = (prompt, beams) => expected.find((c) => c.model === "tiny2" && c.image === "scene.png" &&
  c.prompt === prompt && (c.num_beams ?? null) === beams).cli;

// A hub-shaped tree: models/tiny2 (all files) and models/nogen (no generation_config.json, like the
// demo's default model).
const hub = join(app, "hub");
for (const [name, skip] of [["tiny2", []], ["nogen", ["generation_config.json"]], ["tuned", []]]) {
  mkdirSync(join(hub, name), { recursive: true });
  for (const f of readdirSync(tiny2)) if (!skip.includes(f)) copyFileSync(join(tiny2, f), join(hub, name, f));
}
// "tuned" declares its own task in processor_config.json, as a fine-tune's processor would. Its text is
// <CAPTION>'s encoder text, so the generation must equal the CLI's <CAPTION> while the answer is keyed by
// the new marker and post-processed as pure text.
const procCfg = JSON.parse(readFileSync(join(tiny2, "processor_config.json"), "utf8"));
procCfg.task_prompts_without_inputs = { "<MY_CAPTION>": "What does the image describe?" };
writeFileSync(join(hub, "tuned/processor_config.json"), JSON.stringify(procCfg));
const entry = JSON.parse(readFileSync(join(app, "node_modules/florence2-wasm/package.json"), "utf8"))
  .exports["."].default.replace(/^\.\//, "");
writeFileSync(join(app, "index.html"), `<!doctype html><meta charset="utf-8"><title>loading test</title>
<script type="importmap">{"imports": {"florence2-wasm": "/app/node_modules/florence2-wasm/${entry}"}}</script>
<script type="module">
import { Florence2, Florence2Worker } from "florence2-wasm";
window.F = Florence2;
window.sceneBlob = await (await fetch("/images/scene.png")).blob();
window.run = async (source, options = {}, prompt = "<CAPTION>", runOptions = { maxNewTokens: 24 }) => {
  const events = [];
  const t0 = performance.now();
  const model = await Florence2.load(source, { ...options, onProgress: (e) => events.push({ ...e }) });
  const loadMs = performance.now() - t0;
  try {
    const out = await model.runTask(window.sceneBlob, prompt, runOptions);
    return { out, events, loadMs };
  } finally {
    model.dispose();
  }
};
// One model, many image inputs: each answer (greedy <CAPTION>) keyed by input name.
window.images = async () => {
  const model = await Florence2.load("/model/", { cache: false });
  const blob = async (u) => (await fetch(u)).blob();
  const run = async (img) => {
    try {
      const o = await model.runTask(img, "<CAPTION>", { maxNewTokens: 24 });
      return { tokenIds: o.tokenIds, result: o.result };
    } catch (e) {
      return { error: e.name + ": " + e.message };
    }
  };
  const out = {};
  const f = "/images/formats/";
  for (const name of ["scene.webp", "scene.bmp", "scene.gif", "scene.gif.png", "scene.avif", "scene.avif.png",
                      "scene_exif6.jpg", "scene_exif6.png", "scene.jpg.png"]) {
    out[name] = await run(await blob(f + name));
  }
  out["scene.jpg"] = await run(await blob("/images/scene.jpg"));
  out["url string"] = await run("/images/scene.png");
  out["URL object"] = await run(new URL("/images/scene.png", location.href));
  out["url of an HTML page"] = await run("/images/no-such-image.png");
  const bitmap = await createImageBitmap(await blob("/images/scene.png"));
  if (typeof VideoFrame === "function") {
    const vf = new VideoFrame(bitmap, { timestamp: 0 });
    out["VideoFrame"] = await run(vf);
    vf.close();
  } else {
    out["VideoFrame"] = { error: "no VideoFrame" };
  }
  // A <video> showing a canvas stream of the scene: its current frame, compared with the same frame drawn
  // onto a canvas by the page.
  const canvas = document.createElement("canvas");
  canvas.width = bitmap.width;
  canvas.height = bitmap.height;
  canvas.getContext("2d").drawImage(bitmap, 0, 0);
  const video = document.createElement("video");
  video.muted = true;
  out["video before a frame"] = await run(video);
  video.srcObject = canvas.captureStream(0);
  await video.play();
  // Waits for the first frame's event (HAVE_CURRENT_DATA), not for a fixed time: a loaded machine
  // decodes the stream late. 120 s is only a last guard.
  await new Promise((resolve, reject) => {
    const guard = setTimeout(() => reject(new Error("the video showed no frame in 120 s")), 120000);
    const done = () => { clearTimeout(guard); resolve(); };
    video.addEventListener("loadeddata", done, { once: true });
    if (video.readyState >= 2) done();
  });
  const frame = document.createElement("canvas");
  frame.width = video.videoWidth;
  frame.height = video.videoHeight;
  frame.getContext("2d").drawImage(video, 0, 0);
  out["HTMLVideoElement"] = await run(video);
  out["video frame drawn by the page"] = await run(frame);
  out.videoSize = [video.videoWidth, video.videoHeight];
  out["not an image"] = await run({});
  model.dispose();
  return out;
};
window.fail = async (source, options = {}) => {
  try {
    const m = await Florence2.load(source, options);
    m.dispose();
    return { ok: true };
  } catch (e) {
    return { name: e.name, message: e.message };
  }
};
// The whole API through the package's worker (a module worker does not see the page's import map, so
// model-worker.js imports the installed file by path).
window.workerApi = async () => {
  const w = new Worker("/app/model-worker.js", { type: "module" });
  const out = { events: [], tokens: "" };
  out.support = await Florence2Worker.isSupported(w);
  out.estimate = await Florence2Worker.estimate(w, "/model/", { dtype: "auto", cache: false });
  out.pageSupport = await Florence2.isSupported();
  const err = async (p) => { try { await p; return null; } catch (e) { return { name: e.name, message: e.message }; } };
  out.fetchRefused = await err(Florence2Worker.load(w, "/model/", { fetch: (u, i) => fetch(u, i) }));
  const m = await Florence2Worker.load(w, "/model/", { cache: false, onProgress: (e) => out.events.push(e.status) });
  out.adapterInfo = m.adapterInfo;
  out.tuningTable = m.tuningTable;
  const enc = await m.encodeImage(window.sceneBlob);
  out.encoded = { width: enc.width, height: enc.height, id: typeof enc.encodingId };
  out.onEncoding = await m.runTask(enc, "<CAPTION>", { maxNewTokens: 24, numBeams: 1,
    onToken: (t) => { out.tokens += t; } });
  out.onEncodingAgain = await m.runTask(enc, "<CAPTION>", { maxNewTokens: 24, numBeams: 1 });
  out.onBlob = await m.runTask(window.sceneBlob, "<CAPTION>", { maxNewTokens: 24, numBeams: 1 });
  out.memoryWithEncoding = await m.memory();
  await enc.dispose();
  out.memory = await m.memory();
  out.disposedEncoding = await err(m.runTask(enc, "<CAPTION>"));
  out.profiled = await m.runTask(window.sceneBlob, "<CAPTION>", { maxNewTokens: 4, numBeams: 1, profile: true });
  const ctrl = new AbortController();
  const aborted = m.runTask(window.sceneBlob, "<CAPTION>", { maxNewTokens: 200, numBeams: 1, signal: ctrl.signal,
    onToken: () => ctrl.abort() });
  out.abort = await err(aborted);
  const enc2 = await m.encodeImage(window.sceneBlob);
  const reloadEvents = [];
  await m.reload({ onProgress: (e) => reloadEvents.push(e.status) });
  out.reloadEvents = reloadEvents;
  out.afterReload = await m.runTask(window.sceneBlob, "<CAPTION>", { maxNewTokens: 24, numBeams: 1 });
  out.encodingAfterReload = await err(m.runTask(enc2, "<CAPTION>"));
  await m.dispose();
  out.afterDispose = await err(m.memory());
  m.terminate();
  return out;
};
window.ready = true;
</script>`);

async function freePort() {
  return new Promise((resolve) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}
const port = await freePort();
const origin = `http://127.0.0.1:${port}`;
let server = null;

async function startServer(mode) {
  server = spawn("python3", [join(root, "scripts/serve.py"), "--port", String(port), "--spa-fallback", mode,
    "--index", join(app, "index.html"), "--mount", `/app/=${app}`, "--mount", `/model/=${tiny2}`,
    "--mount", `/images/=${join(root, "tests/fixtures/images")}`, "--hub", `/hub/=${hub}`],
  { stdio: ["ignore", "ignore", "pipe"] });
  server.log = "";
  server.stderr.on("data", (d) => { server.log += d; });
  // Polls for the server's first answer; 120 s is only a last guard (a loaded machine starts it late).
  for (let i = 0; i < 1200; i++) {
    try {
      const r = await fetch(`${origin}/images/scene.png`);
      if (r.ok) return;
    } catch (_) { /* not up yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`serve.py did not start:\n${server.log}`);
}
async function stopServer() {
  const s = server;
  server = null;
  const exited = new Promise((r) => s.once("exit", r));
  s.kill("SIGTERM");
  await exited;
}

function sameAsCli(out, cli, what) {
  assert.equal(out.task, cli.task, what);
  assert.deepEqual(out.tokenIds, cli.token_ids, `${what}: token ids`);
  assert.equal(out.generatedText, cli.generated_text, what);
  assert.deepEqual(out.result, cli.result, what);
}

const size = (f) => statSync(join(tiny2, f)).size;
const files = ["config.json", "generation_config.json", "model.safetensors", "preprocessor_config.json",
  "processor_config.json", "tokenizer.json"];

writeFileSync(join(app, "model-worker.js"), 'import "/app/node_modules/florence2-wasm/worker.js";\n');

const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--enable-unsafe-webgpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic", "--disable-dev-shm-usage"],
});
let passed = 0;
const step = (name) => { passed++; console.log(`ok ${passed} - ${name}`); };
try {
  await startServer("html");
  const page = await browser.newPage();
  page.on("console", (m) => { if (m.type() === "error") console.log("[page]", m.text()); });
  await page.goto(`${origin}/app/index.html`);
  await page.waitForFunction(() => window.ready === true, null, { timeout: 120_000 });
  const ev = (fn, ...args) => page.evaluate(fn, ...args);

  // ---- SPA fallback, cold load into the cache
  await ev(() => F.clearCache());
  const cold = await ev(() => run("/model/"));
  sameAsCli(cold.out, want("<CAPTION>", null), "SPA fallback, cold");
  assert.ok(cold.events.every((e) => e.file !== "model.safetensors.index.json"), "the HTML index is absent");
  assert.ok(cold.events.filter((e) => e.status === "done").every((e) => !e.cached), "cold load is not cached");
  // The aggregate events: one after each file event, loaded never falling, ending at every file's bytes.
  const totals = cold.events.filter((e) => e.status === "progress_total");
  const fileEvents = cold.events.filter((e) => ["initiate", "download", "progress", "done"].includes(e.status));
  assert.equal(totals.length, fileEvents.length, "one progress_total after each file event");
  totals.slice(1).forEach((e, i) => assert.ok(e.loaded >= totals[i].loaded, "progress_total.loaded falls"));
  const last = totals.at(-1);
  const doneFiles = cold.events.filter((e) => e.status === "done").map((e) => e.file).sort();
  assert.deepEqual(Object.keys(last.files).sort(), doneFiles);
  const doneBytes = files.map(size).reduce((a, b) => a + b, 0);
  assert.equal(last.loaded, doneBytes);
  assert.equal(last.total, doneBytes);
  assert.equal(last.progress, 100);
  for (const f of files) assert.deepEqual(last.files[f], { loaded: size(f), total: size(f) }, f);
  let info = await ev(() => F.cacheInfo("/model/"));
  assert.deepEqual(info.files.map((f) => f.url), files.map((f) => `${origin}/model/${f}`));
  assert.deepEqual(info.files.map((f) => f.bytes), files.map(size));
  assert.equal(info.bytes, files.map(size).reduce((a, b) => a + b, 0));
  assert.deepEqual(info.absent, [`${origin}/model/model.safetensors.index.json`]);
  step("SPA-fallback server: probed index (200 text/html) is absent, answer equals the CLI, cache holds the 6 files");

  const nogenCold = await ev(() => run("test-org/nogen", { remoteHost: `${location.origin}/hub/` }, "<CAPTION>",
    { maxNewTokens: 24, numBeams: 1 }));
  // Without generation_config.json the package uses config.json's settings (no forced BOS here), so the
  // answer is not the CLI's with generation_config; the cached reload must reproduce it exactly.
  assert.equal(nogenCold.out.task, "<CAPTION>");
  assert.equal(nogenCold.out.tokenIds.length, 25);
  assert.ok(nogenCold.events.some((e) => e.name === `${origin}/hub/test-org/nogen/resolve/main/`));
  info = await ev(() => F.cacheInfo("test-org/nogen", { remoteHost: `${location.origin}/hub/` }));
  assert.equal(info.files.length, 5);
  assert.deepEqual(info.absent.sort(), ["generation_config.json", "model.safetensors.index.json"]
    .map((f) => `${origin}/hub/test-org/nogen/resolve/main/${f}`).sort());
  step("hub id test-org/nogen via remoteHost (default revision main): loads without generation_config.json; absent files remembered");

  // ---- offline: the server is stopped
  await stopServer();
  assert.equal(await fetch(`${origin}/model/config.json`).then(() => "up", () => "down"), "down");
  const offline = await ev(() => run("/model/"));
  sameAsCli(offline.out, want("<CAPTION>", null), "offline");
  const done = offline.events.filter((e) => e.status === "done");
  assert.deepEqual(done.map((e) => e.file).sort(), [...files].sort());
  assert.ok(offline.events.filter((e) => e.file).every((e) => e.cached), "every file from the cache");
  const nogenOffline = await ev(() => run("test-org/nogen", { remoteHost: `${location.origin}/hub/` }, "<CAPTION>",
    { maxNewTokens: 24, numBeams: 1 }));
  // `memory.allocations` counts every tensor buffer since the device opened, the tuner's timing buffers at
  // load included; how much of its budget a load spends (cold vs resumed from the tuning cache) is not
  // fixed, so that count is not compared. Everything else, bytes included, must be identical.
  assert.deepEqual(nogenOffline.out, {
    ...nogenCold.out,
    timings: nogenOffline.out.timings,
    memory: { ...nogenCold.out.memory, allocations: nogenOffline.out.memory.allocations },
  }, "offline, no generation_config");
  const notCached = await ev(() => fail("/elsewhere/"));
  assert.equal(notCached.name, "Florence2LoadError");
  console.log(`# load times (tiny2, 700 kB): cold ${cold.loadMs.toFixed(0)} ms, cached (server stopped) ` +
    `${offline.loadMs.toFixed(0)} ms`);
  step("server stopped: both cached models load from the cache alone and answer like the CLI");

  // ---- a corrupted (short) cache entry is refetched
  await ev(async (o) => {
    const c = await caches.open("florence2-wasm-v1");
    const url = `${o}/model/model.safetensors`;
    const r = await c.match(url);
    const bytes = new Uint8Array(await r.arrayBuffer());
    await c.put(url, new Response(bytes.slice(0, 4096), { headers: r.headers }));
  }, origin);
  await startServer("html");
  const refetched = await ev(() => run("/model/"));
  sameAsCli(refetched.out, want("<CAPTION>", null), "after a corrupted cache entry");
  const st = refetched.events.filter((e) => e.file === "model.safetensors" && e.status === "done");
  assert.equal(st.at(-1).cached, false, "model.safetensors came from the network again");
  assert.equal(st.at(-1).loaded, size("model.safetensors"));
  info = await ev(() => F.cacheInfo("/model/"));
  assert.equal(info.bytes, files.map(size).reduce((a, b) => a + b, 0));
  const again = await ev(() => run("/model/"));
  assert.ok(again.events.filter((e) => e.status === "done").every((e) => e.cached));
  step("a short cached model.safetensors is detected by size, refetched and cached whole again");

  // ---- a required file answered with HTML
  const html = await ev(() => fail("/no-such-model/", { cache: false }));
  assert.equal(html.name, "Florence2LoadError");
  assert.match(html.message, /config\.json/);
  assert.match(html.message, /HTML page \(Content-Type: text\/html\)/);
  step("a required file answered with an HTML page: Florence2LoadError that says so (Content-Type)");

  // ---- hub ids and page URLs
  const rev = await ev(() => run("test-org/tiny2", { remoteHost: `${location.origin}/hub`, revision: "v2.0",
    cache: false }));
  sameAsCli(rev.out, want("<CAPTION>", null), "hub id with revision");
  assert.equal(rev.events[0].name, `${origin}/hub/test-org/tiny2/resolve/v2.0/`);
  assert.match(server.log, /hub test-org\/tiny2 revision v2\.0/);
  const tmpl = await ev(() => fail("test-org/tiny2", { remoteHost: location.origin,
    remotePathTemplate: "/hub/{model}/resolve/{revision}", cache: false }));
  assert.deepEqual(tmpl, { ok: true });
  const page2 = await ev(() => run(`${location.origin}/hub/test-org/tiny2/tree/main`,
    { remoteHost: `${location.origin}/hub/`, cache: false }));
  assert.equal(page2.events[0].name, `${origin}/hub/test-org/tiny2/resolve/main/`);
  sameAsCli(page2.out, want("<CAPTION>", null), "hub page URL");
  const badTemplate = await ev(() => fail("a/b", { remotePathTemplate: "{revision}/" }));
  assert.equal(badTemplate.name, "Florence2InputError");
  step("hub ids: revision, remoteHost, remotePathTemplate, page URL of the mirror; a template without {model} is refused");

  // ---- revalidation: a branch revision's cached file that changed on the server is fetched again
  const hubOpts = { remoteHost: `${origin}/hub/` };
  const genPath = join(hub, "tiny2", "generation_config.json");
  const genText = readFileSync(genPath, "utf8");
  const touch = (text, when) => { writeFileSync(genPath, text); utimesSync(genPath, when, when); };
  const cachedOf = (events) => Object.fromEntries(events.filter((e) => e.status === "done").map((e) => [e.file, e.cached]));
  await ev((o) => F.clearCache("test-org/tiny2", o), hubOpts);
  const warm = await ev((o) => run("test-org/tiny2", o), hubOpts);
  assert.ok(Object.values(cachedOf(warm.events)).every((c) => !c), "cold load");
  // The same settings in other bytes, with another modification time (Last-Modified is what this server
  // sends as a validator).
  touch(`${genText.trimEnd()}\n\n`, new Date("2030-01-02T03:04:05Z"));
  const stale = await ev((o) => run("test-org/tiny2", { ...o, revalidate: false }), hubOpts);
  assert.ok(Object.values(cachedOf(stale.events)).every((c) => c), "revalidate: false uses the cached copies");
  const fresh = await ev((o) => run("test-org/tiny2", o), hubOpts);
  sameAsCli(fresh.out, want("<CAPTION>", null), "revalidated");
  const got = cachedOf(fresh.events);
  assert.equal(got["generation_config.json"], false, "the changed file is downloaded again");
  assert.ok(Object.entries(got).every(([f, c]) => f === "generation_config.json" || c), JSON.stringify(got));
  info = await ev((o) => F.cacheInfo("test-org/tiny2", o), hubOpts);
  assert.equal(info.files.find((f) => f.url.endsWith("/generation_config.json")).bytes, statSync(genPath).size);
  // A commit revision never changes: no check, the cached copy is used even when the server's differs.
  const commit = "0123456789abcdef0123456789abcdef01234567";
  await ev((o) => run("test-org/tiny2", o), { ...hubOpts, revision: commit });
  touch(genText, new Date("2031-01-02T03:04:05Z"));
  const pinned = await ev((o) => run("test-org/tiny2", o), { ...hubOpts, revision: commit });
  assert.ok(Object.values(cachedOf(pinned.events)).every((c) => c), "a commit revision is not revalidated");
  // Server down: a branch revision's cached copies still load.
  await stopServer();
  const down = await ev((o) => run("test-org/tiny2", o), hubOpts);
  sameAsCli(down.out, want("<CAPTION>", null), "revalidation offline");
  assert.ok(Object.values(cachedOf(down.events)).every((c) => c), "offline: the cached copies");
  await startServer("html");
  // Both revisions' entries go again, so the cache holds what it held before this step.
  await ev((o) => F.clearCache("test-org/tiny2", o), hubOpts);
  await ev((o) => F.clearCache("test-org/tiny2", o), { ...hubOpts, revision: commit });
  info = await ev(() => F.cacheInfo());
  assert.deepEqual(info.files.filter((f) => f.url.includes("/hub/test-org/tiny2/")), [], "tiny2's entries cleared");
  step("revalidation: a branch revision's changed file is fetched again (others stay cached), revalidate: false " +
    "and commit revisions use the cache, an unreachable server keeps the cached copies");

  // ---- image inputs
  const im = await ev(() => images());
  const capAnswer = { tokenIds: want("<CAPTION>", null).token_ids, result: want("<CAPTION>", null).result };
  for (const k of ["scene.webp", "scene.bmp", "url string", "URL object", "VideoFrame"]) {
    assert.deepEqual(im[k], capAnswer, `${k}: same pixels as scene.png, so the CLI's answer`);
  }
  for (const [k, ref] of [["scene.gif", "scene.gif.png"], ["scene_exif6.jpg", "scene_exif6.png"],
                          ["scene.jpg", "scene.jpg.png"]]) {
    assert.ok(!im[k].error, `${k}: ${im[k].error}`);
    assert.deepEqual(im[k], im[ref], `${k} answers like Pillow's decode of it (${ref})`);
  }
  assert.ok(!im["scene.avif"].error, im["scene.avif"].error);
  const avifSame = JSON.stringify(im["scene.avif"]) === JSON.stringify(im["scene.avif.png"]);
  console.log(`# AVIF: Chromium's decode ${avifSame ? "answers exactly like" : "differs from"} Pillow's`);
  assert.notDeepEqual(im["scene_exif6.jpg"], capAnswer, "the EXIF-rotated image is another input");
  assert.match(im["url of an HTML page"].error, /^Florence2ImageError: .*HTML/);
  assert.ok(!im["HTMLVideoElement"].error, im["HTMLVideoElement"].error);
  assert.deepEqual(im["HTMLVideoElement"], im["video frame drawn by the page"], "video: its current frame");
  assert.match(im["video before a frame"].error, /^Florence2ImageError: .*no current frame/);
  assert.match(im["not an image"].error, /^Florence2ImageError: image error: unsupported image: pass a Blob/);
  step("image inputs: WebP/BMP/URL string/URL/VideoFrame = CLI; GIF first frame, EXIF-6 JPEG, JPEG = Pillow's " +
    "decode; <video> current frame; HTML and non-image inputs refused by name");

  // ---- fine-tuned models' own task markers
  const cap = want("<CAPTION>", null);
  const tuned = await ev(() => run("test-org/tuned", { remoteHost: `${location.origin}/hub/`, cache: false },
    "<MY_CAPTION>"));
  assert.equal(tuned.out.task, "<MY_CAPTION>");
  assert.deepEqual(tuned.out.tokenIds, cap.token_ids);
  assert.deepEqual(tuned.out.result, { "<MY_CAPTION>": cap.result["<CAPTION>"] });
  const byOption = await ev(() => run("/model/", { cache: false, tasks: { "<ALT>": "What does the image describe?" } },
    "<ALT>"));
  assert.deepEqual(byOption.out.tokenIds, cap.token_ids);
  assert.deepEqual(byOption.out.result, { "<ALT>": cap.result["<CAPTION>"] });
  const verbatim = await ev(() => run("/model/", { cache: false, tasks: ["<GENERATE_TAGS>"] }, "<GENERATE_TAGS>"));
  assert.equal(verbatim.out.task, "<GENERATE_TAGS>");
  assert.equal(typeof verbatim.out.result["<GENERATE_TAGS>"], "string");
  assert.equal(verbatim.out.result["<GENERATE_TAGS>"],
    verbatim.out.generatedText.replaceAll("<s>", "").replaceAll("</s>", "").trim(), "pure-text answer");
  const unknown = await ev(async () => {
    const m = await F.load("/model/", { cache: false });
    try { await m.runTask(window.sceneBlob, "<GENERATE_TAGS>"); return null; }
    catch (e) { return { name: e.name, message: e.message }; } finally { m.dispose(); }
  });
  assert.equal(unknown.name, "Florence2PromptError");
  assert.match(unknown.message, /unknown Florence-2 task marker/);
  const badOption = await ev(() => fail("/model/", { cache: false, tasks: ["NO_BRACKETS"] }));
  assert.equal(badOption.name, "Florence2InputError");
  step("own task markers (processor_config.json, tasks option): answers keyed by the marker, pure text; undeclared ones keep Florence2PromptError");

  // ---- detection by content (no text/html Content-Type)
  await stopServer();
  await startServer("octet");
  const sniffed = await ev(() => run("/model/", { cache: false }));
  sameAsCli(sniffed.out, want("<CAPTION>", null), "SPA fallback with a generic Content-Type");
  const sniffFail = await ev(() => fail("/no-such-model/", { cache: false }));
  assert.equal(sniffFail.name, "Florence2LoadError");
  assert.match(sniffFail.message, /HTML page \(by its content\)/);
  step("SPA fallback served as application/octet-stream: probe sniffed absent, required file errors by content");

  // ---- the worker: the whole API
  const wk = await ev(() => workerApi());
  assert.deepEqual(wk.support, wk.pageSupport, "isSupported in the worker: the page's adapter");
  assert.equal(wk.fetchRefused?.name, "Florence2InputError");
  assert.ok(wk.events.includes("done"), "load progress reaches the page");
  assert.ok(wk.adapterInfo.length > 0 && typeof wk.tuningTable === "string", "adapterInfo and tuningTable");
  const greedy = want("<CAPTION>", 1);
  for (const k of ["onEncoding", "onEncodingAgain", "onBlob", "afterReload"]) sameAsCli(wk[k], greedy, `worker ${k}`);
  assert.ok(wk.tokens.length > 0, "streamed tokens reach the page");
  assert.deepEqual({ w: wk.encoded.width, h: wk.encoded.height, id: wk.encoded.id }, { w: 83, h: 61, id: "number" });
  assert.ok(wk.memoryWithEncoding.activationsBytes > wk.memory.activationsBytes, "the encoding's bytes are freed");
  assert.equal(wk.memory.weightsBytes, wk.memoryWithEncoding.weightsBytes);
  assert.equal(wk.disposedEncoding?.name, "Florence2InputError");
  assert.equal(typeof wk.profiled.profile?.available, "boolean", "profile: true gives a profile");
  assert.equal(wk.abort?.name, "AbortError");
  assert.ok(wk.reloadEvents.length > 0, "reload progress reaches the page");
  assert.equal(wk.encodingAfterReload?.name, "Florence2InputError", "encodings do not survive a reload");
  assert.equal(wk.afterDispose?.name, "Florence2DisposedError");
  // The estimate in the worker: tiny2 fits, auto says fp16, whose resident bytes the worker's load holds.
  assert.equal(wk.estimate.dtype, "fp16", JSON.stringify(wk.estimate));
  assert.equal(wk.estimate.estimates.length, 6, "four uniform formats and the two mixes auto considers");
  assert.equal(wk.estimate.weightsBytes, wk.memory.weightsBytes, "the estimate's weights are the load's");
  step("the worker carries the API: isSupported without a model, estimate, encoded images, streamed tokens, " +
    "memory, profile, abort, reload, dispose; answers equal the CLI's; fetch refused by name");

  // ---- cache management
  assert.equal(await ev(() => F.clearCache("/model/")), true);
  info = await ev(() => F.cacheInfo());
  assert.ok(info.files.every((f) => !f.url.startsWith(`${origin}/model/`)), "one model's entries cleared");
  assert.ok(info.files.length === 5, "the other model's stay");
  assert.equal(await ev(() => F.clearCache()), true);
  info = await ev(() => F.cacheInfo());
  assert.deepEqual({ files: info.files, bytes: info.bytes, absent: info.absent, failures: info.failures },
    { files: [], bytes: 0, absent: [], failures: [] });
  step("clearCache(source) clears one model, clearCache() all; cacheInfo() reflects it");

  // ---- storage: estimate/persisted, the persist option, cache writes that fail (over quota)
  const full = await ev(async () => {
    const put = Cache.prototype.put;
    Cache.prototype.put = () => Promise.reject(new DOMException("the disk is full", "QuotaExceededError"));
    try {
      return await run("/model/", { persist: true });
    } finally {
      Cache.prototype.put = put;
    }
  });
  sameAsCli(full.out, want("<CAPTION>", null), "cache writes failing");
  const cacheErrors = full.events.filter((e) => e.status === "cache_error");
  assert.deepEqual(cacheErrors.map((e) => e.file).sort(), [...files].sort(), "one cache_error per file");
  assert.ok(cacheErrors.every((e) => /QuotaExceededError: the disk is full/.test(e.message)), JSON.stringify(cacheErrors));
  info = await ev(() => F.cacheInfo());
  assert.deepEqual(info.files, [], "nothing was cached");
  assert.deepEqual(info.failures.map((f) => f.url).sort(), files.map((f) => `${origin}/model/${f}`).sort());
  assert.ok(info.failures.every((f) => /QuotaExceededError/.test(f.message) && f.time > 0));
  assert.ok(info.storage && info.storage.quota > 0 && info.storage.usage >= 0, JSON.stringify(info.storage));
  assert.equal(typeof info.storage.persisted, "boolean");
  step("cache writes failing (QuotaExceededError): the load answers, a cache_error event per file, cacheInfo() lists them with storage usage/quota/persisted");
  console.log(`loading tests: ${passed} passed`);
} finally {
  await browser.close();
  if (server) await stopServer();
}
