// The native Node addon against the CLI: the same token ids on the fixture models (greedy and beam,
// every image input form), the browser build's error names, the event loop free during a task, abort,
// dispose during a task, two models in one process.
// Run by scripts/npm/node_addon_test.sh (FLORENCE2_NODE_ADDON: the built addon; FLORENCE2_CLI: the CLI).
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, cpSync, writeFileSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { NativeFlorence2, loadAddon } from "./node_addon.js";

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
