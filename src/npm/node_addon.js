// The native Node.js addon (the crate built with `--features node`): the same engine as the CLI, on
// libuv's thread pool, behind the wasm facade's `Florence2` API. The addon ships in per-platform
// optional packages (the napi-rs convention, e.g. `florence2-wasm-linux-x64-gnu`) resolved here at run
// time; `FLORENCE2_NODE_ADDON=/path/to/florence2.<platform>.node` overrides the lookup.
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const require = createRequire(import.meta.url);

/** The optional package for each platform a release builds (see src/npm/node_addon_targets.json). */
export const PLATFORM_PACKAGES = {
  "linux-x64-gnu": "florence2-wasm-linux-x64-gnu",
  "linux-arm64-gnu": "florence2-wasm-linux-arm64-gnu",
  "darwin-arm64": "florence2-wasm-darwin-arm64",
  "darwin-x64": "florence2-wasm-darwin-x64",
  "win32-x64-msvc": "florence2-wasm-win32-x64-msvc",
};

/** This process's platform triple in the napi-rs naming (`linux-x64-gnu`, `darwin-arm64`, ...). */
export function platformTriple() {
  const base = `${process.platform}-${process.arch}`;
  if (process.platform === "linux") {
    const glibc = process.report?.getReport?.().header?.glibcVersionRuntime;
    return `${base}-${glibc ? "gnu" : "musl"}`;
  }
  if (process.platform === "win32") return `${base}-msvc`;
  return base;
}

let cached;

/** `{ addon, reason }`: the loaded addon, or null and why none fits (the caller falls back to wasm). */
export function loadAddon() {
  if (cached) return cached;
  const override = process.env.FLORENCE2_NODE_ADDON;
  const triple = platformTriple();
  const pkg = PLATFORM_PACKAGES[triple];
  try {
    if (override) cached = { addon: require(override), reason: `addon ${override}` };
    else if (!pkg) cached = { addon: null, reason: `no native addon is built for ${triple}` };
    else cached = { addon: require(pkg), reason: `native addon ${pkg}` };
  } catch (e) {
    const missing = e.code === "MODULE_NOT_FOUND" && !override && String(e.message).includes(`'${pkg}'`);
    const why = missing
      ? `the optional package ${pkg} is not installed (npm skips it when optional dependencies are omitted)`
      : `${override ?? pkg} could not be loaded (${String(e.message).split("\n")[0]})`;
    cached = { addon: null, reason: why };
  }
  return cached;
}

/** An addon error (`[Name] message`) as a JS error whose `name` is the browser build's. */
function named(e) {
  const m = e instanceof Error && /^\[(\w+)\] ([\s\S]*)$/.exec(e.message);
  if (m) {
    e.name = m[1];
    e.message = m[2];
  }
  return e;
}

async function call(f) {
  try {
    return await f();
  } catch (e) {
    throw named(e);
  }
}

function abortError(signal) {
  if (signal.reason !== undefined) return signal.reason;
  return new DOMException("the operation was aborted", "AbortError");
}

/** A path, a `file:` URL, bytes (Buffer, Uint8Array, ArrayBuffer) or `{data, width, height}` RGBA as
 * the addon takes it (a path or a Buffer or `{data: Buffer, width, height}`). */
function nativeImage(image) {
  if (typeof image === "string") return image.startsWith("file:") ? fileURLToPath(image) : image;
  if (image instanceof URL) return fileURLToPath(image);
  if (image instanceof ArrayBuffer) return Buffer.from(image);
  if (ArrayBuffer.isView(image)) return Buffer.from(image.buffer, image.byteOffset, image.byteLength);
  if (image && typeof image === "object" && "data" in image) {
    const d = image.data;
    if (!ArrayBuffer.isView(d)) {
      const e = new TypeError("image: RGBA data must be a Uint8Array or Uint8ClampedArray");
      e.name = "Florence2ImageError";
      throw e;
    }
    return { data: Buffer.from(d.buffer, d.byteOffset, d.byteLength), width: image.width, height: image.height };
  }
  const e = new TypeError("image: expected a path, a file: URL, bytes or {data, width, height}");
  e.name = "Florence2InputError";
  throw e;
}

/** A model source as the addon takes it: a directory path, a `file:` URL or a hub id. */
function nativeSource(source) {
  if (source instanceof URL) return source.href;
  return String(source);
}

/** Whether the addon reads `source` itself: a directory path, a `file:` URL, a hub id or a hub
 * repository's URL (`https://huggingface.co/org/name[/tree/rev]`, through the Hugging Face cache); other
 * http(s) URLs and per-file source objects are the wasm downloader's. */
export function nativeReads(source) {
  const s = source instanceof URL ? source.href : source;
  if (typeof s !== "string") return false;
  if (/^https?:/i.test(s.trim())) return loadAddon().addon?.hubRepoOfUrl?.(s) != null;
  return !/^[a-z][a-z0-9+.-]+:/i.test(s.trim()) || /^file:/i.test(s.trim());
}

/** A `memory` object of the addon with `engine: "native"`. */
function tagged(memory) {
  return { ...memory, engine: "native" };
}

/** An image the addon reads: http(s) URLs are fetched here first (the addon reads files and bytes). */
async function fetchedImage(image, signal) {
  const href = image instanceof URL ? image.href : typeof image === "string" ? image : null;
  if (href === null || !/^https?:/i.test(href)) return nativeImage(image);
  let res;
  try {
    res = await fetch(href, { signal });
  } catch (e) {
    if (signal?.aborted) throw abortError(signal);
    throw Object.assign(new Error(`cannot fetch the image ${href}: ${e.message}`, { cause: e }), {
      name: "Florence2ImageError",
    });
  }
  if (!res.ok) {
    throw Object.assign(new Error(`cannot fetch the image ${href}: HTTP ${res.status}`), {
      name: "Florence2ImageError",
    });
  }
  return Buffer.from(await res.arrayBuffer());
}

/** A task option as the addon takes it (a u32), checked as the wasm build checks it: an integer from 0
 * to 2^53 - 1, else `Florence2InputError` naming the option; counts past 2^32 - 1 mean "no limit" to
 * the model (its position limit ends every decode first), so they are clamped. */
function uintOption(key, value) {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value < 0) {
    const e = new TypeError(`option ${key} must be an integer between 0 and ${Number.MAX_SAFE_INTEGER}`);
    e.name = "Florence2InputError";
    throw e;
  }
  return Math.min(value, 0xffffffff);
}

/** The `tiles` option: a string (its value is checked by the addon), or absent. */
function tilesOption(value) {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== "string") {
    const e = new TypeError("option tiles must be a string: auto, off or RxC");
    e.name = "Florence2InputError";
    throw e;
  }
  return value;
}

/** The `Florence2` API on the native engine. */
/** The `dtype` option as the addon reads it: a string as it is, a format per part as its text form
 * (`{vision: "fp16", text: "q4"}` -> "vision=fp16,text=q4"); the addon names a bad part or format. */
function nativeDType(dtype) {
  if (dtype === undefined || typeof dtype === "string") return dtype;
  const bad = (msg) => Object.assign(new Error(msg), { name: "Florence2InputError" });
  if (dtype === null || typeof dtype !== "object" || Array.isArray(dtype)) {
    throw bad('option dtype must be a string ("fp16", "auto", "vision=fp16,text=q4") or an object of part ' +
      'names to formats ({vision: "fp16", text: "q4"})');
  }
  const entries = Object.entries(dtype);
  for (const [part, format] of entries) {
    if (typeof format !== "string" || /[,=]/.test(format) || /[,=]/.test(part)) {
      throw bad(`option dtype.${part} must be a format string (fp32, fp16, q8 or q4)`);
    }
  }
  return entries.length ? entries.map(([part, format]) => `${part}=${format}`).join(",") : undefined;
}

export class NativeFlorence2 {
  #model;

  constructor(model) {
    this.#model = model;
  }

  /** Loads `source` with `{device: "auto"|"gpu"|"cpu", dtype, signal}` (an abort before the load
   * ends rejects with the signal's reason and drops the loaded model). */
  static async load(source, options = {}) {
    const { addon, reason } = loadAddon();
    if (!addon) throw Object.assign(new Error(reason), { name: "Florence2LoadError" });
    const { signal, device, dtype } = options;
    if (signal?.aborted) throw abortError(signal);
    const files = typeof options.onProgress === "function" ? fileEvents(nativeSource(source), options.onProgress) : null;
    let model;
    try {
      model = await call(() => addon.load(nativeSource(source), { device, dtype: nativeDType(dtype) }, files?.callback));
    } finally {
      await files?.drained;
    }
    if (signal?.aborted || files?.error) {
      model.dispose();
      throw signal?.aborted ? abortError(signal) : files.error.value;
    }
    const loaded = new NativeFlorence2(model);
    const memory = loaded.memory();
    const engine = memory.device === "gpu" ? "native GPU (wgpu)" : "native CPU backend";
    loaded.#info = `${engine}: ${model.adapterInfo}; ${reason}`;
    if (files) {
      // After the files: the format chosen, then ready.
      const base = { name: nativeSource(source), file: "", loaded: 0, total: 0, progress: 100, cached: false };
      try {
        options.onProgress({ ...base, status: "dtype", dtype: memory.dtype, reason: model.dtypeReason ?? "" });
        options.onProgress({ ...base, status: "ready" });
      } catch (e) {
        loaded.dispose();
        throw e;
      }
    }
    return loaded;
  }

  /** The memory of `source` in a format before loading it, judged against the device the addon would
   * load on (`{device, dtype, maxNewTokens, numBeams, signal}`): the wasm's `MemoryEstimate` shape. */
  static async estimate(source, options = {}) {
    const { addon, reason } = loadAddon();
    if (!addon) throw Object.assign(new Error(reason), { name: "Florence2LoadError" });
    const { signal, device, dtype } = options;
    if (signal?.aborted) throw abortError(signal);
    const request = {
      device,
      dtype: nativeDType(dtype),
      maxNewTokens: uintOption("maxNewTokens", options.maxNewTokens),
      numBeams: uintOption("numBeams", options.numBeams),
    };
    const estimate = await call(() => addon.estimate(nativeSource(source), request));
    if (signal?.aborted) throw abortError(signal);
    return estimate;
  }

  #info = "";

  /** The engine, the device and why it was chosen, and the addon's package. */
  get adapterInfo() {
    return this.#info;
  }

  /** No kernel tuning table on the native engine (the CLI's `florence2 tune` tunes it). */
  get tuningTable() {
    return "";
  }

  /** Whether `dispose()` ran. */
  get disposed() {
    return this.#disposed;
  }

  #disposed = false;

  /** Runs `task` on `image` (also an http(s) URL, fetched here, or an encoding of `encodeImage`);
   * `options`: `{maxNewTokens, numBeams, noRepeatNgramSize, tiles, signal, onToken}` (`tiles`: "auto",
   * "off" or "RxC", checked by the addon). `onToken(text, id)` runs
   * on the JS thread as tokens are chosen (greedy; at the end with beams), all before the promise
   * settles; a callback that throws rejects the task with its error once the task ends. */
  async runTask(image, task, options = {}) {
    const { addon } = loadAddon();
    const { signal, maxNewTokens, numBeams, noRepeatNgramSize, tiles, onToken } = options ?? {};
    if (signal?.aborted) throw abortError(signal);
    const encoded = image instanceof NativeEncodedImage ? image.encoding() : null;
    const input = encoded ?? (await fetchedImage(image, signal));
    // An abort while an http(s) image was fetched (or in the microtask before this) stops here.
    if (signal?.aborted) throw abortError(signal);
    const handle = new addon.CancelHandle();
    const onAbort = () => handle.cancel();
    signal?.addEventListener("abort", onAbort, { once: true });
    const tokens = typeof onToken === "function" ? tokenSink(onToken) : null;
    let queued = false;
    try {
      const opts = {
        maxNewTokens: uintOption("maxNewTokens", maxNewTokens),
        numBeams: uintOption("numBeams", numBeams),
        noRepeatNgramSize: uintOption("noRepeatNgramSize", noRepeatNgramSize),
        tiles: tilesOption(tiles),
      };
      const out = await call(() => {
        const p = encoded
          ? this.#model.runTaskEncoded(encoded, task, opts, handle, tokens?.callback)
          : this.#model.runTask(input, task, opts, handle, tokens?.callback);
        queued = true;
        return p;
      });
      await tokens?.drained;
      if (tokens?.error) throw tokens.error.value;
      return { ...out, memory: tagged(out.memory) };
    } catch (e) {
      // A queued task always ends with the addon's last token call: no token call follows the rejection.
      if (queued) await tokens?.drained;
      throw signal?.aborted && e.name === "AbortError" ? abortError(signal) : e;
    } finally {
      signal?.removeEventListener("abort", onAbort);
    }
  }

  /** Encodes `image` once (preprocess and vision tower) for several tasks: `runTask` takes the result
   * as its image. */
  async encodeImage(image, options = {}) {
    const signal = options?.signal;
    if (signal?.aborted) throw abortError(signal);
    const input = await fetchedImage(image, signal);
    if (signal?.aborted) throw abortError(signal);
    const encoding = await call(() => this.#model.encodeImage(input));
    if (signal?.aborted) {
      encoding.dispose();
      throw abortError(signal);
    }
    return new NativeEncodedImage(encoding);
  }

  /** Memory now, the shape of a result's `memory` (`device`: "gpu" or "cpu", `engine`: "native"). */
  memory() {
    try {
      return tagged(this.#model.memory());
    } catch (e) {
      throw named(e);
    }
  }

  /** Nothing to reload: the native engine has no lost-device recovery to redo (a disposed model
   * rejects with `Florence2DisposedError`). */
  async reload() {
    if (this.#disposed) throw disposedError();
  }

  /** Frees the model; running tasks reject with `Florence2DisposedError`. */
  dispose() {
    this.#disposed = true;
    this.#model.dispose();
  }

  free() {
    this.dispose();
  }

  [Symbol.dispose]() {
    this.dispose();
  }
}

/** The addon's file callback around the user's `onProgress`: each file's event in the wasm's shape
 * (`{status, name, file, loaded, total, progress, cached}`; `download`, `progress`, `done` for a file a
 * hub download writes, `done` with `cached: true` for a file read from disk) followed by the aggregate
 * `progress_total` with `files` (`{file: {loaded, total}}`), as the wasm sends them. `drained` resolves
 * at the addon's last call (`end`); a callback that throws stops the events and fails the load. */
function fileEvents(name, onProgress) {
  const files = {};
  let done;
  const out = { drained: new Promise((r) => (done = r)), error: null };
  out.callback = (status, file, loaded, total, cached) => {
    if (status === "end") return done();
    if (out.error) return;
    try {
      const progress = total > 0 ? (loaded / total) * 100 : status === "done" ? 100 : 0;
      onProgress({ status, name, file, loaded, total, progress, cached });
      files[file] = { loaded, total: Math.max(total, files[file]?.total ?? 0) };
      const sum = (k) => Object.values(files).reduce((a, f) => a + f[k], 0);
      const [l, t] = [sum("loaded"), sum("total")];
      onProgress({ status: "progress_total", name, file: "", loaded: l, total: t,
        progress: t > 0 ? (l / t) * 100 : 100, cached, files: structuredClone(files) });
    } catch (e) {
      out.error = { value: e };
    }
  };
  return out;
}

/** The addon's token callback around the user's `onToken`: `drained` resolves at the addon's last
 * call (`text` null), after every token call; `error` holds the first error the user's callback threw
 * (later tokens are not passed on). */
function tokenSink(onToken) {
  const sink = { error: null };
  let done;
  sink.drained = new Promise((resolve) => (done = resolve));
  sink.callback = (text, id) => {
    if (text === null) {
      done();
      return;
    }
    if (sink.error) return;
    try {
      onToken(text, id);
    } catch (e) {
      sink.error = { value: e };
    }
  };
  return sink;
}

function disposedError() {
  return Object.assign(new Error("this model was disposed"), { name: "Florence2DisposedError" });
}

let nextEncodingId = 1;

/** `encodeImage`'s result on the native engine: the addon's encoding (this model's only). */
export class NativeEncodedImage {
  #encoding;
  #disposed = false;

  constructor(encoding) {
    this.#encoding = encoding;
    this.width = encoding.width;
    this.height = encoding.height;
    /** Unique in the process, as the wasm's are in a page. */
    this.encodingId = nextEncodingId++;
  }

  /** The addon's encoding (`Florence2InputError` once disposed). */
  encoding() {
    if (this.#disposed) {
      throw Object.assign(new Error("this EncodedImage was disposed"), { name: "Florence2InputError" });
    }
    return this.#encoding;
  }

  get disposed() {
    return this.#disposed;
  }

  /** Frees the encoding's memory. */
  dispose() {
    if (this.#disposed) return;
    this.#disposed = true;
    this.#encoding.dispose();
  }

  free() {
    this.dispose();
  }

  [Symbol.dispose]() {
    this.dispose();
  }
}
