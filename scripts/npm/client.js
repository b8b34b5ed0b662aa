// The page side of florence2-wasm/worker: `Florence2Worker` forwards load/runTask to a worker that imports
// "florence2-wasm/worker" and resolves with the same values as `Florence2` (see worker.js for the protocol).
const MARK = "florence2-wasm";

// Relative URLs mean the page's location, not the worker script's (bundlers put workers elsewhere).
function pageUrl(v) {
  if (v instanceof URL) return v.href;
  if (typeof v === "string" && /^(\.{1,2}\/|\/(?!\/))/.test(v) && typeof location !== "undefined") {
    return new URL(v, location.href).href;
  }
  return v;
}

function rebuildError(info) {
  const e = new Error(info?.message ?? "unknown error");
  e.name = info?.name ?? "Error";
  return e;
}

// Images a worker cannot receive as they are (DOM elements) become an ImageBitmap of their pixels.
async function transferable(image) {
  const dom = ["HTMLImageElement", "HTMLCanvasElement", "HTMLVideoElement", "SVGImageElement"];
  for (const name of dom) {
    if (typeof globalThis[name] === "function" && image instanceof globalThis[name]) {
      return createImageBitmap(image);
    }
  }
  return pageUrl(image);
}

export class Florence2Worker {
  #worker;
  #next = 1;
  #pending = new Map();
  #disposed = false;

  constructor(worker) {
    this.#worker = worker;
    worker.addEventListener("message", (ev) => {
      const m = ev.data;
      if (!m || typeof m !== "object" || !m[MARK]) return;
      const p = this.#pending.get(m.id);
      if (!p) return;
      if (m.type === "progress") p.onProgress?.(m.event);
      else if (m.type === "token") p.onToken?.(m.text, m.tokenId);
      else if (m.type === "result") {
        this.#pending.delete(m.id);
        p.resolve(m.value);
      } else if (m.type === "error") {
        this.#pending.delete(m.id);
        p.reject(rebuildError(m.error));
      }
    });
    worker.addEventListener("error", (ev) => {
      const e = new Error(`the florence2-wasm worker failed: ${ev.message || "unknown error"}`);
      e.name = "Florence2WorkerError";
      for (const [, p] of this.#pending) p.reject(e);
      this.#pending.clear();
    });
  }

  #request(msg, { signal, onProgress, onToken } = {}, transfer = []) {
    const id = this.#next++;
    return new Promise((resolve, reject) => {
      if (signal?.aborted) {
        const e = new Error("aborted before it started");
        e.name = "AbortError";
        reject(e);
        return;
      }
      const cancel = () => this.#worker.postMessage({ [MARK]: true, type: "cancel", target: id });
      signal?.addEventListener("abort", cancel, { once: true });
      const done = () => signal?.removeEventListener("abort", cancel);
      this.#pending.set(id, {
        onProgress,
        onToken,
        resolve: (v) => { done(); resolve(v); },
        reject: (e) => { done(); reject(e); },
      });
      this.#worker.postMessage({ ...msg, id, [MARK]: true }, transfer);
    });
  }

  /** Load a model in `worker` (a module Worker that imports "florence2-wasm/worker"). */
  static async load(worker, source, options = {}) {
    const client = new Florence2Worker(worker);
    await client.#load(source, options);
    return client;
  }

  async #load(source, options) {
    const { signal, onProgress, ...rest } = options ?? {};
    let src = pageUrl(source);
    if (src && typeof src === "object") {
      src = Object.fromEntries(Object.entries(src).map(([k, v]) => [k, pageUrl(v)]));
    }
    const info = await this.#request({ type: "load", source: src, options: rest }, { signal, onProgress });
    this.adapterInfo = info?.adapterInfo ?? "";
  }

  /** `Florence2.runTask` in the worker. Pass an ImageBitmap or VideoFrame in `transfer` to move it. */
  async runTask(image, prompt, options = {}, transfer = []) {
    if (this.#disposed) {
      const e = new Error("the model was disposed");
      e.name = "Florence2DisposedError";
      throw e;
    }
    const { signal, onToken, ...rest } = options ?? {};
    const img = await transferable(image);
    return this.#request({ type: "run", image: img, prompt, options: rest, tokens: Boolean(onToken) },
      { signal, onToken }, transfer);
  }

  /** `Florence2.cacheInfo` run in the worker (same Cache API bucket as the page's origin). */
  cacheInfo(source, options) {
    return this.#request({ type: "cacheInfo", source: pageUrl(source), options });
  }

  /** `Florence2.clearCache` run in the worker. */
  clearCache(source, options) {
    return this.#request({ type: "clearCache", source: pageUrl(source), options });
  }

  /** Release the model's GPU memory in the worker. */
  async dispose() {
    this.#disposed = true;
    await this.#request({ type: "dispose" });
  }

  /** Whether `dispose()` was called. */
  get disposed() {
    return this.#disposed;
  }

  /** Stop the worker (pending calls reject). */
  terminate() {
    this.#disposed = true;
    this.#worker.terminate();
    const e = new Error("the worker was terminated");
    e.name = "AbortError";
    for (const [, p] of this.#pending) p.reject(e);
    this.#pending.clear();
  }
}
