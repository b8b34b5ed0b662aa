// The native Node.js addon (the crate built with `--features node`): the same engine as the CLI, on
// libuv's thread pool, behind the wasm facade's `Florence2` API. The addon ships in per-platform
// optional packages (the napi-rs convention, e.g. `florence2-wasm-linux-x64-gnu`) resolved here at run
// time; `FLORENCE2_NODE_ADDON=/path/to/florence2.<platform>.node` overrides the lookup.
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const require = createRequire(import.meta.url);

/** The optional package for each platform a release builds (see scripts/npm/node_addon_targets.json). */
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
    cached = { addon: null, reason: `${override ?? pkg} could not be loaded (${e.message})` };
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

/** The `Florence2` API on the native engine. */
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
    const model = await call(() => addon.load(nativeSource(source), { device, dtype }));
    if (signal?.aborted) {
      model.dispose();
      throw abortError(signal);
    }
    return new NativeFlorence2(model);
  }

  /** Runs `task` on `image`; `options`: `{maxNewTokens, numBeams, noRepeatNgramSize, signal}`. */
  async runTask(image, task, options = {}) {
    const { addon } = loadAddon();
    const { signal, maxNewTokens, numBeams, noRepeatNgramSize } = options;
    if (signal?.aborted) throw abortError(signal);
    const handle = new addon.CancelHandle();
    const onAbort = () => handle.cancel();
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      const opts = { maxNewTokens, numBeams, noRepeatNgramSize };
      return await call(() => this.#model.runTask(nativeImage(image), task, opts, handle));
    } catch (e) {
      throw signal?.aborted && e.name === "AbortError" ? abortError(signal) : e;
    } finally {
      signal?.removeEventListener("abort", onAbort);
    }
  }

  /** Memory now, the shape of a result's `memory` (`device`: "gpu" or "cpu"). */
  memory() {
    try {
      return this.#model.memory();
    } catch (e) {
      throw named(e);
    }
  }

  /** Frees the model; running tasks reject with `Florence2DisposedError`. */
  dispose() {
    this.#model.dispose();
  }
}
