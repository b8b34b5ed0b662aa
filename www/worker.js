// The model's thread. A dedicated module worker owns the florence2-wasm package (WebGPU works in workers),
// so loading hundreds of MB of weights and decoding tokens never freezes the page.
//
// Protocol (every message carries the request `id` it answers):
//   page -> worker  {type: "probe"}                               -> {type: "probe", ok, reason, adapter}
//                   {type: "load", id, source, cache, dtype}      -> {type: "progress", id, event}*,
//                                                                    {type: "loaded", id, memory} | {type: "error", id, error}
//                   {type: "run", id, image, imageKey, prompt, options}
//                                                                 -> {type: "token", id, text}*,
//                                                                    {type: "result", id, output, wallMs, reused, encodeMs, memory}
//                                                                    | {type: "error", id, error}
//                   {type: "cancel", id}                          (aborts that request's AbortSignal)
// Errors travel as {name, message} (structured cloning would lose the package's error names).
//
// Image encoding reuse: the worker keeps the EncodedImage (`model.encodeImage`) of the last image, keyed by
// the page's `imageKey` (a new key per opened image). A run with the same key (only the task, text or
// decoding changed) skips the vision tower; `reused` says so and `encodeMs` is the encoding's time otherwise.

let pkg = null;   // the imported package module, after init()
let model = null; // the loaded Florence2 instance
const controllers = new Map(); // request id -> AbortController
let encoded = null; // {key, img}: the EncodedImage of the page's current image

function dropEncoding() {
  if (!encoded) return;
  try { encoded.img.dispose(); } catch (_) { /* already released */ }
  encoded = null;
}

async function ensurePackage() {
  if (pkg) return pkg;
  let mod;
  try {
    // Relative to this file: /pkg/florence2_wasm.js when the demo is served at /.
    mod = await import(new URL("./pkg/florence2_wasm.js", import.meta.url).href);
  } catch (e) {
    const err = new Error(`could not import the florence2-wasm package (is pkg/ built? scripts/build.sh): ${e.message}`);
    err.name = "PackageMissingError";
    throw err;
  }
  await mod.default();
  pkg = mod;
  return pkg;
}

// Plain, cloneable, JSON-friendly copies: Maps (serde-wasm-bindgen's default for maps) become objects,
// typed arrays and BigInts become arrays and numbers.
function toPlain(v) {
  if (v === null || v === undefined) return v;
  if (typeof v === "bigint") return Number(v);
  if (typeof v !== "object") return v;
  if (v instanceof Map) {
    const o = {};
    for (const [k, val] of v) o[String(k)] = toPlain(val);
    return o;
  }
  if (ArrayBuffer.isView(v)) return Array.from(v, (x) => (typeof x === "bigint" ? Number(x) : x));
  if (Array.isArray(v)) return v.map(toPlain);
  const o = {};
  for (const k of Object.keys(v)) o[k] = toPlain(v[k]);
  return o;
}

function errorInfo(e) {
  if (e && typeof e === "object") {
    return { name: String(e.name || "Error"), message: String(e.message || e) };
  }
  return { name: "Error", message: String(e) };
}

async function probe() {
  if (!("gpu" in navigator) || !navigator.gpu) {
    return { ok: false, reason: "no-api", message: "This browser has no WebGPU (navigator.gpu is missing)." };
  }
  let adapter = null;
  try {
    adapter = await navigator.gpu.requestAdapter();
  } catch (e) {
    return { ok: false, reason: "no-adapter", message: `WebGPU could not provide an adapter: ${e.message}` };
  }
  if (!adapter) {
    return { ok: false, reason: "no-adapter", message: "navigator.gpu exists but no GPU adapter is available (GPU blocklisted, disabled, or absent)." };
  }
  const info = adapter.info || {};
  return {
    ok: true,
    adapter: {
      vendor: info.vendor || "", architecture: info.architecture || "", description: info.description || "",
      fallback: Boolean(info.isFallbackAdapter ?? adapter.isFallbackAdapter),
    },
  };
}

// Every image goes to the package as it is: it decodes any Blob the browser can (WebP, GIF, AVIF, BMP
// included), applies EXIF orientation, and takes bitmaps, URLs and video frames.
async function toModelImage(image) {
  return image;
}

async function handle(msg) {
  const { type, id } = msg;
  if (type === "probe") {
    postMessage({ type: "probe", id, ...(await probe()) });
    return;
  }
  if (type === "cancel") {
    controllers.get(msg.target)?.abort();
    return;
  }
  const ctrl = new AbortController();
  controllers.set(id, ctrl);
  try {
    if (type === "load") {
      const { Florence2 } = await ensurePackage();
      dropEncoding();
      if (model) {
        try { model.dispose(); } catch (_) { /* already released */ }
        model = null;
      }
      model = await Florence2.load(msg.source, {
        cache: msg.cache !== false,
        dtype: msg.dtype || "fp16",
        device: msg.device || "auto",
        signal: ctrl.signal,
        onProgress: (event) => postMessage({ type: "progress", id, event: toPlain(event) }),
      });
      postMessage({ type: "loaded", id, memory: toPlain(model.memory()) });
    } else if (type === "run") {
      if (!model) {
        const err = new Error("no model loaded");
        err.name = "NoModelError";
        throw err;
      }
      const options = { signal: ctrl.signal, onToken: (text) => postMessage({ type: "token", id, text: String(text) }) };
      if (msg.options?.maxNewTokens) options.maxNewTokens = msg.options.maxNewTokens;
      if (msg.options?.numBeams) options.numBeams = msg.options.numBeams;
      if (msg.options?.profile) options.profile = true;
      const t0 = performance.now();
      const reused = msg.imageKey != null && encoded?.key === msg.imageKey;
      let encodeMs = 0;
      if (!reused) {
        dropEncoding();
        const img = await model.encodeImage(await toModelImage(msg.image), { signal: ctrl.signal });
        encoded = { key: msg.imageKey, img };
        encodeMs = performance.now() - t0;
      }
      const out = await model.runTask(encoded.img, msg.prompt, options);
      postMessage({ type: "result", id, output: toPlain(out), wallMs: performance.now() - t0, reused, encodeMs, memory: toPlain(model.memory()) });
    } else {
      throw new Error(`unknown message ${type}`);
    }
  } catch (e) {
    postMessage({ type: "error", id, error: errorInfo(e) });
  } finally {
    controllers.delete(id);
  }
}

self.onmessage = (ev) => {
  handle(ev.data).catch((e) => postMessage({ type: "error", id: ev.data?.id, error: errorInfo(e) }));
};
