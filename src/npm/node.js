// florence2-wasm in Node.js (>= 20): the package entry under the "node" export condition, so
// `import { Florence2 } from "florence2-wasm"` in Node loads this file and browsers and bundlers never
// see a `node:` import.
//
// On top of index.js it
// - instantiates the wasm from the file next to this module (Node's `fetch` cannot read `file:` URLs);
// - loads models from a directory path or a `file:` URL: `Florence2.load` (and `Florence2.estimate`)
//   turns a path into a `file:` URL and passes the wasm a `fetch` that streams `file:` URLs from disk
//   (404 for a missing file; `HEAD` and `Range` requests served) and hands any other URL to the
//   caller's `fetch` option or `globalThis.fetch`;
// - reads an image given as a path or a `file:` URL (`runTask`, `encodeImage`) into bytes;
// - chooses the engine (`Florence2.load`'s `device`): the native addon (node_addon.js: the platform's
//   optional package, e.g. `florence2-wasm-linux-x64-gnu`) for "auto", "gpu" and "cpu", the wasm for
//   "wasm", "webgpu", and for "auto" when no addon fits the platform or the source is one only the wasm's
//   downloader reads (an http(s) URL, per-file URLs, a `fetch`, `remoteHost` or `remotePathTemplate`
//   option; a hub id's `revision` becomes the addon's `org/name@revision`). "gpu"/"cpu"
//   without the addon reject with `Florence2LoadError` saying why. Results' `memory.engine` says which
//   ran ("native" or "wasm"); `isSupported()` adds `addon`, `addonReason`, `wasm` and the GPU native
//   wgpu opens (`gpu`: a hardware one, which "auto" takes; `gpuAdapter`, `gpuReason`).
// Node has no Cache API: the wasm reads models from their source at every load, without an error.
import { open, readFile } from "node:fs/promises";
import { existsSync } from "node:fs";
import { isAbsolute, resolve as resolvePath, sep } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { init as baseInit, Florence2 } from "./index.js";
import { loadAddon, nativeReads, NativeFlorence2 } from "./node_addon.js";
import { wasmUrl } from "./wasm_build.js";

export * from "./index.js";

/** Bytes read from a file per stream chunk. */
const CHUNK = 1 << 20;

/** Load and instantiate the wasm module once (from the build this Node.js runs, next to this file:
 * wasm_build.js, unless `input` says otherwise); later calls return the same promise. */
export function init(input) {
  if (input === undefined) {
    input = { module_or_path: readFile(wasmUrl()) };
  }
  return baseInit(input);
}
export default init;

/** Whether `s` starts with a URL scheme (`file:`, `https:`, `blob:`, ...; a Windows drive letter is
 * not one). */
function hasScheme(s) {
  return /^[a-z][a-z0-9+.-]+:/i.test(s);
}

/** Whether a source string names a local path: absolute, `./`- or `../`-relative, or an existing entry
 * (so `models/tiny` is the local directory when there is one, else a hub id). */
function isPath(s) {
  if (hasScheme(s)) return false;
  return isAbsolute(s) || /^\.\.?([\\/]|$)/.test(s) || existsSync(s);
}

/** A local path as a `file:` URL; `dir`: with a trailing slash. */
function pathUrl(p, dir) {
  let href = pathToFileURL(resolvePath(p)).href;
  if (dir && !href.endsWith("/")) href += "/";
  return href;
}

/** A model source with local paths replaced by `file:` URLs. */
function nodeSource(source) {
  if (typeof source === "string") {
    return isPath(source.trim()) ? pathUrl(source.trim(), true) : source;
  }
  if (source && typeof source === "object" && !(source instanceof URL)) {
    const out = {};
    for (const [k, v] of Object.entries(source)) {
      out[k] = typeof v === "string" && isPath(v) ? pathUrl(v, false) : v;
    }
    return out;
  }
  return source;
}

function abortError(signal) {
  if (signal.reason !== undefined) return signal.reason;
  return new DOMException("the operation was aborted", "AbortError");
}

/** The byte range a `Range: bytes=A-B` (or `bytes=A-`) header asks of a `size`-byte file, or null for
 * none (or one this reader does not serve: the whole file is answered then, as HTTP allows). */
function byteRange(init, size) {
  const h = init && init.headers ? new Headers(init.headers).get("range") : null;
  const m = h && /^bytes=(\d+)-(\d*)$/.exec(h.trim());
  if (!m) return null;
  const start = Number(m[1]);
  const end = m[2] === "" ? size - 1 : Math.min(Number(m[2]), size - 1);
  return start <= end ? { start, end } : null;
}

/** A `Response` streaming the file a `file:` URL names: 404 when there is no such file. `HEAD` answers
 * the headers only; a `Range: bytes=A-B` request gets 206 and only those bytes (the memory estimate reads
 * the safetensors headers this way without reading the weights). */
async function fileResponse(url, init) {
  const signal = init && init.signal;
  if (signal && signal.aborted) throw abortError(signal);
  let path;
  try {
    path = fileURLToPath(url);
  } catch (e) {
    throw new TypeError(`cannot read ${url}: ${e.message}`);
  }
  if (path.endsWith(sep)) return new Response(null, { status: 404, statusText: "Not Found" });
  let fh;
  try {
    fh = await open(path, "r");
  } catch (e) {
    if (["ENOENT", "ENOTDIR", "EISDIR"].includes(e.code)) {
      return new Response(null, { status: 404, statusText: "Not Found" });
    }
    throw new TypeError(`cannot read ${path}: ${e.message}`);
  }
  let size;
  try {
    const st = await fh.stat();
    if (!st.isFile()) {
      await fh.close();
      return new Response(null, { status: 404, statusText: "Not Found" });
    }
    size = st.size;
  } catch (e) {
    await fh.close().catch(() => {});
    throw new TypeError(`cannot read ${path}: ${e.message}`);
  }
  if (init && String(init.method || "GET").toUpperCase() === "HEAD") {
    await fh.close();
    return new Response(null, {
      status: 200,
      headers: { "content-type": "application/octet-stream", "content-length": String(size) },
    });
  }
  const range = byteRange(init, size);
  let position = range ? range.start : 0;
  let left = range ? range.end - range.start + 1 : size;
  let closed = false;
  const close = () => {
    if (closed) return;
    closed = true;
    fh.close().catch(() => {});
  };
  const body = new ReadableStream({
    async pull(controller) {
      try {
        if (signal && signal.aborted) throw abortError(signal);
        const n = Math.min(CHUNK, left);
        const buf = new Uint8Array(n);
        const { bytesRead } = n === 0 ? { bytesRead: 0 } : await fh.read(buf, 0, n, position);
        if (bytesRead === 0) {
          close();
          controller.close();
        } else {
          position += bytesRead;
          left -= bytesRead;
          controller.enqueue(bytesRead === n ? buf : buf.slice(0, bytesRead));
        }
      } catch (e) {
        close();
        controller.error(e);
      }
    },
    cancel: close,
  });
  if (range) {
    return new Response(body, {
      status: 206,
      headers: {
        "content-type": "application/octet-stream",
        "content-length": String(range.end - range.start + 1),
        "content-range": `bytes ${range.start}-${range.end}/${size}`,
      },
    });
  }
  return new Response(body, {
    status: 200,
    headers: { "content-type": "application/octet-stream", "content-length": String(size) },
  });
}

/** The `fetch` the wasm uses: `file:` URLs from disk, anything else through `next`. */
function nodeFetch(next) {
  return (url, init) => {
    const s = String(url);
    if (s.slice(0, 5).toLowerCase() === "file:") return fileResponse(s, init);
    return (next || globalThis.fetch)(url, init);
  };
}

/** Load options with the Node `fetch` (wrapping the caller's `fetch` option, if any). */
function nodeOptions(options) {
  const o = options && typeof options === "object" ? { ...options } : {};
  o.fetch = nodeFetch(typeof o.fetch === "function" ? o.fetch : undefined);
  return o;
}

/** The file an image given as a local path or a `file:` URL names; `null` for anything else. */
function imagePath(image) {
  if (image instanceof URL) return image.protocol === "file:" ? fileURLToPath(image) : null;
  if (typeof image !== "string") return null;
  if (/^file:/i.test(image)) return fileURLToPath(image);
  return hasScheme(image) ? null : image;
}

/** Replace `obj[name]` by `make(original)` once. */
function wrap(obj, name, make) {
  const raw = obj[name];
  if (typeof raw !== "function" || raw.__florence2Node) return;
  const wrapped = make(raw);
  wrapped.__florence2Node = true;
  Object.defineProperty(obj, name, { value: wrapped, writable: true, configurable: true });
}

const DEVICES = ["auto", "gpu", "cpu", "wasm", "webgpu"];

function namedError(name, message) {
  return Object.assign(new Error(message), { name });
}

/** "native" or "wasm": the engine `Florence2.load(source, options)` runs on (see the header). */
function chooseEngine(source, options) {
  const device = options?.device ?? "auto";
  if (!DEVICES.includes(device)) {
    const names = DEVICES.map((d) => `"${d}"`).join(", ");
    throw namedError("Florence2InputError", `option device must be one of ${names}`);
  }
  if (device === "wasm" || device === "webgpu") return "wasm";
  const wasmOnly = !nativeReads(source) || typeof options?.fetch === "function" ||
    options?.remoteHost !== undefined || options?.remotePathTemplate !== undefined;
  const { addon, reason } = loadAddon();
  if (device === "auto") return addon && !wasmOnly ? "native" : "wasm";
  if (!addon) {
    throw namedError("Florence2LoadError", `device "${device}" runs on the native addon, and none is here: ` +
      `${reason}; device "wasm" (or "auto") runs the wasm build`);
  }
  if (wasmOnly) {
    throw namedError("Florence2InputError", `device "${device}": the native addon reads a model directory, ` +
      "a file: URL or a hub id (through the Hugging Face cache), without fetch or remoteHost options; " +
      'device "wasm" reads this source');
  }
  return "native";
}

/** The wasm's load options: `device: "wasm"` is the wasm's own choice ("auto": its CPU backend in Node). */
function wasmOptions(options) {
  const o = nodeOptions(options);
  if (o.device === "wasm") delete o.device;
  return o;
}

/** A wasm `memory` object with `engine: "wasm"`. */
const wasmMemory = (m) => ({ ...m, engine: "wasm" });

// Statics: the engine first; the wasm is instantiated from the file; sources may be paths.
wrap(Florence2, "load", (raw) => async function (source, options) {
  if (chooseEngine(source, options) === "native") {
    // A hub id's `revision` option is the addon's `org/name@revision`.
    let native = nodeSource(source instanceof URL ? source.href : source);
    if (options?.revision && !/^(file|https?):/i.test(native)) native = `${native}@${options.revision}`;
    return NativeFlorence2.load(native, options ?? {});
  }
  await init();
  return raw.call(this, nodeSource(source), wasmOptions(options));
});
wrap(Florence2, "estimate", (raw) => async function (source, options) {
  // The engine `load` would take answers (its device's limits); `adapterLimits` is the wasm's option.
  if (options?.adapterLimits === undefined && chooseEngine(source, options) === "native") {
    let native = nodeSource(source instanceof URL ? source.href : source);
    if (options?.revision && !/^(file|https?):/i.test(native)) native = `${native}@${options.revision}`;
    return NativeFlorence2.estimate(native, options ?? {});
  }
  await init();
  const o = nodeOptions(options);
  if (o.device === "wasm") o.device = "cpu";
  return raw.call(this, nodeSource(source), o);
});
// `model instanceof Florence2` holds for a model on either engine.
Object.defineProperty(Florence2, Symbol.hasInstance, {
  value: (o) => o instanceof NativeFlorence2 || Function.prototype[Symbol.hasInstance].call(Florence2, o),
  configurable: true,
});
// isSupported: the wasm's answer (WebGPU, the wasm CPU backend) and the native addon's, with the GPU
// adapter native wgpu opens (probed once per process).
let gpuProbe = null;
wrap(Florence2, "isSupported", (raw) => async function () {
  const s = await raw.call(this);
  const { addon, reason } = loadAddon();
  if (!addon) {
    return { ...s, addon: false, addonReason: reason, wasm: true, gpu: false, gpuAdapter: "",
      gpuReason: "no native addon (the wasm has no GPU in Node.js)" };
  }
  gpuProbe ??= addon.probeGpu().catch((e) => ({ hardware: false, adapter: "", reason: String(e.message) }));
  const g = await gpuProbe;
  return { ...s, addon: true, addonReason: reason, wasm: true, gpu: g.hardware, gpuAdapter: g.adapter,
    gpuReason: g.reason };
});
wrap(Florence2.prototype, "memory", (raw) => function () {
  return wasmMemory(raw.call(this));
});
for (const name of ["cacheInfo", "clearCache"]) {
  wrap(Florence2, name, (raw) => async function (source, options) {
    await init();
    return raw.call(this, nodeSource(source), options);
  });
}
// Images from paths: the file is read before the call joins the model's queue (other images join it at
// once, in call order).
for (const name of ["runTask", "encodeImage"]) {
  const tag = name === "runTask" ? (out) => ({ ...out, memory: wasmMemory(out.memory) }) : (out) => out;
  wrap(Florence2.prototype, name, (raw) => function (image, ...rest) {
    const path = imagePath(image);
    if (path === null) return raw.call(this, image, ...rest).then(tag);
    return readFile(path).then(
      (bytes) => raw.call(this, bytes, ...rest).then(tag),
      (e) => {
        const err = new Error(`cannot read the image ${path}: ${e.message}`, { cause: e });
        err.name = "Florence2ImageError";
        throw err;
      },
    );
  });
}
