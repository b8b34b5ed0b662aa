// florence2-wasm/worker: runs the model inside a Web Worker, driven by `Florence2Worker` (client.js) on
// the page. A module worker that imports this file serves requests:
//
//   // model-worker.js
//   import "florence2-wasm/worker";
//
//   // page
//   import { Florence2Worker } from "florence2-wasm";
//   const worker = new Worker(new URL("./model-worker.js", import.meta.url), { type: "module" });
//   const model = await Florence2Worker.load(worker, "microsoft/Florence-2-base-ft", { onProgress });
//   const out = await model.runTask(blob, "<OD>");
//
// Protocol (every message carries the request id it answers; errors travel as {name, message} because
// structured cloning would drop the package's error names; `state` is {adapterInfo, tuningTable}):
//   {type: "supported", id}                          -> {type: "result", id, value: SupportInfo}
//   {type: "estimate", id, source, options}          -> {type: "progress", id, event}*, {type: "result", id, value: MemoryEstimate}
//   {type: "load", id, source, options}              -> {type: "progress", id, event}*, {type: "result", id, state}
//   {type: "encode", id, image, options}             -> {type: "result", id, value: {encodingId, width, height}}
//   {type: "release", id, encodingId}                -> {type: "result", id}
//   {type: "run", id, image | encodingId, prompt, options, tokens}
//                                                    -> {type: "token", id, text, tokenId}*, {type: "result", id, value, state}
//   {type: "memory", id}                             -> {type: "result", id, value: MemoryInfo}
//   {type: "reload", id}                             -> {type: "progress", id, event}*, {type: "result", id, state}
//   {type: "cacheInfo" | "clearCache", id, source, options}          -> {type: "result", id, value}
//   {type: "dispose", id}                            -> {type: "result", id}
//   {type: "cancel", target}                         aborts request `target`
//   any failure                                      -> {type: "error", id, error: {name, message}}
import { Florence2 } from "./index.js";

const MARK = "florence2-wasm";

function named(name, message) {
  const e = new Error(message);
  e.name = name;
  return e;
}

/** Serve the protocol on `scope` (default: this worker's global scope). Called on import in a worker. */
export function expose(scope = globalThis) {
  let model = null;
  const encodings = new Map(); // encodingId -> EncodedImage made by this worker's model
  const controllers = new Map();
  const post = (m) => scope.postMessage({ ...m, [MARK]: true });
  const errorInfo = (e) =>
    e && typeof e === "object"
      ? { name: String(e.name || "Error"), message: String(e.message || e) }
      : { name: "Error", message: String(e) };
  const modelState = () => ({ adapterInfo: model.adapterInfo, tuningTable: model.tuningTable });
  const current = () => {
    if (!model) throw named("Florence2DisposedError", "no model is loaded in this worker (call Florence2Worker.load first)");
    return model;
  };
  const release = () => {
    for (const img of encodings.values()) img.dispose();
    encodings.clear();
    if (model) model.dispose();
    model = null;
  };

  async function handle(msg) {
    const { type, id } = msg;
    if (type === "cancel") {
      controllers.get(msg.target)?.abort();
      return;
    }
    const ctrl = new AbortController();
    controllers.set(id, ctrl);
    try {
      if (type === "supported") {
        post({ type: "result", id, value: await Florence2.isSupported() });
      } else if (type === "estimate") {
        const value = await Florence2.estimate(msg.source, {
          ...msg.options,
          signal: ctrl.signal,
          onProgress: (event) => post({ type: "progress", id, event: { ...event } }),
        });
        post({ type: "result", id, value });
      } else if (type === "load") {
        release();
        model = await Florence2.load(msg.source, {
          ...msg.options,
          signal: ctrl.signal,
          onProgress: (event) => post({ type: "progress", id, event: { ...event } }),
        });
        post({ type: "result", id, state: modelState() });
      } else if (type === "encode") {
        const img = await current().encodeImage(msg.image, { ...msg.options, signal: ctrl.signal });
        encodings.set(img.encodingId, img);
        post({ type: "result", id, value: { encodingId: img.encodingId, width: img.width, height: img.height } });
      } else if (type === "release") {
        encodings.get(msg.encodingId)?.dispose();
        encodings.delete(msg.encodingId);
        post({ type: "result", id });
      } else if (type === "run") {
        const m = current();
        let image = msg.image;
        if (msg.encodingId !== undefined) {
          image = encodings.get(msg.encodingId);
          if (!image) throw named("Florence2InputError", "this encoded image was disposed (or belongs to another model load)");
        }
        const options = { ...msg.options, signal: ctrl.signal };
        if (msg.tokens) options.onToken = (text, tokenId) => post({ type: "token", id, text, tokenId });
        const value = await m.runTask(image, msg.prompt, options);
        post({ type: "result", id, value, state: modelState() });
      } else if (type === "memory") {
        post({ type: "result", id, value: current().memory() });
      } else if (type === "reload") {
        const m = current();
        // A reload opens a new device: the encodings made on the old one are gone.
        for (const img of encodings.values()) img.dispose();
        encodings.clear();
        await m.reload({
          signal: ctrl.signal,
          onProgress: (event) => post({ type: "progress", id, event: { ...event } }),
        });
        post({ type: "result", id, state: modelState() });
      } else if (type === "cacheInfo" || type === "clearCache") {
        post({ type: "result", id, value: await Florence2[type](msg.source, msg.options) });
      } else if (type === "dispose") {
        release();
        post({ type: "result", id });
      } else {
        throw new Error(`florence2-wasm/worker: unknown request ${type}`);
      }
    } catch (e) {
      post({ type: "error", id, error: errorInfo(e) });
    } finally {
      controllers.delete(id);
    }
  }

  scope.addEventListener("message", (ev) => {
    const m = ev.data;
    if (!m || typeof m !== "object" || !m[MARK]) return;
    handle(m).catch((e) => post({ type: "error", id: m.id, error: errorInfo(e) }));
  });
}

// Imported inside a worker: serve.
if (typeof WorkerGlobalScope !== "undefined" && globalThis instanceof WorkerGlobalScope) {
  expose(globalThis);
}
