// `Florence2.isSupported()`: can this page run the model, and on which device? The one implementation:
// the package entries call it without instantiating the wasm, and the wasm imports it (a wasm-bindgen
// snippet, src/wasm/support.rs) for `isSupported` and for the check `Florence2.load` makes before opening
// a WebGPU device. The CPU backend runs wherever the wasm runs (browsers without WebGPU, Node.js); WebGPU
// is probed through `navigator.gpu` and its adapter, never throwing.

const absent = (v) => v === undefined || v === null;

/** `navigator.gpu`, or the reason there is none: `{gpu}` or `{reason}`. */
function navigatorGpu() {
  const g = globalThis;
  const gpu = g.navigator?.gpu;
  if (!absent(gpu)) {
    // wgpu reaches `navigator.gpu` through a window or a worker scope only.
    if (absent(g.Window) && absent(g.WorkerGlobalScope)) {
      return { reason: "navigator.gpu exists, but this runtime is neither a window nor a worker, which the WebGPU binding needs" };
    }
    return { gpu };
  }
  if (absent(g.navigator)) {
    return { reason: "this runtime has no navigator.gpu (Node.js and other non-browser runtimes have no WebGPU)" };
  }
  if (g.isSecureContext === false) {
    return { reason: "WebGPU needs a secure context (https:// or http://localhost) and this page is not one (navigator.gpu is undefined)" };
  }
  return { reason: "this browser does not expose WebGPU (navigator.gpu is undefined): it is unsupported or disabled here" };
}

/** Whether WebGPU is exposed where the engine can reach it (a device may still be refused). */
export function webgpuExposed() {
  return navigatorGpu().gpu !== undefined;
}

const describe = (e) => (e && typeof e === "object" && "message" in e ? String(e.message) : String(e));

/** `navigator.gpu.requestAdapter({powerPreference: "high-performance"})` (the preference the engine uses):
 * `{adapter}` or `{reason}`. */
export async function requestAdapter() {
  const { gpu, reason } = navigatorGpu();
  if (!gpu) return { reason };
  if (typeof gpu.requestAdapter !== "function") return { reason: "navigator.gpu.requestAdapter is not a function" };
  let adapter;
  try {
    adapter = await gpu.requestAdapter({ powerPreference: "high-performance" });
  } catch (e) {
    return { reason: `navigator.gpu.requestAdapter() failed: ${describe(e)}` };
  }
  if (absent(adapter)) {
    return { reason: "navigator.gpu.requestAdapter() returned no adapter (no usable GPU, the GPU is blocklisted, or WebGPU is disabled)" };
  }
  return { adapter };
}

function adapterSummary(adapter) {
  const info = adapter.info ?? {};
  const str = (k) => (typeof info[k] === "string" ? info[k] : "");
  // Newer browsers put it in `info`, older ones on the adapter.
  const fallback = typeof info.isFallbackAdapter === "boolean" ? info.isFallbackAdapter
    : typeof adapter.isFallbackAdapter === "boolean" ? adapter.isFallbackAdapter : false;
  return { vendor: str("vendor"), architecture: str("architecture"), device: str("device"),
    description: str("description"), isFallbackAdapter: fallback };
}

// The numeric attributes of a GPUSupportedLimits (WebIDL attributes live on its prototype chain, so
// `Object.keys` sees none of them), by name.
function limitsObject(adapter) {
  const limits = adapter.limits;
  const out = {};
  if (absent(limits)) return out;
  const keys = new Set();
  for (let p = limits; p && p !== Object.prototype; p = Object.getPrototypeOf(p)) {
    for (const k of Reflect.ownKeys(p)) if (typeof k === "string") keys.add(k);
  }
  for (const k of [...keys].sort()) {
    const v = limits[k];
    if (typeof v === "number") out[k] = v;
  }
  return out;
}

/** Where the model can run here: `{supported, webgpu, cpu, device, reason, adapter, features, limits}`
 * (`supported` is true on either device). Never rejects; opens no device. */
export async function isSupported() {
  const { adapter, reason } = await requestAdapter();
  if (!adapter) {
    return { supported: true, cpu: true, webgpu: false, device: "cpu", reason, adapter: null, features: [], limits: {} };
  }
  const summary = adapterSummary(adapter);
  return {
    supported: true,
    cpu: true,
    webgpu: true,
    device: summary.isFallbackAdapter ? "cpu" : "webgpu",
    reason: "",
    adapter: summary,
    features: absent(adapter.features) ? [] : [...adapter.features].sort(),
    limits: limitsObject(adapter),
  };
}
