// florence2-wasm: the package entry (`import { Florence2 } from "florence2-wasm"`).
//
// Re-exports the wasm-bindgen module (florence2_wasm.js) and makes its `init()` optional: the async static
// methods (`Florence2.load`, `estimate`, `cacheInfo`, `clearCache`, ...) initialise the module on first
// use, fetching the build this engine runs from next to this file (`new URL(..., import.meta.url)`, which
// webpack 5, Vite's production build, Rollup and Parcel follow by themselves): `florence2_wasm_relaxed_bg.wasm`
// where the engine has relaxed SIMD, `florence2_wasm_bg.wasm` elsewhere (wasm_build.js). `init(input)` still
// exists for pages that want to start the download early or serve the wasm from elsewhere
// (`init("/assets/florence2_wasm_bg.wasm")`; `wasmBuild()` names the file this engine should get).
import wbgInit, * as wasm from "./florence2_wasm.js";
import { isSupported as probeSupport } from "./support.js";
import { wasmUrl } from "./wasm_build.js";

export * from "./florence2_wasm.js";
export { Florence2Worker, WorkerEncodedImage } from "./client.js";
export { drawResult, regionTokens, DRAW_COLORS } from "./draw.js";
export { wasmBuild } from "./wasm_build.js";

let ready = null;
let initialised = false;

/** Load and instantiate the wasm module once; later calls return the same promise. */
export function init(input) {
  if (!ready) {
    ready = wbgInit(input === undefined ? { module_or_path: wasmUrl() } : input)
      .then((out) => {
        initialised = true;
        return out;
      })
      .catch((e) => {
        ready = null;
        throw e;
      });
  }
  return ready;
}
export default init;

/** `initSync` of the glue, remembering that the module is ready. */
export function initSync(module) {
  const out = wasm.initSync(module);
  initialised = true;
  ready = Promise.resolve(out);
  return out;
}

const { Florence2 } = wasm;
// Async statics: initialise first. Names another part of the package adds later are wrapped when present.
for (const name of ["load", "estimate", "cacheInfo", "clearCache"]) {
  const raw = Florence2[name];
  if (typeof raw !== "function" || raw.__florence2Wrapped) continue;
  const wrapped = async function (...args) {
    await init();
    return raw.apply(this, args);
  };
  wrapped.__florence2Wrapped = true;
  Object.defineProperty(Florence2, name, { value: wrapped, writable: true, configurable: true });
}
// `isSupported` probes WebGPU without the wasm (support.js, the code the wasm's own `isSupported` runs).
const supported = async function isSupported() {
  return probeSupport();
};
supported.__florence2Wrapped = true;
Object.defineProperty(Florence2, "isSupported", { value: supported, writable: true, configurable: true });
// Synchronous statics cannot wait: they say so instead of failing inside the glue code.
for (const name of ["postProcess"]) {
  const raw = Florence2[name];
  if (typeof raw !== "function" || raw.__florence2Wrapped) continue;
  const wrapped = function (...args) {
    if (!initialised) {
      const e = new Error(`Florence2.${name}() needs the wasm module: await init() or Florence2.load() first`);
      e.name = "Florence2InitError";
      throw e;
    }
    return raw.apply(this, args);
  };
  wrapped.__florence2Wrapped = true;
  Object.defineProperty(Florence2, name, { value: wrapped, writable: true, configurable: true });
}
