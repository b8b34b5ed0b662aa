//! `Florence2.isSupported()`: can this page run the model, and on which device? The probe itself is
//! JavaScript, `src/npm/support.js` (a wasm-bindgen snippet here), so that the package entries answer
//! `isSupported()` without instantiating the wasm and the wasm answers with the same code. Also the check
//! `Florence2.load` makes before opening a WebGPU device (so `device: "webgpu"` without WebGPU gets a
//! `WebGPUUnavailableError` that says why, rather than wgpu's generic "no adapter").

use js_sys::Reflect;
use wasm_bindgen::prelude::*;

use crate::error::{Error, Result};
use crate::wasm::JsFlorence2;

#[wasm_bindgen(typescript_custom_section)]
const TS_SUPPORT: &'static str = r#"
/** The adapter `Florence2.isSupported()` found (`GPUAdapterInfo`'s fields; empty strings where the browser
 * withholds them). */
export interface AdapterSummary {
  vendor: string;
  architecture: string;
  device: string;
  description: string;
  /** A software or otherwise limited adapter (e.g. SwiftShader): it works, slowly. */
  isFallbackAdapter: boolean;
}

/** What `Florence2.isSupported()` resolves to. */
export interface SupportInfo {
  /** True when the model can run here on some device: always, since the CPU backend needs nothing but
   * the wasm (see `webgpu` for the GPU). */
  supported: boolean;
  /** True when WebGPU gave an adapter: `device: "webgpu"` can open a device on it. */
  webgpu: boolean;
  /** The CPU backend (wasm, one thread): always available. */
  cpu: boolean;
  /** The device `device: "auto"` picks: "webgpu" on a hardware adapter, "cpu" without WebGPU or when the
   * adapter is a fallback (software) one. */
  device: "webgpu" | "cpu";
  /** Why WebGPU is unavailable (empty when it is available). */
  reason: string;
  adapter: AdapterSummary | null;
  /** The adapter's optional features (e.g. "shader-f16", "timestamp-query"), sorted. */
  features: string[];
  /** The adapter's limits (e.g. maxBufferSize, maxStorageBufferBindingSize). */
  limits: Record<string, number>;
  /** Node.js only: whether the native addon (the platform's optional package) loaded: `device: "auto"`
   * runs on it (a hardware GPU through wgpu, else the native CPU backend), without it on the wasm. */
  addon?: boolean;
  /** Node.js only: the addon that loaded, or why none did. */
  addonReason?: string;
  /** Node.js only: the wasm build is there (always: the fallback). */
  wasm?: boolean;
  /** Node.js only: the addon's wgpu opens a hardware GPU, which `device: "auto"` takes (false without
   * the addon, or with a software adapter such as lavapipe). */
  gpu?: boolean;
  /** Node.js only: the adapter native wgpu opens (empty without one). */
  gpuAdapter?: string;
  /** Node.js only: why `auto` does not take a GPU (empty when it does). */
  gpuReason?: string;
}
"#;

#[wasm_bindgen(module = "/src/npm/support.js")]
extern "C" {
    #[wasm_bindgen(js_name = isSupported)]
    async fn js_is_supported() -> JsValue;
    #[wasm_bindgen(js_name = webgpuExposed)]
    fn js_webgpu_exposed() -> bool;
    #[wasm_bindgen(js_name = requestAdapter)]
    async fn js_request_adapter() -> JsValue;
}

/// `navigator.gpu.requestAdapter({powerPreference: "high-performance"})` (the preference the engine
/// uses), or why it gave none.
pub(crate) async fn request_adapter() -> std::result::Result<JsValue, String> {
    let r = js_request_adapter().await;
    let adapter = Reflect::get(&r, &"adapter".into()).unwrap_or(JsValue::UNDEFINED);
    if adapter.is_undefined() || adapter.is_null() {
        let reason = Reflect::get(&r, &"reason".into())
            .ok()
            .and_then(|v| v.as_string())
            .unwrap_or_else(|| "navigator.gpu.requestAdapter() gave no adapter".into());
        return Err(reason);
    }
    Ok(adapter)
}

/// Whether WebGPU is exposed where the engine can reach it (a device may still be refused).
pub fn webgpu_exposed() -> bool {
    js_webgpu_exposed()
}

/// The load-time check: `Error::NoAdapter` with the reason when WebGPU cannot give an adapter.
pub async fn check_webgpu() -> Result<()> {
    request_adapter().await.map(drop).map_err(Error::NoAdapter)
}

#[wasm_bindgen(js_class = Florence2)]
impl JsFlorence2 {
    /// Where the model can run here: `{supported, webgpu, cpu, device, reason, adapter, features,
    /// limits}` (`supported` is true on either device). Never rejects; opens no device.
    #[wasm_bindgen(js_name = isSupported, unchecked_return_type = "SupportInfo")]
    pub async fn is_supported() -> JsValue {
        js_is_supported().await
    }
}
