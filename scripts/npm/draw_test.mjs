// drawResult from the installed package, against a recording 2D context: every call and its coordinates
// are asserted for each answer shape (boxes, OCR quadrilaterals, polygons, open-vocabulary detection's
// mixed answer), the scale rules, hostile coordinates, and the named error for a wrong target.
//   node scripts/npm/draw_test.mjs APP_DIR   (APP_DIR: a project with the packed package installed)
import assert from "node:assert/strict";
import { test } from "node:test";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const app = process.argv[2];
if (!app) {
  console.error("usage: node scripts/npm/draw_test.mjs APP_DIR");
  process.exit(2);
}
const require = createRequire(pathToFileURL(`${app}/package.json`));
const entry = require.resolve("florence2-wasm");
const { drawResult, regionTokens, DRAW_COLORS } = await import(pathToFileURL(entry).href);

/** A 2D context that records its method calls as [name, ...args] and its style at each stroke/fill. */
function recorder(width = 400, height = 300) {
  const calls = [];
  const ctx = {
    canvas: { width, height },
    lineJoin: "miter",
    lineWidth: 1,
    strokeStyle: "#000",
    fillStyle: "#000",
    globalAlpha: 1,
    font: "",
    measureText: (t) => ({ width: t.length * 7 }),
  };
  for (const m of ["save", "restore", "beginPath", "moveTo", "lineTo", "closePath", "strokeRect", "fillRect",
                   "clearRect", "fillText"]) {
    ctx[m] = (...a) => calls.push([m, ...a]);
  }
  ctx.stroke = () => calls.push(["stroke", ctx.strokeStyle, ctx.lineWidth]);
  ctx.fill = () => calls.push(["fill", ctx.fillStyle, ctx.globalAlpha]);
  return { ctx, calls };
}
const only = (calls, name) => calls.filter((c) => c[0] === name).map((c) => c.slice(1));

test("boxes: scaled rectangles in the instance colours, labels inside the canvas, non-finite boxes skipped", () => {
  const { ctx, calls } = recorder();
  const out = { task: "<OD>", result: { "<OD>": { bboxes: [[10, 20, 110, 220], [NaN, 0, 5, 5], [0, 1, 2, 3]],
                                                 labels: ["cat", "bad", "dog"] } } };
  assert.equal(drawResult(ctx, out, { scale: 2 }), 2);
  assert.deepEqual(only(calls, "strokeRect"), [[20, 40, 200, 400], [0, 2, 4, 4]]);
  assert.deepEqual(only(calls, "fillText").map((c) => c[0]), ["cat", "dog"]);
  // The label sits above the box when there is room, at its top-left corner; inside the canvas otherwise.
  const [catBg, dogBg] = only(calls, "fillRect");
  assert.equal(catBg[0], 20);
  assert.ok(catBg[1] + catBg[3] <= 40 + 1e-9, `${catBg}`);
  assert.equal(dogBg[1], 2, "a box at the top edge gets its label inside");
  assert.equal(ctx.lineJoin, "round");
  assert.deepEqual(calls[0], ["save"]);
  assert.deepEqual(calls.at(-1), ["restore"]);
});

test("OCR quadrilaterals: closed outlines, not filled, with their text", () => {
  const { ctx, calls } = recorder();
  const value = { quad_boxes: [[1, 2, 11, 2, 11, 7, 1, 7]], labels: ["HELLO"] };
  assert.equal(drawResult(ctx, value, { scale: 0.5 }), 1);
  assert.deepEqual(only(calls, "moveTo"), [[0.5, 1]]);
  assert.deepEqual(only(calls, "lineTo"), [[5.5, 1], [5.5, 3.5], [0.5, 3.5]]);
  assert.equal(only(calls, "closePath").length, 1);
  assert.equal(only(calls, "fill").length, 0, "the outline is not filled (the label's background is a fillRect)");
  assert.deepEqual(only(calls, "stroke"), [[DRAW_COLORS[0], 2.5]]);
  assert.deepEqual(only(calls, "fillText").map((c) => c[0]), ["HELLO"]);
});

test("polygons: every part of an instance outlined and filled at the fill opacity; too-short parts skipped", () => {
  const { ctx, calls } = recorder();
  const value = { "<REFERRING_EXPRESSION_SEGMENTATION>": { polygons: [[[0, 0, 10, 0, 10, 10], [1, 1, 2, 2]],
                                                                   [[5, 5, 6, 5, 6, 6, 5, 6]]],
                                                        labels: ["", ""] } };
  assert.equal(drawResult(ctx, value, { colors: ["#123456", "#abcdef"], fillAlpha: 0.5 }), 2);
  const fills = only(calls, "fill");
  assert.deepEqual(fills, [["#123456", 0.5], ["#abcdef", 0.5]]);
  assert.deepEqual(only(calls, "stroke"), [["#123456", 2.5], ["#abcdef", 2.5]]);
  assert.equal(only(calls, "fillText").length, 0, "empty labels draw nothing");
  assert.equal(ctx.globalAlpha, 1);
});

test("open-vocabulary detection: boxes with bboxes_labels and polygons with polygons_labels", () => {
  const { ctx, calls } = recorder();
  const value = { bboxes: [[0, 0, 4, 4]], bboxes_labels: ["box"], polygons: [[[0, 0, 4, 0, 4, 4]]],
                  polygons_labels: ["poly"] };
  assert.equal(drawResult(ctx, value), 2);
  assert.deepEqual(only(calls, "fillText").map((c) => c[0]), ["box", "poly"]);
});

test("a canvas target, imageWidth's scale, labels off, clear, and what is not an answer", () => {
  const { ctx, calls } = recorder(600, 300);
  const canvas = { getContext: (id) => (id === "2d" ? ctx : null) };
  const value = { bboxes: [[10, 10, 20, 20]], labels: ["x"] };
  assert.equal(drawResult(canvas, value, { imageWidth: 300, labels: false, clear: true }), 1);
  assert.deepEqual(only(calls, "clearRect"), [[0, 0, 600, 300]]);
  assert.deepEqual(only(calls, "strokeRect"), [[20, 20, 20, 20]]);
  assert.equal(only(calls, "fillText").length, 0);
  assert.equal(drawResult(ctx, { task: "<CAPTION>", result: { "<CAPTION>": "a cat" } }), 0);
  assert.equal(drawResult(ctx, null), 0);
  assert.equal(drawResult(ctx, { bboxes: "no" , quad_boxes: [[Infinity, 0, 1, 1, 2, 2, 3, 3]] }), 1,
    "a quadrilateral keeps its finite points (three of four here)");
  assert.throws(() => drawResult({}, value), { name: "Florence2InputError" });
});

test("regionTokens: the processor's bins (floor(coord / (size / 1000)), 0..999), corners ordered", () => {
  assert.equal(regionTokens([0, 0, 640, 480], 640, 480), "<loc_0><loc_0><loc_999><loc_999>");
  // Away from bin edges the f32 arithmetic equals the exact quotient.
  assert.equal(regionTokens([100.3, 50.2, 320.1, 240.3], 640, 480), "<loc_156><loc_104><loc_500><loc_500>");
  // A box dragged from its bottom-right corner gives the same region.
  assert.equal(regionTokens([320.1, 240.3, 100.3, 50.2], 640, 480), regionTokens([100.3, 50.2, 320.1, 240.3], 640, 480));
  // Outside the image and NaN clamp; a zero size gives bin 0.
  assert.equal(regionTokens([-5, NaN, 1e9, 480], 640, 480), "<loc_0><loc_0><loc_999><loc_999>");
  assert.equal(regionTokens([1, 1, 2, 2], 0, 0), "<loc_0><loc_0><loc_0><loc_0>");
  for (let x = 0; x < 768; x += 7.3) {
    const bin = Number(/<loc_(\d+)>/.exec(regionTokens([x, 0, x, 0], 768, 768))[1]);
    assert.ok(Math.abs(bin - Math.floor((x * 1000) / 768)) <= 1, `${x}: ${bin}`);
  }
});
