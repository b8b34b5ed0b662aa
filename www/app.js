// The demo page: model URL + progress, image input (file, drop, paste, URL), task views (caption, OCR,
// detection), overlay drawing, answer/JSON/timings, cancel. The model itself runs in worker.js (the
// package's worker module), driven through the package's `Florence2Worker`.
//
// Automation hooks (for scripts and the end-to-end tests):
//   ?model=URL|org/name|demo&image=URL&task=TASK&text=INPUT&autorun=1   [&beams=N] [&max=N] [&cache=0] [&all=1]
//   [&dtype=fp16|fp32|q8|q4] (resident weight format, default fp16; #memory then shows weights and peak)
//   [&sample=FILE] opens one of the demo model's sample scenes (and fills the task's phrase or region from it)
// loads the model, opens the image, runs the task and writes the output JSON into #result-json, whose
// data-status goes idle -> loading -> running -> "done" or "error" (data-error-name then says which error,
// e.g. Florence2LoadError, AbortError, WebGPUUnavailableError). With all=1 it then runs every task on the image
// ("Run every task": one image encoding for all of them) and writes the JSON array of {prompt, output} into
// #all-json, whose data-status goes running -> "done".

import { Florence2Worker, drawResult as drawOn, regionTokens } from "./pkg/client.js";

// A public Florence-2-base-ft conversion in safetensors (bf16, original names, channels-last convs: the
// package loads that layout). See README "Default model".
export const DEFAULT_MODEL = "https://huggingface.co/mlx-community/Florence-2-base-ft-bf16/resolve/main/";
// The project's own small trained model, served with the page (www/models/, made by
// scripts/training/train_demo_model.py): works offline; its held-out sample scenes and their targets sit beside it.
export const DEMO_MODEL_PATH = "models/florence2-shapes/";
const demoModelUrl = () => new URL(DEMO_MODEL_PATH, location.href).href;
/** `?model=` / the URL field: "demo" names the demo model, anything else is a URL or a hub id. */
function modelFromParam(v) {
  return v === "demo" ? demoModelUrl() : v;
}

const TASKS = {
  caption: [
    { task: "<CAPTION>", label: "Caption" },
    { task: "<DETAILED_CAPTION>", label: "Detailed caption" },
    { task: "<MORE_DETAILED_CAPTION>", label: "More detailed caption" },
  ],
  ocr: [
    { task: "<OCR>", label: "OCR (text only)" },
    { task: "<OCR_WITH_REGION>", label: "OCR with regions" },
  ],
  detection: [
    { task: "<OD>", label: "Object detection" },
    { task: "<DENSE_REGION_CAPTION>", label: "Dense region captions" },
    { task: "<REGION_PROPOSAL>", label: "Region proposals" },
    { task: "<CAPTION_TO_PHRASE_GROUNDING>", label: "Phrase grounding", input: "text", placeholder: "a red car and a dog" },
    { task: "<OPEN_VOCABULARY_DETECTION>", label: "Open-vocabulary detection", input: "text", placeholder: "a green car" },
    { task: "<REFERRING_EXPRESSION_SEGMENTATION>", label: "Referring segmentation", input: "text", placeholder: "the dog" },
    { task: "<REGION_TO_SEGMENTATION>", label: "Region to segmentation", input: "region" },
    { task: "<REGION_TO_CATEGORY>", label: "Region to category", input: "region" },
    { task: "<REGION_TO_DESCRIPTION>", label: "Region to description", input: "region" },
    { task: "<REGION_TO_OCR>", label: "Region to OCR", input: "region" },
  ],
};
const REGION_PLACEHOLDER = "<loc_100><loc_100><loc_900><loc_900>";
const COLORS = ["#ff3b30", "#34c759", "#0a84ff", "#ff9f0a", "#bf5af2", "#64d2ff", "#ffd60a", "#ff375f", "#30d158", "#5e5ce6"];

const $ = (id) => document.getElementById(id);
const el = {
  gpuBadge: $("gpu-badge"), gpuMessage: $("gpu-message"),
  modelForm: $("model-form"), modelUrl: $("model-url"), modelCache: $("model-cache"), loadModel: $("load-model"),
  modelDtype: $("model-dtype"), memory: $("memory"), modelPreset: $("model-preset"), modelNote: $("model-note"),
  samples: $("samples"), sampleList: $("sample-list"),
  progress: $("progress"), progressText: $("progress-text"), progressFiles: $("progress-files"),
  imageFile: $("image-file"), imageUrlForm: $("image-url-form"), imageUrl: $("image-url"),
  dropzone: $("dropzone"), stage: $("stage"), imageCanvas: $("image-canvas"), overlay: $("overlay"),
  dropHint: $("drop-hint"), imageInfo: $("image-info"),
  tabs: [...document.querySelectorAll(".tab")], taskForm: $("task-form"), task: $("task"),
  taskTextWrap: $("task-text-wrap"), taskTextLabel: $("task-text-label"), taskText: $("task-text"),
  beams: $("beams"), maxTokens: $("max-tokens"), run: $("run"), runAll: $("run-all"), cancel: $("cancel"), message: $("message"),
  allCard: $("all-card"), allTable: $("all-results"), allJson: $("all-json"),
  profile: $("profile"), profileDetails: $("profile-details"), profileSummary: $("profile-summary"), profileTable: $("profile-table"),
  stream: $("stream"), answer: $("answer"), ocrList: $("ocr-list"), timings: $("timings"), resultJson: $("result-json"),
};

const state = {
  gpu: null,          // probe result
  modelSource: null,  // URL of the loaded model
  modelDtype: null,   // its resident weight format
  image: null,        // {blob, bitmap, width, height, name, key}
  imageKey: 0,        // a new key per opened image: the worker reuses its encoding while the key stays
  stopAll: false,     // "run every task" was cancelled
  busy: null,         // {kind: "load"|"run", id}
  view: "detection",
  lastOutput: null,
  drawn: null,        // the task value drawn on the overlay (redrawn on resize)
  sample: null,       // the demo sample scene shown ({file, targets}), or null
  samples: [],        // the demo model's sample scenes (samples/targets.json)
};

// ---------------------------------------------------------------- the model's worker

// www/worker.js imports the package's worker module (florence2-wasm/worker); Florence2Worker drives it.
const worker = new Worker(new URL("./worker.js", import.meta.url), { type: "module" });
worker.addEventListener("error", (ev) => ev.preventDefault()); // the client rejects the pending calls
let model = null;    // the Florence2Worker of the loaded model
let encoding = null; // {key, handle}: the WorkerEncodedImage of the page's current image

// ---------------------------------------------------------------- status helpers

function setStatus(status, extra = {}) {
  el.resultJson.dataset.status = status;
  if (extra.errorName) el.resultJson.dataset.errorName = extra.errorName;
  else delete el.resultJson.dataset.errorName;
}

function showMessage(kind, text) {
  el.message.hidden = !text;
  el.message.className = `message ${kind}`;
  el.message.textContent = text || "";
}

function describeError(e, during) {
  if (e.name === "AbortError") return { kind: "warn", text: during === "load" ? "Model loading cancelled." : "Task cancelled." };
  if (during === "load") {
    return { kind: "error", text: `Model download failed (${e.name}): ${e.message}. Check the URL: it must be a directory with config.json, tokenizer.json and model.safetensors (or model.safetensors.index.json).` };
  }
  if (e.name === "Florence2PromptError") return { kind: "error", text: `Invalid prompt (${e.name}): ${e.message}` };
  return { kind: "error", text: `${e.name}: ${e.message}` };
}

function fail(e, during) {
  const d = describeError(e, during);
  showMessage(d.kind, d.text);
  el.resultJson.textContent = JSON.stringify({ error: { name: e.name, message: e.message, during } }, null, 2);
  setStatus("error", { errorName: e.name });
}

function updateButtons() {
  const busy = Boolean(state.busy);
  el.run.disabled = busy || !state.image;
  el.runAll.disabled = el.run.disabled;
  el.loadModel.disabled = busy;
  el.cancel.disabled = !busy;
}

// ---------------------------------------------------------------- WebGPU probe

async function probeGpu() {
  let r;
  try {
    r = await Florence2Worker.isSupported(worker);
  } catch (e) {
    r = { webgpu: false, reason: `${e.name}: ${e.message}`, adapter: null };
  }
  state.gpu = r;
  if (r.webgpu) {
    const a = r.adapter || {};
    el.gpuBadge.dataset.state = "ok";
    el.gpuBadge.textContent = `WebGPU: ${[a.vendor, a.architecture].filter(Boolean).join(" ") || "ready"}${a.isFallbackAdapter ? " (software)" : ""}`;
  } else {
    // The package's `device: "auto"` runs the model on its CPU backend (wasm) instead.
    el.gpuBadge.dataset.state = "missing";
    el.gpuBadge.textContent = "CPU (no WebGPU)";
    el.gpuMessage.hidden = false;
    el.gpuMessage.textContent = `WebGPU is unavailable: ${r.reason}. The model runs on the CPU instead (slower). ` +
      "For the GPU, use a recent Chrome, Edge or another Chromium-based browser (Safari/Firefox with WebGPU " +
      "enabled), and check that hardware acceleration is on (chrome://gpu).";
  }
  updateButtons();
  return r;
}

// ---------------------------------------------------------------- model loading + progress

/** The model source as typed: a hub model id ("org/name") is passed on as it is, a URL made absolute
 * against the page. The package resolves ids and hub page URLs (https://huggingface.co/ORG/NAME[/tree/REV])
 * into file URLs itself. */
export function normalizeModelUrl(raw) {
  const s = raw.trim();
  if (/^[A-Za-z0-9][\w.-]*\/[A-Za-z0-9_][\w.-]*$/.test(s) && !s.includes("..")) return s;
  return new URL(s, location.href).href;
}

const fmtBytes = (n) => (n >= 1e9 ? `${(n / 1e9).toFixed(2)} GB` : n >= 1e6 ? `${(n / 1e6).toFixed(1)} MB` : n >= 1e3 ? `${(n / 1e3).toFixed(1)} kB` : `${n} B`);

function makeProgressTracker() {
  const files = new Map(); // file -> {loaded, total, done, cached, li}
  el.progressFiles.replaceChildren();
  el.progress.value = 0;
  el.progress.removeAttribute("value"); // indeterminate until sizes arrive
  const entry = (name) => {
    let f = files.get(name);
    if (!f) {
      const li = document.createElement("li");
      f = { loaded: 0, total: 0, done: false, cached: false, li };
      files.set(name, f);
      el.progressFiles.append(li);
    }
    return f;
  };
  const render = (ready) => {
    let loaded = 0, total = 0, done = 0, cached = 0;
    for (const [name, f] of files) {
      loaded += f.loaded; total += f.total; done += f.done ? 1 : 0; cached += f.cached ? 1 : 0;
      f.li.textContent = `${name}: ${f.total ? `${fmtBytes(f.loaded)} / ${fmtBytes(f.total)}` : fmtBytes(f.loaded)}` +
        `${f.cached ? " (from cache)" : ""}${f.done ? " ✓" : ""}`;
      f.li.dataset.done = f.done; f.li.dataset.cached = f.cached;
    }
    if (total > 0) { el.progress.max = total; el.progress.value = Math.min(loaded, total); }
    if (ready) { el.progress.max = 1; el.progress.value = 1; }
    el.progressText.textContent = ready
      ? `model ready: ${files.size} files, ${fmtBytes(total || loaded)}${cached ? `, ${cached} from cache` : ""}`
      : `${fmtBytes(loaded)}${total ? ` / ${fmtBytes(total)} (${((100 * loaded) / total).toFixed(1)}%)` : ""} · ` +
        `files ${done}/${files.size}${cached ? ` · ${cached} from cache` : ""}`;
  };
  return {
    onProgress(ev) {
      const status = ev.status;
      if (status === "ready") { render(true); return; }
      if (!ev.file) return;
      const f = entry(ev.file);
      if (ev.cached === true || ev.fromCache === true || ev.source === "cache" || ev.cache === "hit") f.cached = true;
      if (typeof ev.total === "number" && ev.total > 0) f.total = ev.total;
      if (typeof ev.loaded === "number") f.loaded = ev.loaded;
      if (status === "done") { f.done = true; if (f.total) f.loaded = f.total; }
      render(false);
    },
    ready() { render(true); },
  };
}

async function loadModel() {
  let source;
  try {
    source = normalizeModelUrl(modelFromParam(el.modelUrl.value.trim()) || DEFAULT_MODEL);
  } catch (e) {
    const err = new Error(`not a URL: ${el.modelUrl.value}`); err.name = "Florence2LoadError";
    fail(err, "load");
    throw err;
  }
  state.modelSource = null;
  const dtype = selectedDtype();
  renderMemory(null);
  const tracker = makeProgressTracker();
  el.progressText.textContent = `connecting to ${source}…`;
  showMessage("info", "");
  setStatus("loading");
  const ctrl = new AbortController();
  state.busy = { kind: "load", ctrl };
  updateButtons();
  try {
    // The worker disposes the previous model (and its encodings) when it loads another.
    model = null;
    encoding = null;
    model = await Florence2Worker.load(worker, source, {
      cache: el.modelCache.checked, dtype, device: "auto", signal: ctrl.signal, onProgress: tracker.onProgress,
    });
    tracker.ready();
    state.modelSource = source;
    state.modelDtype = dtype;
    renderMemory(await model.memory());
    setStatus("idle");
  } catch (e) {
    el.progress.max = 1; el.progress.value = 0;
    el.progressText.textContent = e.name === "AbortError" ? "loading cancelled" : "loading failed";
    fail(e, "load");
    throw e;
  } finally {
    state.busy = null;
    updateButtons();
  }
}

// ---------------------------------------------------------------- GPU memory

function formatBytes(n) {
  if (typeof n !== "number" || !Number.isFinite(n)) return "?";
  return n >= 1e9 ? `${(n / 1e9).toFixed(2)} GB` : `${(n / 1e6).toFixed(1)} MB`;
}

function selectedDtype() {
  return el.modelDtype.value || "fp16";
}

/** The engine's GPU memory figures: `mem` is `model.memory()` (weights now, peak weights + activations
 * since the load, image encodings included), `task` the last result's `memory` (peak of that call). */
export function renderMemory(mem, task) {
  el.memory.hidden = !mem;
  if (!mem) { el.memory.textContent = ""; delete el.memory.dataset.peakBytes; return; }
  el.memory.dataset.dtype = mem.dtype ?? "";
  el.memory.dataset.weightsBytes = String(mem.weightsBytes);
  el.memory.dataset.peakBytes = String(mem.peakBytes);
  let text = `GPU memory (${mem.dtype ?? "?"} weights): weights ${formatBytes(mem.weightsBytes)}, ` +
    `peak since load ${formatBytes(mem.peakBytes)}`;
  if (task) text += `; last task peak ${formatBytes(task.peakBytes)} (activations ${formatBytes(task.peakActivationsBytes)})`;
  el.memory.textContent = text;
}

// ---------------------------------------------------------------- images

async function setImage(blob, name) {
  let bitmap;
  try {
    bitmap = await createImageBitmap(blob, { imageOrientation: "from-image" });
  } catch (e) {
    throw new Error(`${name || "the file"} is not an image this browser can decode (${blob.type || "unknown type"})`);
  }
  // The model gets the file itself: the package decodes it as the native CLI does, EXIF orientation
  // included, so the model sees the upright image the page shows.
  state.image = { blob, bitmap, width: bitmap.width, height: bitmap.height, name, key: ++state.imageKey };
  state.sample = null;
  const c = el.imageCanvas;
  c.width = bitmap.width; c.height = bitmap.height;
  c.getContext("2d").drawImage(bitmap, 0, 0);
  c.classList.toggle("pixelated", Math.max(bitmap.width, bitmap.height) < 400);
  el.stage.hidden = false;
  el.dropHint.hidden = true;
  el.stage.style.setProperty("--aspect", `${bitmap.width} / ${bitmap.height}`);
  el.stage.style.width = `min(100%, calc(70vh * ${bitmap.width / bitmap.height}))`;
  el.imageInfo.textContent = `${name || "image"} · ${bitmap.width} × ${bitmap.height}`;
  clearOverlay();
  updateButtons();
}

async function openImageUrl(raw) {
  const url = new URL(raw, location.href).href;
  let res;
  try {
    res = await fetch(url);
  } catch (e) {
    const hint = new URL(url).origin !== location.origin ? " (the server may not allow cross-origin requests: download the image and open the file instead)" : "";
    throw Object.assign(new Error(`could not fetch the image ${url}: ${e.message}${hint}`), { name: "ImageLoadError" });
  }
  if (!res.ok) throw Object.assign(new Error(`could not fetch the image ${url}: HTTP ${res.status}`), { name: "ImageLoadError" });
  const blob = await res.blob();
  await setImage(blob, url.split("/").pop() || url);
}

// ---------------------------------------------------------------- demo model + samples

/** Which preset the URL field names: the hub default, the demo model, or something else. */
function presetOf(url) {
  const v = url.trim();
  if (!v || v === DEFAULT_MODEL) return "hub";
  if (v === "demo") return "demo";
  try { if (new URL(v, location.href).href === demoModelUrl()) return "demo"; } catch (_) { /* not a URL */ }
  return "custom";
}

function syncPreset() {
  el.modelPreset.value = presetOf(el.modelUrl.value);
  el.modelNote.hidden = el.modelPreset.value !== "demo";
}

function onPresetChange() {
  const p = el.modelPreset.value;
  if (p === "hub") el.modelUrl.value = DEFAULT_MODEL;
  else if (p === "demo") el.modelUrl.value = demoModelUrl();
  else { el.modelUrl.value = ""; el.modelUrl.focus(); }
  syncPreset();
}

/** The demo model's held-out samples as thumbnails; hidden when the page is served without them. */
async function loadSamples() {
  let list;
  try {
    const res = await fetch(new URL(`${DEMO_MODEL_PATH}samples/targets.json`, location.href));
    if (!res.ok) return;
    list = await res.json();
  } catch (_) { return; }
  if (!Array.isArray(list) || list.length === 0) return;
  state.samples = list;
  el.sampleList.replaceChildren(...list.map((s) => {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "sample";
    b.dataset.file = s.file;
    const words = s.targets?.["<OCR>"]?.target ?? "";
    b.title = `${s.file}${words ? `: "${words}"` : ""}`;
    const img = document.createElement("img");
    img.src = new URL(`${DEMO_MODEL_PATH}samples/${s.file}`, location.href).href;
    img.alt = b.title;
    img.width = 64; img.height = 64;
    b.append(img);
    b.addEventListener("click", () => openSample(s).catch(imageError));
    return b;
  }));
  el.samples.hidden = false;
}

async function openSample(s) {
  await openImageUrl(new URL(`${DEMO_MODEL_PATH}samples/${s.file}`, location.href).href);
  state.sample = s;
  fillSampleInput();
}

/** With a sample open, a task that takes an input gets the sample's own (its phrase or region). */
function fillSampleInput() {
  const t = state.sample?.targets?.[el.task.value];
  if (t && taskInfo(el.task.value)?.input) el.taskText.value = t.text_input;
}

function imageError(e) {
  showMessage("error", `Could not open the image: ${e.message}`);
}

// ---------------------------------------------------------------- drawing

function clearOverlay() {
  const o = el.overlay;
  state.drawn = null;
  if (!state.image) return;
  // The overlay is drawn at a fixed resolution (longest side 1200 px) whatever the image size, so lines and
  // labels stay legible on tiny and huge images alike. data-scale maps image pixels to overlay pixels.
  const k = 1200 / Math.max(state.image.width, state.image.height);
  o.width = Math.round(state.image.width * k);
  o.height = Math.round(state.image.height * k);
  o.dataset.scale = String(k);
  o.dataset.imageWidth = String(state.image.width);
  o.dataset.imageHeight = String(state.image.height);
  o.getContext("2d").clearRect(0, 0, o.width, o.height);
}

/** Draw a task result ({bboxes, labels} / {quad_boxes, labels} / {polygons, labels} / OVD) on the overlay
 * with the package's drawResult; returns how many shapes it drew. */
export function drawResult(value) {
  clearOverlay();
  state.drawn = value;
  if (!value || typeof value !== "object") return 0;
  const k = Number(el.overlay.dataset.scale);
  // Overlay pixels per CSS pixel: lines and labels keep the same on-screen size whatever the image size.
  const shown = el.overlay.getBoundingClientRect().width;
  const unit = shown > 0 ? el.overlay.width / shown : 1;
  return drawOn(el.overlay, value, { scale: k, colors: COLORS, lineWidth: 2.5 * unit, fontSize: 13 * unit });
}

// ---------------------------------------------------------------- region drag

/** The image pixel under a pointer event (clamped to the image). */
function imagePoint(e) {
  const r = el.overlay.getBoundingClientRect();
  const { width, height } = state.image;
  const fx = r.width > 0 ? (e.clientX - r.left) / r.width : 0;
  const fy = r.height > 0 ? (e.clientY - r.top) / r.height : 0;
  return [Math.min(Math.max(fx, 0), 1) * width, Math.min(Math.max(fy, 0), 1) * height];
}

/** For the region tasks: a rectangle dragged on the image (mouse, pen or touch) becomes the task's
 * `<loc_..>` input, quantized as the processor does (the package's regionTokens); the field stays
 * editable. #stage's data-region holds the last dragged region (a hook for the tests). */
function wireRegionDrag() {
  let start = null;
  const regionTask = () => taskInfo(el.task.value)?.input === "region";
  const boxTo = (e) => [...start, ...imagePoint(e)];
  const show = (box) => {
    clearOverlay();
    const shown = el.overlay.getBoundingClientRect().width;
    const unit = shown > 0 ? el.overlay.width / shown : 1;
    drawOn(el.overlay, { bboxes: [box], labels: ["region"] },
      { scale: Number(el.overlay.dataset.scale), lineWidth: 2.5 * unit, fontSize: 13 * unit });
  };
  el.stage.addEventListener("pointerdown", (e) => {
    if (!state.image || !regionTask() || e.button !== 0) return;
    start = imagePoint(e);
    el.stage.setPointerCapture(e.pointerId);
    e.preventDefault();
  });
  el.stage.addEventListener("pointermove", (e) => { if (start) show(boxTo(e)); });
  const finish = (e) => {
    if (!start) return;
    const box = boxTo(e);
    start = null;
    if (Math.abs(box[2] - box[0]) < 1 || Math.abs(box[3] - box[1]) < 1) { clearOverlay(); return; }
    show(box);
    const tokens = regionTokens(box, state.image.width, state.image.height);
    el.taskText.value = tokens;
    el.stage.dataset.region = tokens;
  };
  el.stage.addEventListener("pointerup", finish);
  el.stage.addEventListener("pointercancel", () => { start = null; clearOverlay(); });
}

// ---------------------------------------------------------------- views + tasks

function taskInfo(task) {
  for (const list of Object.values(TASKS)) for (const t of list) if (t.task === task) return t;
  return null;
}

function viewOf(task) {
  for (const [view, list] of Object.entries(TASKS)) if (list.some((t) => t.task === task)) return view;
  return null;
}

function setView(view, task) {
  state.view = view;
  for (const t of el.tabs) t.setAttribute("aria-selected", String(t.dataset.view === view));
  el.task.replaceChildren(...TASKS[view].map((t) => new Option(`${t.label}  ${t.task}`, t.task)));
  if (task) el.task.value = task;
  onTaskChange();
}

function onTaskChange() {
  const info = taskInfo(el.task.value);
  const input = info?.input;
  el.taskTextWrap.hidden = !input;
  el.taskText.placeholder = input === "region" ? REGION_PLACEHOLDER : info?.placeholder ?? "";
  el.taskTextLabel.textContent = input === "region"
    ? "Region: drag a rectangle on the image, or type four <loc_N> tokens (N in 0..999)" : "Text input";
  el.stage.classList.toggle("region-drag", input === "region");
  fillSampleInput();
}

// ---------------------------------------------------------------- running

function renderOutput(out, wallMs, enc) {
  state.lastOutput = out;
  el.answer.textContent = out.text ?? "";
  el.answer.dataset.state = "done";
  const value = out.result?.[out.task];
  // OCR view: the text lines as a list.
  el.ocrList.replaceChildren();
  const lines = Array.isArray(value?.quad_boxes) ? value.labels : out.task === "<OCR>" && typeof value === "string" ? value.split("\n") : null;
  el.ocrList.hidden = !lines;
  if (lines) {
    lines.forEach((l, i) => {
      const li = document.createElement("li");
      li.textContent = l;
      li.style.setProperty("--swatch", COLORS[i % COLORS.length]);
      el.ocrList.append(li);
    });
  }
  const shapes = drawResult(value);
  el.overlay.dataset.shapes = String(shapes);
  const rows = Object.entries(out.timings || {}).map(([k, v]) => [k, typeof v === "number" ? `${v.toFixed(1)} ms` : String(v)]);
  if (enc) rows.push(["image encoding", enc.reused ? "reused (vision tower skipped)" : `${enc.encodeMs.toFixed(1)} ms`]);
  if (typeof wallMs === "number") rows.push(["round trip (worker)", `${wallMs.toFixed(1)} ms`]);
  if (Array.isArray(out.tokenIds)) rows.push(["tokens", String(out.tokenIds.length)]);
  el.timings.tBodies[0].replaceChildren(...rows.map(([k, v]) => {
    const tr = document.createElement("tr");
    const th = document.createElement("th"); th.textContent = k;
    const td = document.createElement("td"); td.textContent = v;
    tr.append(th, td);
    return tr;
  }));
  el.timings.hidden = rows.length === 0;
  renderProfile(out.profile);
  el.resultJson.textContent = prettyJson(out);
}

/** The `profile: true` answer: GPU ms per phase, then the costliest (op, variant, shape) groups; or why
 * there are no GPU times on this adapter. Hidden when the run was not profiled. */
export function renderProfile(profile) {
  el.profileDetails.hidden = !profile;
  if (!profile) return;
  const body = el.profileTable.tBodies[0];
  if (!profile.available) {
    el.profileSummary.textContent = `GPU times unavailable: ${profile.reason}`;
    body.replaceChildren();
    return;
  }
  const phases = profile.phases.map((p) => `${p.phase} ${p.ms.toFixed(1)} ms (${p.dispatches} dispatches)`);
  el.profileSummary.textContent = `GPU ${profile.totalMs.toFixed(1)} ms: ${phases.join(", ")}` +
    (profile.untimed ? `; ${profile.untimed} dispatches untimed` : "");
  const groups = new Map();
  for (const e of profile.entries) {
    const key = `${e.phase}\u0000${e.op}\u0000${e.variant}\u0000${e.shape}`;
    const g = groups.get(key) ?? { ...e, ms: 0, calls: 0 };
    g.ms += e.ms; g.calls += 1;
    groups.set(key, g);
  }
  const top = [...groups.values()].sort((a, b) => b.ms - a.ms).slice(0, 12);
  body.replaceChildren(...top.map((g) => {
    const tr = document.createElement("tr");
    const th = document.createElement("th");
    th.textContent = `${g.phase} ${g.op}${g.variant ? ` [${g.variant}]` : ""} ${g.shape}`;
    const td = document.createElement("td");
    td.textContent = `${g.ms.toFixed(2)} ms (${g.calls}x)`;
    tr.append(th, td);
    return tr;
  }));
}

/** JSON with 2-space indentation, but arrays of numbers (boxes, token ids) on one line. */
function prettyJson(v) {
  return JSON.stringify(v, null, 2).replace(/\[\s*(-?[\d.e+-]+(?:,\s*-?[\d.e+-]+)*)\s*\]/g, (_, inner) => `[${inner.split(/,\s*/).join(", ")}]`);
}

/** Load the model when the URL field names another one; false when that failed. */
async function ensureModel() {
  let wanted = null;
  try { wanted = normalizeModelUrl(modelFromParam(el.modelUrl.value.trim()) || DEFAULT_MODEL); } catch (_) { /* loadModel reports it */ }
  if (!state.modelSource || state.modelSource !== wanted || state.modelDtype !== selectedDtype()) {
    try { await loadModel(); } catch (_) { return false; }
  }
  return true;
}

/** Decoding options from the form. */
function decodingOptions() {
  const options = {};
  const beams = Number(el.beams.value);
  if (beams > 0) options.numBeams = beams; // empty: the model's generation_config (Florence-2: 3 beams)
  const maxNew = Number(el.maxTokens.value);
  if (maxNew > 0) options.maxNewTokens = maxNew;
  if (el.profile?.checked) options.profile = true;
  return options;
}

/** One run in the worker on the current image: its encoding (`encodeImage`) is made once per image and
 * reused while the image stays, so only the first task on an image runs the vision tower. */
function runRequest(prompt, options, onToken) {
  const ctrl = new AbortController();
  const promise = (async () => {
    const t0 = performance.now();
    const reused = encoding !== null && encoding.key === state.image.key;
    let encodeMs = 0;
    if (!reused) {
      encoding?.handle.dispose().catch(() => {});
      encoding = null;
      const handle = await model.encodeImage(state.image.blob, { signal: ctrl.signal });
      encoding = { key: state.image.key, handle };
      encodeMs = performance.now() - t0;
    }
    const output = await model.runTask(encoding.handle, prompt, { ...options, signal: ctrl.signal, onToken });
    const wallMs = performance.now() - t0;
    return { output, wallMs, reused, encodeMs, memory: await model.memory() };
  })();
  return { ctrl, promise };
}

/** Every task of the page on the current image, one after the other (the image is encoded once); inputs
 * of the tasks that need one are their placeholders. Results go to #all-results and #all-json. */
export const ALL_TASKS = Object.values(TASKS).flat().map((t) => ({
  task: t.task,
  text: t.input === "region" ? REGION_PLACEHOLDER : t.input ? t.placeholder : "",
}));

async function runAllTasks() {
  if (!state.image) { showMessage("error", "Open an image first."); return; }
  if (!(await ensureModel())) return;
  const options = decodingOptions();
  const outputs = [];
  state.stopAll = false;
  el.allCard.hidden = false;
  el.allTable.tBodies[0].replaceChildren();
  el.allJson.textContent = "";
  el.allJson.dataset.status = "running";
  showMessage("info", `Running ${ALL_TASKS.length} tasks on the image…`);
  for (const { task, text } of ALL_TASKS) {
    if (state.stopAll) break;
    const tr = document.createElement("tr");
    const th = document.createElement("th"); th.textContent = task + (text ? ` ${text}` : "");
    const answer = document.createElement("td"); answer.textContent = "…";
    const ms = document.createElement("td");
    tr.append(th, answer, ms);
    el.allTable.tBodies[0].append(tr);
    const { ctrl, promise } = runRequest(task + text, options, () => {});
    state.busy = { kind: "run", ctrl };
    updateButtons();
    try {
      const { output, wallMs, reused, encodeMs } = await promise;
      outputs.push({ prompt: task + text, output });
      answer.textContent = output.text || "(empty)";
      ms.textContent = `${wallMs.toFixed(0)} ms${reused ? "" : ` (incl. encoding ${encodeMs.toFixed(0)} ms)`}`;
      tr.addEventListener("click", () => renderOutput(output, wallMs, { reused, encodeMs }));
    } catch (e) {
      answer.textContent = `${e.name}: ${e.message}`;
      outputs.push({ prompt: task + text, error: { name: e.name, message: e.message } });
      if (e.name === "AbortError") state.stopAll = true;
    } finally {
      state.busy = null;
      updateButtons();
    }
  }
  el.allJson.textContent = JSON.stringify(outputs, null, 2);
  el.allJson.dataset.status = state.stopAll ? "cancelled" : "done";
  showMessage(state.stopAll ? "warn" : "info", state.stopAll ? "Stopped." : `${outputs.length} tasks done (click a row to show it).`);
}

async function runTask() {
  if (!state.image) { showMessage("error", "Open an image first."); return; }
  const task = el.task.value;
  const info = taskInfo(task);
  const text = info?.input ? el.taskText.value.trim() : "";
  if (info?.input && !text) {
    showMessage("error", `${task} needs ${info.input === "region" ? "a region" : "a text input"}.`);
    el.taskText.focus();
    return;
  }
  if (!(await ensureModel())) return;
  const prompt = task + text;
  const options = decodingOptions();
  showMessage("info", "");
  el.stream.textContent = "";
  el.answer.textContent = "";
  delete el.answer.dataset.state;
  clearOverlay();
  setStatus("running");
  const { ctrl, promise } = runRequest(prompt, options, (t) => { el.stream.textContent += t; });
  state.busy = { kind: "run", ctrl };
  updateButtons();
  try {
    const { output, wallMs, reused, encodeMs, memory } = await promise;
    renderOutput(output, wallMs, { reused, encodeMs });
    renderMemory(memory, output.memory);
    setStatus("done");
  } catch (e) {
    fail(e, "run");
  } finally {
    state.busy = null;
    updateButtons();
  }
}

function cancel() {
  if (!state.busy) return;
  state.stopAll = true;
  state.busy.ctrl.abort();
  showMessage("warn", "Cancelling…");
}

// ---------------------------------------------------------------- wiring

function wire() {
  el.modelForm.addEventListener("submit", (e) => { e.preventDefault(); loadModel().catch(() => {}); });
  el.taskForm.addEventListener("submit", (e) => { e.preventDefault(); runTask(); });
  el.cancel.addEventListener("click", cancel);
  el.runAll.addEventListener("click", () => { runAllTasks(); });
  el.task.addEventListener("change", onTaskChange);
  wireRegionDrag();
  el.modelPreset.addEventListener("change", onPresetChange);
  el.modelUrl.addEventListener("input", syncPreset);
  for (const t of el.tabs) t.addEventListener("click", () => setView(t.dataset.view));
  el.imageFile.addEventListener("change", () => {
    const f = el.imageFile.files?.[0];
    if (f) setImage(f, f.name).catch(imageError);
  });
  el.imageUrlForm.addEventListener("submit", (e) => {
    e.preventDefault();
    if (el.imageUrl.value) openImageUrl(el.imageUrl.value).catch(imageError);
  });
  // Drops anywhere on the page open the image (instead of the browser navigating to the file).
  for (const ev of ["dragenter", "dragover"]) {
    document.addEventListener(ev, (e) => { e.preventDefault(); el.dropzone.classList.add("over"); });
  }
  for (const ev of ["dragleave", "drop"]) document.addEventListener(ev, () => el.dropzone.classList.remove("over"));
  document.addEventListener("drop", (e) => {
    e.preventDefault();
    const f = [...(e.dataTransfer?.files || [])].find((x) => x.type.startsWith("image/"));
    if (f) { setImage(f, f.name).catch(imageError); return; }
    const url = e.dataTransfer?.getData("text/uri-list") || e.dataTransfer?.getData("text/plain");
    if (url) openImageUrl(url.split("\n")[0].trim()).catch(imageError);
  });
  document.addEventListener("paste", (e) => {
    if (e.target instanceof HTMLInputElement) return; // pasting a URL into a field
    const item = [...(e.clipboardData?.items || [])].find((i) => i.kind === "file" && i.type.startsWith("image/"));
    const f = item?.getAsFile();
    if (f) { e.preventDefault(); setImage(f, "pasted image").catch(imageError); }
  });
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") cancel(); });
  // Redraw the overlay when its on-screen size changes (line widths are in screen pixels).
  let lastWidth = 0;
  new ResizeObserver(() => {
    const w = el.overlay.getBoundingClientRect().width;
    if (state.drawn && Math.abs(w - lastWidth) > 1) { lastWidth = w; el.overlay.dataset.shapes = String(drawResult(state.drawn)); }
  }).observe(el.stage);
}

async function main() {
  const params = new URLSearchParams(location.search);
  el.modelUrl.value = modelFromParam(params.get("model") || DEFAULT_MODEL);
  syncPreset();
  if (params.get("cache") === "0") el.modelCache.checked = false;
  if (params.get("dtype")) el.modelDtype.value = params.get("dtype");
  if (params.get("beams")) {
    const b = params.get("beams");
    if (![...el.beams.options].some((o) => o.value === b)) el.beams.append(new Option(`${b} beams`, b));
    el.beams.value = b;
  }
  if (params.get("max")) el.maxTokens.value = params.get("max");
  let task = params.get("task");
  if (task && !task.startsWith("<")) task = `<${task}>`;
  if (task) task = task.toUpperCase();
  const view = (task && viewOf(task)) || "detection";
  setView(view, task && viewOf(task) ? task : undefined);
  if (params.get("text")) el.taskText.value = params.get("text");
  wire();
  updateButtons();

  const samples = loadSamples();
  await probeGpu();
  await samples;
  if (params.get("sample")) {
    const s = state.samples.find((x) => x.file === params.get("sample"));
    try {
      if (!s) throw Object.assign(new Error(`no sample scene ${params.get("sample")}`), { name: "ImageLoadError" });
      await openSample(s);
      if (params.get("text")) el.taskText.value = params.get("text");
    } catch (e) { imageError(e); if (params.get("autorun") === "1") fail(e, "image"); return; }
  }
  if (params.get("image")) {
    try { await openImageUrl(params.get("image")); } catch (e) { imageError(e); if (params.get("autorun") === "1") fail(e, "image"); return; }
  }
  if (params.get("autorun") !== "1") return;
  if (task && !taskInfo(task)) {
    const e = new Error(`unknown task ${task}`); e.name = "Florence2PromptError";
    fail(e, "run");
    return;
  }
  try { await loadModel(); } catch (_) { return; }
  if (state.image) await runTask();
  if (state.image && params.get("all") === "1" && el.resultJson.dataset.status === "done") await runAllTasks();
}

main();
