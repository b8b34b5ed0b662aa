// The native Node addon against the CLI: the same token ids on the fixture models (greedy and beam,
// every image input form), the browser build's error names, the event loop free during a task, abort,
// dispose during a task, two models in one process, hostile inputs (a pickle with a foreign global,
// truncated/bomb/oversized images, bad task strings, huge or wrong-typed options).
// Run by scripts/npm/node_addon_test.sh (FLORENCE2_NODE_ADDON: the built addon; FLORENCE2_CLI: the CLI).
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, cpSync, writeFileSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { NativeFlorence2, loadAddon } from "../../src/npm/node_addon.js";

const root = resolve(import.meta.dirname, "../..");
const cli = process.env.FLORENCE2_CLI ?? join(root, "target/debug/florence2");
const models = {
  tiny2: join(root, "tests/fixtures/models/tiny2"),
  tiny4: join(root, "tests/fixtures/models/tiny4"),
  shapes: join(root, "www/models/florence2-shapes"),
};
const images = join(root, "tests/fixtures/images");
const scene = join(images, "scene.png");

/** The CLI's token ids for one task (`--device cpu`, the addon's device in these tests). */
function cliIds(model, image, task, beams) {
  const out = execFileSync(cli, [
    "run", "--model", model, "--image", image, "--task", task, "--device", "cpu", "--json",
    "--num-beams", String(beams),
  ], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] });
  return JSON.parse(out).token_ids;
}

const load = (model) => NativeFlorence2.load(model, { device: "cpu" });

test("the addon is found", () => {
  const { addon, reason } = loadAddon();
  assert.ok(addon, reason);
});

for (const [name, dir] of Object.entries(models)) {
  for (const beams of [1, 3]) {
    test(`${name}, ${beams} beam(s): the CLI's token ids`, async () => {
      const model = await load(dir);
      try {
        const out = await model.runTask(scene, "<CAPTION>", { numBeams: beams });
        assert.deepEqual(out.tokenIds, cliIds(dir, scene, "<CAPTION>", beams));
        assert.equal(out.task, "<CAPTION>");
        assert.equal(out.result["<CAPTION>"], out.text);
        assert.equal(out.memory.device, "cpu");
        assert.ok(out.memory.weightsBytes > 0);
      } finally {
        model.dispose();
      }
    });
  }
}

test("a format per part: an object or its text form gives the CLI's ids with that mix", async () => {
  const mix = "vision=fp16,text=q4";
  const want = JSON.parse(execFileSync(cli, [
    "run", "--model", models.tiny4, "--image", scene, "--task", "<OD>", "--device", "cpu", "--json",
    "--dtype", mix,
  ], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }));
  for (const dtype of [{ vision: "fp16", text: "q4" }, "text=q4,vision=fp16"]) {
    const model = await NativeFlorence2.load(models.tiny4, { device: "cpu", dtype });
    try {
      assert.equal(model.memory().dtype, mix);
      const out = await model.runTask(scene, "<OD>");
      assert.deepEqual(out.tokenIds, want.token_ids, JSON.stringify(dtype));
      assert.equal(out.memory.weightsBytes, want.memory.weights_bytes);
    } finally {
      model.dispose();
    }
  }
  const bad = (dtype) => NativeFlorence2.load(models.tiny4, { device: "cpu", dtype });
  await assert.rejects(bad({ visoin: "fp16" }), { name: "Florence2InputError", message: /unknown model part 'visoin'/ });
  await assert.rejects(bad({ vision: 16 }), { name: "Florence2InputError", message: /dtype\.vision must be/ });
  await assert.rejects(bad({ vision: "fp16,text=q4" }), { name: "Florence2InputError" });
  await assert.rejects(bad(["fp16"]), { name: "Florence2InputError" });
});

test("bytes of every format, a file: URL and RGBA pixels give the CLI's ids", async () => {
  const model = await load(models.shapes);
  try {
    for (const f of ["scene.jpg", "scene.png", "formats/scene.webp", "formats/scene.gif", "formats/scene.bmp"]) {
      const path = join(images, f);
      const want = cliIds(models.shapes, path, "<CAPTION>", 1);
      const bytes = new Uint8Array(readFileSync(path));
      assert.deepEqual((await model.runTask(bytes, "<CAPTION>", { numBeams: 1 })).tokenIds, want, f);
    }
    const url = pathToFileURL(scene);
    const want = cliIds(models.shapes, scene, "<CAPTION>", 1);
    assert.deepEqual((await model.runTask(url, "<CAPTION>", { numBeams: 1 })).tokenIds, want);
    // A 2x1 RGBA image: any answer, but a result of the same shape.
    const px = { data: new Uint8Array([255, 0, 0, 255, 0, 0, 255, 255]), width: 2, height: 1 };
    const out = await model.runTask(px, "<CAPTION>", { numBeams: 1 });
    assert.ok(Array.isArray(out.tokenIds) && out.tokenIds.length > 0);
  } finally {
    model.dispose();
  }
});

test("named errors: missing model, corrupt weights, bad device, bad image", async () => {
  await assert.rejects(load(join(root, "tests/fixtures/models/no-such-model")), {
    name: "Florence2LoadError",
    message: /no such model directory/,
  });
  await assert.rejects(load("file:///nonexistent/model%20dir"), {
    name: "Florence2LoadError",
    message: /\/nonexistent\/model dir/,
  });
  const dir = mkdtempSync(join(tmpdir(), "florence2-node-"));
  try {
    cpSync(models.tiny2, dir, { recursive: true });
    writeFileSync(join(dir, "model.safetensors"), Buffer.from("not a safetensors file at all"));
    await assert.rejects(load(dir), { name: "Florence2LoadError" });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  await assert.rejects(NativeFlorence2.load(models.tiny2, { device: "tpu" }), { name: "Florence2InputError" });
  const model = await load(models.tiny2);
  try {
    await assert.rejects(model.runTask(new Uint8Array([1, 2, 3]), "<CAPTION>"), { name: "Florence2ImageError" });
  } finally {
    model.dispose();
  }
});

test("tiles: the CLI's tiled answer, what it chose, and named errors", async () => {
  const page = join(models.shapes, "samples/heldout_000.png");
  const cliRun = (tiles) =>
    JSON.parse(execFileSync(cli, [
      "run", "--model", models.shapes, "--image", page, "--task", "<OD>", "--device", "cpu", "--json",
      "--num-beams", "1", "--tiles", tiles,
    ], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }));
  const model = await load(models.shapes);
  try {
    const want = cliRun("2x2");
    const out = await model.runTask(page, "<OD>", { numBeams: 1, tiles: "2x2" });
    assert.deepEqual(out.tiles, want.tiles);
    assert.equal(out.tiles.views, 5);
    assert.deepEqual(out.result, want.result);
    assert.deepEqual(out.tokenIds, []);
    // auto on a scene at the model's input size: one view, the untiled answer.
    const one = await model.runTask(page, "<OD>", { numBeams: 1, tiles: "auto" });
    assert.match(one.tiles.off, /192x192/);
    assert.deepEqual(one.tokenIds, cliIds(models.shapes, page, "<OD>", 1));
    await assert.rejects(model.runTask(page, "<CAPTION>", { tiles: "auto" }), { name: "Florence2PromptError" });
    for (const tiles of ["9x9", "big", 4]) {
      await assert.rejects(model.runTask(page, "<OD>", { tiles }), { name: "Florence2InputError" });
    }
    const enc = await model.encodeImage(page);
    try {
      await assert.rejects(model.runTask(enc, "<OD>", { tiles: "2x2" }), { name: "Florence2InputError" });
    } finally {
      enc.dispose();
    }
  } finally {
    model.dispose();
  }
});

test("the event loop stays free during a task", async () => {
  const model = await load(models.shapes);
  let ticks = 0;
  let ticksAtEnd = -1;
  const timer = setInterval(() => ticks++, 1);
  try {
    // Three beams on the shapes model: hundreds of ms of work off the JS thread.
    const task = model.runTask(scene, "<CAPTION>", { numBeams: 3 });
    await task.then(() => (ticksAtEnd = ticks));
  } finally {
    clearInterval(timer);
    model.dispose();
  }
  assert.ok(ticksAtEnd > 0, `the timer fired ${ticksAtEnd} times while the task ran`);
});

test("abort rejects with the signal's reason; the model keeps working", async () => {
  const model = await load(models.shapes);
  try {
    const ctl = new AbortController();
    const task = model.runTask(scene, "<CAPTION>", { signal: ctl.signal, numBeams: 3 });
    ctl.abort();
    await assert.rejects(task, { name: "AbortError" });
    const out = await model.runTask(scene, "<CAPTION>", { numBeams: 1 });
    assert.deepEqual(out.tokenIds, cliIds(models.shapes, scene, "<CAPTION>", 1));
  } finally {
    model.dispose();
  }
});

test("dispose during a task rejects it and later calls with Florence2DisposedError", async () => {
  const model = await load(models.shapes);
  const task = model.runTask(scene, "<CAPTION>", { numBeams: 3 });
  model.dispose();
  await assert.rejects(task, { name: "Florence2DisposedError" });
  await assert.rejects(model.runTask(scene, "<CAPTION>"), { name: "Florence2DisposedError" });
  assert.throws(() => model.memory(), { name: "Florence2DisposedError" });
});

test("two models in one process, tasks interleaved", async () => {
  const [a, b] = await Promise.all([load(models.tiny2), load(models.tiny4)]);
  try {
    const [ra, rb] = await Promise.all([
      a.runTask(scene, "<CAPTION>", { numBeams: 1 }),
      b.runTask(scene, "<CAPTION>", { numBeams: 1 }),
    ]);
    assert.deepEqual(ra.tokenIds, cliIds(models.tiny2, scene, "<CAPTION>", 1));
    assert.deepEqual(rb.tokenIds, cliIds(models.tiny4, scene, "<CAPTION>", 1));
  } finally {
    a.dispose();
    b.dispose();
  }
});

/** CRC-32 (PNG chunks). */
function crc32(bytes) {
  let c = 0xffffffff;
  for (const b of bytes) {
    c ^= b;
    for (let k = 0; k < 8; k++) c = (c >>> 1) ^ (0xedb88320 & -(c & 1));
  }
  return (c ^ 0xffffffff) >>> 0;
}

/** A PNG whose IHDR claims `w` x `h` RGBA pixels, with one tiny IDAT (a decompression-bomb header). */
function claimedPng(w, h) {
  const chunk = (type, data) => {
    const body = Buffer.concat([Buffer.from(type, "latin1"), data]);
    const out = Buffer.alloc(8 + data.length + 4);
    out.writeUInt32BE(data.length, 0);
    body.copy(out, 4);
    out.writeUInt32BE(crc32(body), 8 + data.length);
    return out;
  };
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(w, 0);
  ihdr.writeUInt32BE(h, 4);
  ihdr.set([8, 6, 0, 0, 0], 8);
  const idat = Buffer.from([0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01]);
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk("IHDR", ihdr), chunk("IDAT", idat), chunk("IEND", Buffer.alloc(0)),
  ]);
}

/** A legacy torch checkpoint whose main pickle calls a foreign global (`os.system`). */
function hostilePickle() {
  const magic = Buffer.from([0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e]);
  const protocol = Buffer.from([0x80, 0x02, 0x4d, 0xe9, 0x03, 0x2e]);
  const sysInfo = Buffer.from([0x80, 0x02, 0x7d, 0x71, 0x00, 0x2e]);
  const main = Buffer.concat([
    Buffer.from([0x80, 0x02]), Buffer.from("cos\nsystem\n", "latin1"),
    Buffer.from([0x58, 0x02, 0, 0, 0]), Buffer.from("id", "latin1"), Buffer.from([0x85, 0x52, 0x2e]),
  ]);
  return Buffer.concat([magic, protocol, sysInfo, main]);
}

test("hostile inputs: named errors, the process survives and the model keeps working", async () => {
  const dir = mkdtempSync(join(tmpdir(), "florence2-node-"));
  try {
    // A pickle checkpoint naming a foreign global is refused before anything runs.
    cpSync(models.tiny2, dir, { recursive: true });
    rmSync(join(dir, "model.safetensors"));
    writeFileSync(join(dir, "pytorch_model.bin"), hostilePickle());
    await assert.rejects(load(dir), { name: "Florence2LoadError", message: /'os\.system', which is not allowed/ });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  const model = await load(models.tiny2);
  try {
    const png = readFileSync(scene);
    const expected = (await model.runTask(png, "<CAPTION>")).tokenIds;
    // A truncated PNG, a bomb header (2^31-1 square: past PNG's own limit), an image over the pixel limit
    // (65536 x 65536, refused from its header before any pixel is decoded).
    const bad = [
      [png.subarray(0, png.length >> 1), "Florence2ImageError"],
      [claimedPng(0x7fffffff, 0x7fffffff), "Florence2ImageError"],
      [claimedPng(65536, 65536), "Florence2ImageTooLargeError"],
    ];
    for (const [bytes, name] of bad) {
      await assert.rejects(model.runTask(bytes, "<CAPTION>"), { name });
    }
    // RGBA pixels whose buffer is shorter than width x height x 4; pixels over the limit.
    await assert.rejects(
      model.runTask({ data: new Uint8Array(16), width: 100, height: 100 }, "<CAPTION>"),
      { name: "Florence2ImageError" },
    );
    await assert.rejects(
      model.runTask({ data: new Uint8Array(16), width: 100000, height: 100000 }, "<CAPTION>"),
      { name: "Florence2ImageTooLargeError" },
    );
    // Task strings that are no task, or a text task's input with a control character.
    for (const task of ["<NOT_A_TASK>", "", "<CAPTION", "<OPEN_VOCABULARY_DETECTION>\u0000"]) {
      await assert.rejects(model.runTask(png, task), { name: "Florence2PromptError" }, JSON.stringify(task));
    }
    // A huge maxNewTokens is bounded by the decoder's positions (tiny2's max_position_embeddings: 160):
    // an answer, not an allocation.
    const huge = await model.runTask(png, "<CAPTION>", { maxNewTokens: 0xffffffff });
    assert.ok(Array.isArray(huge.tokenIds) && huge.tokenIds.length <= 160, `${huge.tokenIds?.length}`);
    // A wrong-typed option is refused with a message naming it.
    await assert.rejects(model.runTask(png, "<CAPTION>", { maxNewTokens: "many" }), {
      name: "Florence2InputError",
      message: /maxNewTokens/,
    });
    // The model still answers as before.
    assert.deepEqual((await model.runTask(png, "<CAPTION>")).tokenIds, expected);
  } finally {
    model.dispose();
  }
});

/** `florence2 estimate --json` on `model` (the CLI's native estimate, snake_case). */
function cliEstimate(model, args) {
  return JSON.parse(execFileSync(cli, ["estimate", "--model", model, "--device", "cpu", ...args], {
    encoding: "utf8",
    stdio: ["ignore", "pipe", "ignore"],
  }));
}

test("estimate on the native engine: the CLI's figures per format, auto's choice, named errors", async () => {
  const cliAll = cliEstimate(models.tiny4, ["--dtype", "auto"]);
  const auto = await NativeFlorence2.estimate(models.tiny4, { device: "cpu", dtype: "auto" });
  assert.equal(auto.dtype, cliAll.auto.dtype, "auto chooses as the CLI does");
  assert.equal(auto.reason, cliAll.auto.reason);
  assert.equal(auto.estimates.length, cliAll.estimates.length);
  for (const c of cliAll.estimates) {
    const fixed = await NativeFlorence2.estimate(models.tiny4, { device: "cpu", dtype: c.dtype });
    const e = auto.estimates.find((x) => x.dtype === c.dtype);
    for (const x of [fixed, e]) {
      assert.equal(x.dtype, c.dtype);
      assert.equal(x.downloadBytes, c.download_bytes, `${c.dtype} download`);
      assert.equal(x.weightsBytes, c.weights_bytes, `${c.dtype} weights`);
      assert.equal(x.peakBytes, c.peak_bytes, `${c.dtype} peak`);
      assert.equal(x.largestBufferBytes, c.largest_buffer_bytes, `${c.dtype} largest buffer`);
      assert.equal(x.fits, c.fits);
      assert.equal(x.device.class, cliAll.device.class);
    }
  }
  // Shorter requests shrink the decode phase as natively.
  const short = await NativeFlorence2.estimate(models.tiny4, { device: "cpu", maxNewTokens: 8, numBeams: 1 });
  const cliShort = cliEstimate(models.tiny4, ["--dtype", "fp16", "--max-new-tokens", "8", "--num-beams", "1"]);
  assert.equal(short.decodeBytes, cliShort.estimates[0].decode_bytes);
  assert.ok(short.decodeBytes < auto.estimates.find((x) => x.dtype === "fp16").decodeBytes);
  const rejects = async (p, name) => assert.rejects(p, (e) => e.name === name);
  await rejects(NativeFlorence2.estimate(join(root, "no-such-model"), { device: "cpu" }), "Florence2LoadError");
  await rejects(NativeFlorence2.estimate(models.tiny4, { dtype: "q5" }), "Florence2InputError");
  await rejects(NativeFlorence2.estimate(models.tiny4, { numBeams: 0 }), "Florence2InputError");
  await rejects(NativeFlorence2.estimate(models.tiny4, { maxNewTokens: -1 }), "Florence2InputError");
});

/** This process's resident set in bytes (/proc/self/statm: pages). */
function rssBytes() {
  return Number(readFileSync("/proc/self/statm", "utf8").split(" ")[1]) * 4096;
}

/** Call `i` of a mixed load: tasks greedy and with beams, from a path, bytes and an encoding, two at
 * once, and a task aborted at its first token (8 new tokens at most: the buffers of every phase are
 * made and freed, at a tenth of a full answer's time). */
async function mixedCall(model, i, bytes) {
  const o = { maxNewTokens: 8 };
  switch (i % 5) {
    case 0:
      return model.runTask(scene, "<CAPTION>", o);
    case 1:
      return model.runTask(bytes, "<OD>", { ...o, numBeams: 3 });
    case 2: {
      const enc = await model.encodeImage(scene);
      await model.runTask(enc, "<OCR>", o);
      return model.runTask(enc, "<CAPTION>", { ...o, numBeams: 2 });
    }
    case 3: {
      const ac = new AbortController();
      const p = model.runTask(scene, "<MORE_DETAILED_CAPTION>", { signal: ac.signal, onToken: () => ac.abort() });
      return p.catch((e) => assert.equal(e.name, "AbortError"));
    }
    default:
      return Promise.all([model.runTask(scene, "<OD>", o), model.runTask(bytes, "<DENSE_REGION_CAPTION>", o)]);
  }
}

// Bound: 10% of the warm baseline. A task's buffers are freed when it ends, but glibc keeps freed
// memory in each libuv worker's arena; what comes back after 100 calls is bounded, not zero. A leak of
// one image's pixels or one task's KV cache per call (~0.2-1 MB on this model) would add 20-100 MB.
test("100 mixed calls: RSS back within 10% of its warm baseline", async () => {
  const model = await load(models.shapes);
  const bytes = readFileSync(scene);
  try {
    for (let i = 0; i < 10; i++) await mixedCall(model, i, bytes);
    const base = rssBytes();
    for (let i = 0; i < 100; i++) await mixedCall(model, i, bytes);
    const after = rssBytes();
    const mb = (b) => (b / 1e6).toFixed(1);
    console.log(`# RSS warm ${mb(base)} MB, after 100 mixed calls ${mb(after)} MB (${((after / base - 1) * 100).toFixed(1)}%)`);
    assert.ok(after <= base * 1.1, `RSS ${mb(base)} MB -> ${mb(after)} MB`);
  } finally {
    model.dispose();
  }
});

test("load's onProgress: each file read, then dtype and ready; a throwing callback fails the load", async () => {
  const events = [];
  const model = await NativeFlorence2.load(models.tiny4, { device: "cpu", onProgress: (e) => events.push(e) });
  model.dispose();
  const files = events.filter((e) => e.status === "done").map((e) => e.file);
  assert.ok(files.includes("model.safetensors") && files.includes("config.json"), files.join());
  assert.deepEqual(events.slice(-2).map((e) => e.status), ["dtype", "ready"]);
  await assert.rejects(
    NativeFlorence2.load(models.tiny4, { device: "cpu", onProgress: () => { throw new Error("stop here"); } }),
    /stop here/,
  );
});

test("a hub download's files: download and done events, into the Hugging Face cache; offline after", async () => {
  const { createServer } = await import("node:http");
  const { createHash } = await import("node:crypto");
  const commit = "0123456789abcdef0123456789abcdef01234567";
  // A hub-shaped server: /ORG/NAME/resolve/REV/FILE from tiny4, with the hub's commit and ETag headers
  // (a git blob hash for small files, the SHA-256 for weights, which the downloader verifies).
  const server = createServer((req, res) => {
    const m = /^\/[^/]+\/[^/]+\/resolve\/[^/]+\/([^?]+)$/.exec(req.url);
    const file = m && join(models.tiny4, m[1]);
    let bytes;
    try {
      bytes = readFileSync(file);
    } catch {
      res.writeHead(404, { "X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit });
      return res.end();
    }
    const weights = file.endsWith(".safetensors");
    const etag = weights
      ? createHash("sha256").update(bytes).digest("hex")
      : createHash("sha1").update(`blob ${bytes.length}\0`).update(bytes).digest("hex");
    res.writeHead(200, { "X-Repo-Commit": commit, ETag: `"${etag}"`, "Content-Length": bytes.length });
    res.end(req.method === "HEAD" ? undefined : bytes);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const cache = mkdtempSync(join(tmpdir(), "florence2-hub-"));
  const saved = Object.fromEntries(["HF_ENDPOINT", "HF_HUB_CACHE", "HF_HUB_OFFLINE"].map((k) => [k, process.env[k]]));
  try {
    Object.assign(process.env, { HF_ENDPOINT: `http://127.0.0.1:${server.address().port}`, HF_HUB_CACHE: cache });
    delete process.env.HF_HUB_OFFLINE;
    const events = [];
    const model = await NativeFlorence2.load("fixture/tiny4", { device: "cpu", onProgress: (e) => events.push(e) });
    model.dispose();
    const of = (file) => events.filter((e) => e.file === file).map((e) => [e.status, e.cached]);
    const size = readFileSync(join(models.tiny4, "model.safetensors")).length;
    assert.deepEqual(of("model.safetensors")[0], ["download", false]);
    assert.deepEqual(of("model.safetensors").at(-1), ["done", false]);
    const done = events.find((e) => e.file === "model.safetensors" && e.status === "done");
    assert.deepEqual([done.loaded, done.total, done.progress], [size, size, 100]);
    assert.deepEqual(of("config.json").at(-1), ["done", false]);
    assert.deepEqual(events.slice(-2).map((e) => e.status), ["dtype", "ready"]);
    // Offline, with the server gone: the same model from the cache, every file read from disk.
    await new Promise((r) => server.close(r));
    process.env.HF_HUB_OFFLINE = "1";
    const again = [];
    const cached = await NativeFlorence2.load("https://huggingface.co/fixture/tiny4", {
      device: "cpu",
      onProgress: (e) => again.push(e),
    });
    cached.dispose();
    const files = again.filter((e) => e.status === "done");
    assert.ok(files.length >= 3 && files.every((e) => e.cached), JSON.stringify(files));
  } finally {
    server.close();
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
    rmSync(cache, { recursive: true, force: true });
  }
});
