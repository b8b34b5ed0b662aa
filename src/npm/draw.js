// drawResult: a task's answer drawn over its image on a 2D canvas (boxes with labels, OCR quadrilaterals
// with their text, polygons outlined and filled: every shape a Florence-2 task answers with). Plain canvas calls: it runs on the page, in a
// worker (OffscreenCanvas) and with any object that has the CanvasRenderingContext2D methods it uses. It
// imports nothing, so `florence2-wasm/client` and the main entry both export it without loading the wasm.

/** The default colours, one per instance in turn. */
export const DRAW_COLORS = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#46f0f0", "#f032e6", "#bcf60c"];

/** The 2D context of a canvas, an OffscreenCanvas or a context itself. */
function contextOf(target) {
  if (target && typeof target.getContext === "function") return target.getContext("2d");
  if (target && typeof target.strokeRect === "function") return target;
  const e = new TypeError("drawResult: expected a canvas, an OffscreenCanvas or a 2D context");
  e.name = "Florence2InputError";
  throw e;
}

/** The task's value: a `runTask` result (`{task, result: {[task]: value}}`), its `result` map, or the
 * value (`{bboxes, labels}`, `{quad_boxes, labels}`, `{polygons, labels}`, ...) itself. */
function valueOf(output) {
  if (!output || typeof output !== "object") return null;
  if (output.result && typeof output.result === "object") return valueOf(output.result);
  const keys = Object.keys(output);
  if (keys.length === 1 && /^<[A-Z_]+>$/.test(keys[0])) return output[keys[0]];
  return output;
}

const finite = (...xs) => xs.every((x) => typeof x === "number" && Number.isFinite(x));

/** `[x0, y0, x1, y1, ...]` as canvas points, or null when fewer than `min` points are finite pairs. */
function points(flat, k, min) {
  if (!Array.isArray(flat)) return null;
  const pts = [];
  for (let i = 0; i + 1 < flat.length; i += 2) {
    if (finite(flat[i], flat[i + 1])) pts.push([flat[i] * k, flat[i + 1] * k]);
  }
  return pts.length >= min ? pts : null;
}

/**
 * Draws `output` (a `runTask` result or its task's value) on `target`, whose pixels show the image at
 * `scale` canvas pixels per image pixel (default: `canvas.width / imageWidth` when `imageWidth` is given,
 * else 1). Returns how many instances it drew. Coordinates that are not finite numbers are skipped.
 * Options: `scale`, `imageWidth`, `colors` (default DRAW_COLORS), `lineWidth` (2.5), `fontSize` (13),
 * `font` (a CSS family, "system-ui, sans-serif"), `labels` (true: draw the labels), `fillAlpha` (0.33: the
 * polygons' fill opacity; 0 for none), `clear` (false: clear the canvas first).
 */
export function drawResult(target, output, options = {}) {
  const ctx = contextOf(target);
  const o = options ?? {};
  const canvas = ctx.canvas;
  const k = finite(o.scale) ? o.scale : finite(o.imageWidth) && o.imageWidth > 0 && canvas ? canvas.width / o.imageWidth : 1;
  const colors = Array.isArray(o.colors) && o.colors.length > 0 ? o.colors : DRAW_COLORS;
  const lineWidth = finite(o.lineWidth) ? o.lineWidth : 2.5;
  const fontSize = finite(o.fontSize) ? o.fontSize : 13;
  const family = typeof o.font === "string" ? o.font : "system-ui, sans-serif";
  const fillAlpha = finite(o.fillAlpha) ? Math.min(1, Math.max(0, o.fillAlpha)) : 0.33;
  const withLabels = o.labels !== false;
  if (o.clear && canvas) ctx.clearRect(0, 0, canvas.width, canvas.height);
  const value = valueOf(output);
  if (!value || typeof value !== "object") return 0;
  ctx.save();
  ctx.lineJoin = "round";
  ctx.lineWidth = lineWidth;
  let shown = 0;
  const label = (text, x, y, color) => {
    if (!withLabels || typeof text !== "string" || text === "") return;
    ctx.font = `600 ${fontSize}px ${family}`;
    const w = ctx.measureText(text).width + fontSize * 0.6;
    const h = fontSize * 1.35;
    const ty = y - h < 0 ? y : y - h;
    const maxX = canvas ? Math.max(0, canvas.width - w) : Infinity;
    const tx = Math.min(Math.max(0, x), maxX);
    ctx.fillStyle = color;
    ctx.fillRect(tx, ty, w, h);
    ctx.fillStyle = "#fff";
    ctx.fillText(text, tx + fontSize * 0.3, ty + fontSize * 1.05);
  };
  const path = (pts, color, fill) => {
    ctx.beginPath();
    ctx.moveTo(pts[0][0], pts[0][1]);
    for (const [x, y] of pts.slice(1)) ctx.lineTo(x, y);
    ctx.closePath();
    if (fill && fillAlpha > 0) {
      ctx.globalAlpha = fillAlpha;
      ctx.fillStyle = color;
      ctx.fill();
      ctx.globalAlpha = 1;
    }
    ctx.strokeStyle = color;
    ctx.stroke();
  };
  const labelsOf = (...lists) => lists.find(Array.isArray) ?? [];
  if (Array.isArray(value.bboxes)) {
    const labels = labelsOf(value.labels, value.bboxes_labels);
    value.bboxes.forEach((b, i) => {
      if (!Array.isArray(b) || !finite(b[0], b[1], b[2], b[3])) return;
      const color = colors[i % colors.length];
      ctx.strokeStyle = color;
      ctx.strokeRect(b[0] * k, b[1] * k, (b[2] - b[0]) * k, (b[3] - b[1]) * k);
      label(labels[i], b[0] * k, b[1] * k, color);
      shown++;
    });
  }
  if (Array.isArray(value.quad_boxes)) {
    const labels = labelsOf(value.labels);
    value.quad_boxes.forEach((q, i) => {
      const pts = points(q, k, 3);
      if (!pts) return;
      const color = colors[i % colors.length];
      path(pts, color, false);
      label(labels[i], pts[0][0], pts[0][1], color);
      shown++;
    });
  }
  if (Array.isArray(value.polygons)) {
    const labels = labelsOf(value.labels, value.polygons_labels);
    value.polygons.forEach((inst, i) => {
      if (!Array.isArray(inst)) return;
      const color = colors[i % colors.length];
      const parts = inst.map((p) => points(p, k, 3)).filter(Boolean);
      if (parts.length === 0) return;
      for (const pts of parts) path(pts, color, true);
      label(labels[i], parts[0][0][0], parts[0][0][1], color);
      shown++;
    });
  }
  ctx.restore();
  return shown;
}

/** One pixel coordinate to its location bin, as the processor quantizes: `floor(coord / (size / 1000))`
 * in f32 arithmetic, clamped to 0..999 (NaN and a zero size give 0). */
function locBin(coord, size) {
  if (!(size > 0)) return 0;
  const perBin = Math.fround(size / 1000);
  const q = Math.floor(Math.fround(Math.fround(coord) / perBin));
  if (Number.isNaN(q) || q <= 0) return 0;
  return Math.min(q, 999);
}

/**
 * The region input of the region tasks (`<REGION_TO_DESCRIPTION>`, `<REGION_TO_CATEGORY>`,
 * `<REGION_TO_SEGMENTATION>`, `<REGION_TO_OCR>`) for a box `[x1, y1, x2, y2]` in the pixels of a
 * `width` x `height` image: `<loc_X1><loc_Y1><loc_X2><loc_Y2>`, each coordinate quantized as the
 * processor does (the corners are ordered first, so a box dragged from any corner gives the same region).
 */
export function regionTokens(box, width, height) {
  const [ax, ay, bx, by] = Array.isArray(box) ? box.map(Number) : [];
  const xs = [ax, bx].sort((p, q) => p - q);
  const ys = [ay, by].sort((p, q) => p - q);
  const bins = [locBin(xs[0], width), locBin(ys[0], height), locBin(xs[1], width), locBin(ys[1], height)];
  return bins.map((b) => `<loc_${b}>`).join("");
}
