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
// structured cloning would drop the package's error names):
//   {type: "load", id, source, options}            -> {type: "progress", id, event}*, {type: "result", id}
//   {type: "run", id, image, prompt, options}      -> {type: "token", id, text, tokenId}*, {type: "result", id, value}
//   {type: "cacheInfo" | "clearCache", id, source, options}          -> {type: "result", id, value}
//   {type: "dispose", id}                          -> {type: "result", id}
//   {type: "cancel", target}                       aborts request `target`
//   any failure                                    -> {type: "error", id, error: {name, message}}
import { Florence2 } from "./index.js";

const MARK = "florence2-wasm";

/** Serve the protocol on `scope` (default: this worker's global scope). Called on import in a worker. */
export function expose(scope = globalThis) {
  let model = null;
  const controllers = new Map();
  const post = (m) => scope.postMessage({ ...m, [MARK]: true });
  const errorInfo = (e) =>
    e && typeof e === "object"
      ? { name: String(e.name || "Error"), message: String(e.message || e) }
      : { name: "Error", message: String(e) };

  async function handle(msg) {
    const { type, id } = msg;
    if (type === "cancel") {
      controllers.get(msg.target)?.abort();
      return;
    }
    const ctrl = new AbortController();
    controllers.set(id, ctrl);
    try {
      if (type === "load") {
        if (model) model.dispose();
        model = null;
        model = await Florence2.load(msg.source, {
          ...msg.options,
          signal: ctrl.signal,
          onProgress: (event) => post({ type: "progress", id, event: { ...event } }),
        });
        post({ type: "result", id, value: { adapterInfo: model.adapterInfo } });
      } else if (type === "run") {
        if (!model) {
          const e = new Error("no model is loaded in this worker (call Florence2Worker.load first)");
          e.name = "Florence2DisposedError";
          throw e;
        }
        const options = { ...msg.options, signal: ctrl.signal };
        if (msg.tokens) options.onToken = (text, tokenId) => post({ type: "token", id, text, tokenId });
        const value = await model.runTask(msg.image, msg.prompt, options);
        post({ type: "result", id, value });
      } else if (type === "cacheInfo" || type === "clearCache") {
        post({ type: "result", id, value: await Florence2[type](msg.source, msg.options) });
      } else if (type === "dispose") {
        if (model) model.dispose();
        model = null;
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
