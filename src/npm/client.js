// The page side of florence2-wasm/worker: `Florence2Worker` forwards the model's API to a worker that
// imports "florence2-wasm/worker" and resolves with the same values as `Florence2` (see worker.js for the
// protocol). Calls that are synchronous on `Florence2` (`memory()`) return promises here: the model lives
// on another thread.
const MARK = "florence2-wasm";
// Request ids are unique per page, so several clients (and `isSupported`) can share one worker.
let nextId = 1;

// Relative URLs mean the page's location, not the worker script's (bundlers put workers elsewhere).
function pageUrl(v) {
  if (v instanceof URL) return v.href;
  if (typeof v === "string" && /^(\.{1,2}\/|\/(?!\/))/.test(v) && typeof location !== "undefined") {
    return new URL(v, location.href).href;
  }
  return v;
}

function named(name, message) {
  const e = new Error(message);
  e.name = name;
  return e;
}

function rebuildError(info) {
  return named(info?.name ?? "Error", info?.message ?? "unknown error");
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

// Options that cannot cross to the worker: callbacks and the signal stay here, `fetch` is refused by name.
function cloneableLoadOptions(options) {
  const { signal, onProgress, fetch, ...rest } = options ?? {};
  if (fetch !== undefined) {
    throw named("Florence2InputError", "the fetch option cannot be sent to a worker (functions do not cross " +
      "threads): import the package in the worker and pass it there, or use remoteHost/remotePathTemplate");
  }
  return { signal, onProgress, rest };
}

/** A model source with relative URLs resolved against the page (the worker's base is its script's). */
function sourceUrls(source) {
  const src = pageUrl(source);
  if (src && typeof src === "object") {
    return Object.fromEntries(Object.entries(src).map(([k, v]) => [k, pageUrl(v)]));
  }
  return src;
}

/** One worker's messages, shared by every client of that worker. */
class Channel {
  static #channels = new WeakMap();
  #worker;
  #pending = new Map();

  static of(worker) {
    let ch = Channel.#channels.get(worker);
    if (!ch) {
      ch = new Channel(worker);
      Channel.#channels.set(worker, ch);
    }
    return ch;
  }

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
        p.resolve(m);
      } else if (m.type === "error") {
        this.#pending.delete(m.id);
        p.reject(rebuildError(m.error));
      }
    });
    worker.addEventListener("error", (ev) => {
      this.failAll(named("Florence2WorkerError", `the florence2-wasm worker failed: ${ev.message || "unknown error"}`));
    });
  }

  failAll(e) {
    for (const [, p] of this.#pending) p.reject(e);
    this.#pending.clear();
  }

  /** Send `msg`; resolves with the worker's whole result message. */
  request(msg, { signal, onProgress, onToken } = {}, transfer = []) {
    const id = nextId++;
    return new Promise((resolve, reject) => {
      if (signal?.aborted) {
        reject(named("AbortError", "aborted before it started"));
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
}

/** An image encoded in the worker (`Florence2Worker.encodeImage`): its vision features stay on the
 * worker's GPU, and `runTask` on it skips the vision tower. */
export { drawResult, regionTokens, DRAW_COLORS } from "./draw.js";

export class WorkerEncodedImage {
  #client;
  #disposed = false;

  constructor(client, { encodingId, width, height }) {
    this.#client = client;
    this.encodingId = encodingId;
    this.width = width;
    this.height = height;
  }

  /** Whether `dispose()` was called (later `runTask` calls on it reject with `Florence2InputError`). */
  get disposed() {
    return this.#disposed;
  }

  /** Free the encoding's GPU memory in the worker. */
  async dispose() {
    if (this.#disposed) return;
    this.#disposed = true;
    await this.#client._release(this.encodingId);
  }
}

export class Florence2Worker {
  #channel;
  #disposed = false;
  #state = { adapterInfo: "", tuningTable: "" };
  #worker;

  constructor(worker) {
    this.#worker = worker;
    this.#channel = Channel.of(worker);
  }

  /** `Florence2.isSupported()` as the worker sees it (WebGPU in workers can differ from the page's); no
   * model is loaded and nothing is downloaded but the package's wasm, in the worker. */
  static async isSupported(worker) {
    return (await Channel.of(worker).request({ type: "supported" })).value;
  }

  /** `Florence2.estimate` as the worker's device sees it: the model's memory per format, or the format
   * `dtype: "auto"` would load there, before anything but its small files and headers is read. */
  static async estimate(worker, source, options = {}) {
    const { signal, onProgress, rest } = cloneableLoadOptions(options);
    const m = await Channel.of(worker).request({ type: "estimate", source: sourceUrls(source), options: rest },
      { signal, onProgress });
    return m.value;
  }

  /** Load a model in `worker` (a module Worker that imports "florence2-wasm/worker"). */
  static async load(worker, source, options = {}) {
    const client = new Florence2Worker(worker);
    await client.#load(source, options);
    return client;
  }

  #live() {
    if (this.#disposed) throw named("Florence2DisposedError", "the model was disposed");
  }

  async #load(source, options) {
    const { signal, onProgress, rest } = cloneableLoadOptions(options);
    const m = await this.#channel.request({ type: "load", source: sourceUrls(source), options: rest },
      { signal, onProgress });
    this.#state = m.state;
  }

  /** `Florence2.encodeImage` in the worker: a handle to pass to `runTask` instead of the image. */
  async encodeImage(image, options = {}, transfer = []) {
    this.#live();
    const { signal, ...rest } = options ?? {};
    const img = await transferable(image);
    const m = await this.#channel.request({ type: "encode", image: img, options: rest }, { signal }, transfer);
    return new WorkerEncodedImage(this, m.value);
  }

  /** @internal Frees an encoding (WorkerEncodedImage.dispose). */
  async _release(encodingId) {
    if (this.#disposed) return;
    await this.#channel.request({ type: "release", encodingId });
  }

  /** `Florence2.runTask` in the worker, on an image or a `WorkerEncodedImage`. Pass an ImageBitmap or
   * VideoFrame in `transfer` to move it. */
  async runTask(image, prompt, options = {}, transfer = []) {
    this.#live();
    const { signal, onToken, ...rest } = options ?? {};
    const msg = { type: "run", prompt, options: rest, tokens: Boolean(onToken) };
    if (image instanceof WorkerEncodedImage) {
      if (image.disposed) throw named("Florence2InputError", "this encoded image was disposed");
      msg.encodingId = image.encodingId;
    } else {
      msg.image = await transferable(image);
    }
    const m = await this.#channel.request(msg, { signal, onToken }, transfer);
    this.#state = m.state;
    return m.value;
  }

  /** `Florence2.memory()` in the worker (a promise: the model lives on another thread). */
  async memory() {
    this.#live();
    return (await this.#channel.request({ type: "memory" })).value;
  }

  /** `Florence2.reload()` in the worker: a new GPU device; encodings made before are released. */
  async reload(options = {}) {
    this.#live();
    const { signal, onProgress } = options ?? {};
    const m = await this.#channel.request({ type: "reload" }, { signal, onProgress });
    this.#state = m.state;
  }

  /** `Florence2.cacheInfo` run in the worker (same Cache API bucket as the page's origin). */
  async cacheInfo(source, options) {
    return (await this.#channel.request({ type: "cacheInfo", source: pageUrl(source), options })).value;
  }

  /** `Florence2.clearCache` run in the worker. */
  async clearCache(source, options) {
    return (await this.#channel.request({ type: "clearCache", source: pageUrl(source), options })).value;
  }

  /** Release the model's GPU memory (and its encodings) in the worker. */
  async dispose() {
    if (this.#disposed) return;
    this.#disposed = true;
    await this.#channel.request({ type: "dispose" });
  }

  /** Whether `dispose()` was called. */
  get disposed() {
    return this.#disposed;
  }

  /** The GPU adapter the worker uses. */
  get adapterInfo() {
    return this.#state.adapterInfo;
  }

  /** The worker model's kernel choices (`Florence2.tuningTable`), as of its last load, run or reload. */
  get tuningTable() {
    return this.#state.tuningTable;
  }

  /** Stop the worker (pending calls reject with an AbortError). */
  terminate() {
    this.#disposed = true;
    this.#worker.terminate();
    this.#channel.failAll(named("AbortError", "the worker was terminated"));
  }
}
