// The packed packages as a Node.js user installs them:
//   node scripts/npm/node_tarball_test.mjs MAIN_TGZ PLATFORM_TGZ
// (scripts/ci/npm_package_test.sh's `tarball` part: MAIN_TGZ is `npm pack` of pkg/, PLATFORM_TGZ the
// linux-x64-gnu platform package of scripts/build/node_addon_build.sh). Two fresh apps, installed offline:
// - "native": `npm install --offline MAIN_TGZ PLATFORM_TGZ`. `import { Florence2 } from "florence2-wasm"`
//   finds the addon (isSupported().addon), `device: "auto"` and `"cpu"` load it (the software-only GPU
//   here makes auto take the CPU), and on the tiny4 fixture its token ids equal the CLI's
//   (`florence2 run --device cpu --json`) for every dtype the CLI accepts (auto too), greedy and 3 beams, with
//   `memory.device` "cpu" and `memory.engine` "native"; `device: "gpu"` (lavapipe here) equals the CLI's
//   `--device gpu`; `onToken` gets the wasm's calls; a hub id and its `revision` load from the Hugging
//   Face cache offline; `device: "wasm"` still runs the wasm.
// - "wasm": `npm install --offline MAIN_TGZ` only. The same imports run on the wasm (isSupported().addon
//   false, `memory.engine` "wasm"), answer as node_test.mjs's wasm answers do (the CLI's `--device cpu`
//   ids, fp16 greedy), and `device: "cpu"`/`"gpu"` reject with a Florence2LoadError naming the platform
//   package.
// The CLI is target/debug/florence2 (FLORENCE2_CLI overrides).
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const root = resolve(import.meta.dirname, "../..");
const [mainTgz, platformTgz] = process.argv.slice(2).map((p) => resolve(p));
assert.ok(mainTgz && platformTgz, "usage: node scripts/npm/node_tarball_test.mjs MAIN_TGZ PLATFORM_TGZ");
// The apps must find the addon the way users do, not through the developer override.
delete process.env.FLORENCE2_NODE_ADDON;

const cli = process.env.FLORENCE2_CLI ?? join(root, "target/debug/florence2");
const model = join(root, "tests/fixtures/models/tiny4");
const images = join(root, "tests/fixtures/images");
const scene = join(images, "scene.png");
const TASKS = ["<CAPTION>", "<OD>"];
const MAX_NEW = 20;
const PLATFORM = "florence2-wasm-linux-x64-gnu";

/** The CLI's token ids per task (`florence2 run --device DEVICE --json` with `dtype` and `beams`) and
 * the resident format it loaded (`dtype`: "auto" resolves to one). */
function cliIds(dtype, beams, device = "cpu") {
  const args = ["run", "--model", model, "--image", scene, "--device", device, "--json", "--dtype", dtype,
    "--num-beams", String(beams), "--max-new-tokens", String(MAX_NEW)];
  for (const t of TASKS) args.push("--task", t);
  const out = JSON.parse(execFileSync(cli, args, { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] }));
  return { ids: Object.fromEntries(out.map((o) => [o.task, o.token_ids])), dtype: out[0].dtype };
}

/** A fresh npm project with `tarballs` installed offline; the package as that project imports it. */
async function app(name, tarballs) {
  const dir = mkdtempSync(join(tmpdir(), `florence2-${name}-app-`));
  after(() => rmSync(dir, { recursive: true, force: true }));
  const npm = (args) => execFileSync("npm", args, { cwd: dir, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  npm(["init", "-y"]);
  npm(["install", "--offline", "--no-audit", "--no-fund", ...tarballs]);
  const entry = join(dir, "entry.mjs");
  writeFileSync(entry, 'export * from "florence2-wasm";\n');
  return { dir, pkg: await import(pathToFileURL(entry).href) };
}

const native = await app("native", [mainTgz, platformTgz]);
const wasm = await app("wasm", [mainTgz]);
const want = cliIds("fp16", 1).ids;

test("the main package declares the platform packages at its own version", () => {
  const main = JSON.parse(readFileSync(join(native.dir, "node_modules/florence2-wasm/package.json"), "utf8"));
  assert.equal(main.optionalDependencies[PLATFORM], main.version);
  const targets = JSON.parse(readFileSync(join(root, "src/npm/node_addon_targets.json"), "utf8")).targets;
  assert.deepEqual(Object.keys(main.optionalDependencies).sort(), targets.map((t) => `florence2-wasm-${t.triple}`).sort());
  const platform = JSON.parse(readFileSync(join(native.dir, `node_modules/${PLATFORM}/package.json`), "utf8"));
  assert.equal(platform.version, main.version);
  assert.deepEqual([platform.os, platform.cpu, platform.libc], [["linux"], ["x64"], ["glibc"]]);
  assert.ok(existsSync(join(native.dir, `node_modules/${PLATFORM}/${platform.main}`)));
  assert.ok(!existsSync(join(wasm.dir, `node_modules/${PLATFORM}`)), "the wasm app has no platform package");
});

let support = null;

test("native app: isSupported() reports the addon and the GPU native wgpu opens", async () => {
  const s = (support = await native.pkg.Florence2.isSupported());
  assert.equal(s.addon, true, s.addonReason);
  assert.match(s.addonReason, new RegExp(PLATFORM));
  assert.equal(s.wasm, true);
  assert.equal(s.supported, true);
  // Here the only Vulkan adapter is lavapipe, a software one: auto takes the native CPU.
  if (s.gpu) assert.equal(s.gpuReason, "");
  else assert.match(s.gpuReason, /software|no GPU adapter/, JSON.stringify(s));
});

// Every --dtype the CLI accepts (`florence2 run --help`): auto resolves as the CLI's does.
for (const dtype of ["fp32", "fp16", "q8", "q4", "auto"]) {
  test(`native app, ${dtype}: the CLI's ids, greedy and 3 beams, on the native CPU`, async () => {
    const events = [];
    const m = await native.pkg.Florence2.load(model, { device: "cpu", dtype, onProgress: (e) => events.push(e) });
    try {
      // Each file read from the directory (done, cached, its size), each followed by the aggregate; then
      // the format in a dtype event (why, for auto: as the CLI says it), then ready.
      const fileEvents = events.filter((e) => e.status === "done");
      const names = fileEvents.map((e) => e.file);
      for (const f of ["config.json", "tokenizer.json", "model.safetensors"]) assert.ok(names.includes(f), names.join());
      for (const e of fileEvents) {
        const size = readFileSync(join(model, e.file)).length;
        assert.deepEqual([e.loaded, e.total, e.progress, e.cached], [size, size, 100, true], e.file);
      }
      const totals = events.filter((e) => e.status === "progress_total");
      assert.equal(totals.length, fileEvents.length);
      const bytes = fileEvents.reduce((a, e) => a + e.total, 0);
      assert.deepEqual([totals.at(-1).loaded, totals.at(-1).total, totals.at(-1).progress], [bytes, bytes, 100]);
      assert.deepEqual(events.slice(-2).map((e) => e.status), ["dtype", "ready"]);
      const dtypeEvent = events.at(-2);
      assert.equal(dtypeEvent.dtype, m.memory().dtype);
      if (dtype === "auto") assert.match(dtypeEvent.reason, /^auto chose fp16 for this cpu device/);
      else assert.equal(dtypeEvent.reason, "");
      assert.match(m.adapterInfo, /^native CPU backend: .*device cpu asked for.*florence2-wasm-linux-x64-gnu/);
      for (const beams of [1, 3]) {
        const cliRun = cliIds(dtype, beams);
        const ids = cliRun.ids;
        for (const task of TASKS) {
          const out = await m.runTask(scene, task, { numBeams: beams, maxNewTokens: MAX_NEW });
          assert.deepEqual(out.tokenIds, ids[task], `${dtype}, ${beams} beam(s), ${task}`);
          assert.equal(out.memory.device, "cpu");
          assert.equal(out.memory.engine, "native");
          assert.equal(out.memory.dtype, cliRun.dtype);
        }
      }
    } finally {
      m.dispose();
    }
  });
}

test("native app: device auto takes the addon; bytes, an encoding and a file: URL answer alike", async () => {
  const m = await native.pkg.Florence2.load(pathToFileURL(model).href);
  try {
    // auto: the GPU when isSupported() found a hardware one, else the native CPU.
    const device = support.gpu ? "gpu" : "cpu";
    assert.deepEqual([m.memory().engine, m.memory().device], ["native", device]);
    assert.ok(m instanceof native.pkg.Florence2, "a native model is a Florence2");
    assert.match(m.adapterInfo, device === "gpu" ? /native GPU/ : /native CPU backend/);
    const ids = device === "gpu" ? cliIds("fp16", 1, "gpu").ids : want;
    const opts = { maxNewTokens: MAX_NEW, numBeams: 1 };
    const bytes = readFileSync(scene);
    assert.deepEqual((await m.runTask(new Uint8Array(bytes), "<CAPTION>", opts)).tokenIds, ids["<CAPTION>"]);
    const enc = await m.encodeImage(bytes);
    // The encoding's size is the wasm's: also for a JPEG whose EXIF orientation (6) turns it.
    const wasmModel = await wasm.pkg.Florence2.load(model);
    try {
      const exif = readFileSync(join(images, "formats/scene_exif6.jpg"));
      for (const [what, b, e] of [["scene.png", bytes, enc], ["scene_exif6.jpg", exif, await m.encodeImage(exif)]]) {
        const wasmEnc = await wasmModel.encodeImage(b);
        assert.deepEqual([e.width, e.height], [wasmEnc.width, wasmEnc.height], what);
        wasmEnc.dispose();
      }
    } finally {
      wasmModel.dispose();
    }
    assert.deepEqual((await m.runTask(enc, "<OD>", opts)).tokenIds, ids["<OD>"]);
    assert.deepEqual((await m.runTask(enc, "<CAPTION>", opts)).tokenIds, ids["<CAPTION>"]);
    // The encoding is this model's: another model (of the same files) refuses it by name.
    const other = await native.pkg.Florence2.load(model, { device: "cpu" });
    try {
      await assert.rejects(other.runTask(enc, "<OD>", opts), { name: "Florence2InputError" });
    } finally {
      other.dispose();
    }
    enc.dispose();
    await assert.rejects(m.runTask(enc, "<OD>", opts), { name: "Florence2InputError" });
    await assert.rejects(m.runTask(Buffer.from("not an image"), "<OD>", opts), { name: "Florence2ImageError" });
  } finally {
    m.dispose();
  }
});

test("native app: device gpu (lavapipe here): the CLI's --device gpu ids, greedy and 3 beams", async () => {
  const m = await native.pkg.Florence2.load(model, { device: "gpu" });
  try {
    assert.match(m.adapterInfo, /native GPU/);
    for (const beams of [1, 3]) {
      const ids = cliIds("fp16", beams, "gpu").ids;
      for (const task of TASKS) {
        const out = await m.runTask(scene, task, { numBeams: beams, maxNewTokens: MAX_NEW });
        assert.deepEqual(out.tokenIds, ids[task], `gpu, ${beams} beam(s), ${task}`);
        assert.deepEqual([out.memory.device, out.memory.engine], ["gpu", "native"]);
      }
    }
  } finally {
    m.dispose();
  }
});

test("native app: onToken gets the wasm's token calls, all before the promise settles", async () => {
  const n = await native.pkg.Florence2.load(model, { device: "cpu" });
  const w = await wasm.pkg.Florence2.load(model);
  try {
    for (const numBeams of [1, 3]) {
      const calls = { native: [], wasm: [] };
      const opts = (k) => ({ numBeams, maxNewTokens: MAX_NEW, onToken: (t, id) => calls[k].push([t, id]) });
      const out = await n.runTask(scene, "<CAPTION>", opts("native"));
      const atSettle = calls.native.length;
      await w.runTask(scene, "<CAPTION>", opts("wasm"));
      assert.ok(calls.wasm.length > 0);
      assert.deepEqual(calls.native, calls.wasm, `${numBeams} beam(s)`);
      assert.equal(atSettle, calls.native.length, "a token call came after the promise settled");
      assert.deepEqual(calls.native.map(([, id]) => id), out.tokenIds.slice(1), "every id but the start token");
    }
    const boom = new Error("onToken failed");
    const failing = { maxNewTokens: MAX_NEW, onToken: () => { throw boom; } };
    await assert.rejects(n.runTask(scene, "<CAPTION>", failing), (e) => e === boom);
    const again = await n.runTask(scene, "<CAPTION>", { maxNewTokens: MAX_NEW, numBeams: 1 });
    assert.deepEqual(again.tokenIds, want["<CAPTION>"]);
  } finally {
    n.dispose();
    w.dispose();
  }
});

test("native app: a hub id (and its revision) or its hub URL from the Hugging Face cache the CLI shares, offline", async () => {
  // The cache layout huggingface_hub writes: refs/REVISION names the commit, snapshots/COMMIT the files.
  const cache = mkdtempSync(join(tmpdir(), "florence2-hf-cache-"));
  const saved = { HF_HUB_CACHE: process.env.HF_HUB_CACHE, HF_HUB_OFFLINE: process.env.HF_HUB_OFFLINE };
  try {
    const commit = "0123456789abcdef0123456789abcdef01234567";
    const repo = join(cache, "models--fixture--tiny4");
    cpSync(model, join(repo, "snapshots", commit), { recursive: true });
    mkdirSync(join(repo, "refs"));
    writeFileSync(join(repo, "refs", "v1"), commit);
    Object.assign(process.env, { HF_HUB_CACHE: cache, HF_HUB_OFFLINE: "1" });
    const m = await native.pkg.Florence2.load("fixture/tiny4", { device: "cpu", revision: "v1" });
    try {
      const out = await m.runTask(scene, "<OD>", { maxNewTokens: MAX_NEW, numBeams: 1 });
      assert.deepEqual([out.tokenIds, out.memory.engine], [want["<OD>"], "native"]);
    } finally {
      m.dispose();
    }
    // The repository's hub URL is the same repository, read natively through the same cache.
    for (const url of ["https://huggingface.co/fixture/tiny4/tree/v1", new URL("https://huggingface.co/fixture/tiny4/resolve/v1/")]) {
      const u = await native.pkg.Florence2.load(url, { device: "cpu" });
      try {
        const out = await u.runTask(scene, "<OD>", { maxNewTokens: MAX_NEW, numBeams: 1 });
        assert.deepEqual([out.tokenIds, out.memory.engine], [want["<OD>"], "native"], String(url));
      } finally {
        u.dispose();
      }
    }
    // No refs/main in this cache: offline, the default revision is not there, and the error says which.
    await assert.rejects(native.pkg.Florence2.load("fixture/tiny4", { device: "cpu" }), {
      name: "Florence2LoadError",
      message: /fixture\/tiny4@main: no snapshot in the cache.*offline/,
    });
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
    rmSync(cache, { recursive: true, force: true });
  }
});

test("native app: device wasm runs the wasm build", async () => {
  const m = await native.pkg.Florence2.load(model, { device: "wasm" });
  try {
    const out = await m.runTask(scene, "<OD>", { maxNewTokens: MAX_NEW, numBeams: 1 });
    assert.deepEqual([out.memory.engine, out.memory.device], ["wasm", "cpu"]);
    assert.deepEqual(out.tokenIds, want["<OD>"]);
    assert.ok(m instanceof native.pkg.Florence2);
    assert.ok(!({} instanceof native.pkg.Florence2));
  } finally {
    m.dispose();
  }
});

test("wasm app: no addon, isSupported() says so and device auto runs the wasm", async () => {
  const { Florence2 } = wasm.pkg;
  const s = await Florence2.isSupported();
  assert.equal(s.addon, false);
  assert.equal(s.gpu, false);
  assert.equal(s.addonReason, `the optional package ${PLATFORM} is not installed (npm skips it when optional ` +
    "dependencies are omitted)");
  assert.equal(s.wasm, true);
  assert.equal(s.device, "cpu");
  const m = await Florence2.load(model);
  try {
    assert.match(m.adapterInfo, /CPU backend/);
    for (const task of TASKS) {
      const out = await m.runTask(scene, task, { maxNewTokens: MAX_NEW, numBeams: 1 });
      assert.deepEqual([out.memory.engine, out.memory.device], ["wasm", "cpu"]);
      assert.deepEqual(out.tokenIds, want[task], task);
    }
    assert.equal(m.memory().engine, "wasm");
  } finally {
    m.dispose();
  }
});

test("wasm app: device cpu or gpu without the addon is a named error saying why", async () => {
  for (const device of ["cpu", "gpu"]) {
    await assert.rejects(wasm.pkg.Florence2.load(model, { device }), {
      name: "Florence2LoadError",
      message: new RegExp(`device "${device}" runs on the native addon.*${PLATFORM}.*device "wasm"`),
    });
  }
  await assert.rejects(wasm.pkg.Florence2.load(model, { device: "tpu" }), { name: "Florence2InputError" });
});

test("estimate: the native engine answers for a directory (its device's limits), with the wasm's figures", async () => {
  const { Florence2 } = native.pkg;
  const fields = ["dtype", "downloadBytes", "weightsBytes", "peakBytes", "largestBufferBytes", "decodeBytes"];
  for (const dtype of ["fp32", "fp16", "q8", "q4"]) {
    const n = await Florence2.estimate(model, { device: "cpu", dtype });
    const w = await Florence2.estimate(model, { device: "wasm", dtype });
    for (const f of fields) assert.equal(n[f], w[f], `${dtype}: ${f}`);
  }
  // Natively the CPU backend has no 4 GiB wasm32 address space: its largest buffer is unbounded.
  const n = await Florence2.estimate(model, { device: "cpu" });
  const w = await Florence2.estimate(model, { device: "wasm" });
  assert.ok(n.device.maxBufferSize >= w.device.maxBufferSize, JSON.stringify([n.device, w.device]));
});
