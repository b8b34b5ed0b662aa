//! `Florence2.isSupported()`: can this page run the model, and on which device? The CPU backend runs
//! wherever the wasm runs (browsers without WebGPU, Node.js); WebGPU is probed through `navigator.gpu`
//! and its adapter, never throwing. Also the check `Florence2.load` makes before opening a WebGPU device
//! (so `device: "webgpu"` without WebGPU gets a `WebGPUUnavailableError` that says why, rather than
//! wgpu's generic "no adapter").

use js_sys::{Array, Function, Object, Promise, Reflect};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;

use crate::error::{Error, Result};
use crate::wasm::js::{describe_js, set};
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
}
"#;

fn get(v: &JsValue, k: &str) -> JsValue {
    Reflect::get(v, &JsValue::from_str(k)).unwrap_or(JsValue::UNDEFINED)
}

fn absent(v: &JsValue) -> bool {
    v.is_undefined() || v.is_null()
}

/// `navigator.gpu`, or why there is none.
fn navigator_gpu() -> std::result::Result<JsValue, String> {
    let global = js_sys::global();
    let gpu = get(&get(&global, "navigator"), "gpu");
    if !absent(&gpu) {
        // wgpu reaches `navigator.gpu` through a window or a worker scope only (and panics elsewhere).
        if absent(&get(&global, "Window")) && absent(&get(&global, "WorkerGlobalScope")) {
            return Err(
                "navigator.gpu exists, but this runtime is neither a window nor a worker, which the \
                 WebGPU binding needs"
                    .into(),
            );
        }
        return Ok(gpu);
    }
    if absent(&get(&global, "navigator")) {
        return Err(
            "this runtime has no navigator.gpu (Node.js and other non-browser runtimes have no \
             WebGPU)"
                .into(),
        );
    }
    if get(&global, "isSecureContext") == JsValue::FALSE {
        return Err(
            "WebGPU needs a secure context (https:// or http://localhost) and this page is not \
                    one (navigator.gpu is undefined)"
                .into(),
        );
    }
    Err(
        "this browser does not expose WebGPU (navigator.gpu is undefined): it is unsupported or \
         disabled here"
            .into(),
    )
}

/// `navigator.gpu.requestAdapter({powerPreference: "high-performance"})` (the preference the engine
/// uses), or why it gave none.
pub(crate) async fn request_adapter() -> std::result::Result<JsValue, String> {
    let gpu = navigator_gpu()?;
    let f: Function = get(&gpu, "requestAdapter")
        .dyn_into()
        .map_err(|_| "navigator.gpu.requestAdapter is not a function".to_string())?;
    let opts = Object::new();
    set(&opts, "powerPreference", &"high-performance".into());
    let p: Promise = f
        .call1(&gpu, &opts)
        .map_err(|e| format!("navigator.gpu.requestAdapter() threw {}", describe_js(&e).1))?
        .dyn_into()
        .map_err(|_| "navigator.gpu.requestAdapter() did not return a promise".to_string())?;
    let adapter = JsFuture::from(p).await.map_err(|e| {
        format!(
            "navigator.gpu.requestAdapter() failed: {}",
            describe_js(&e).1
        )
    })?;
    if absent(&adapter) {
        return Err(
            "navigator.gpu.requestAdapter() returned no adapter (no usable GPU, the GPU is \
                    blocklisted, or WebGPU is disabled)"
                .into(),
        );
    }
    Ok(adapter)
}

/// Whether WebGPU is exposed where the engine can reach it (a device may still be refused).
pub fn webgpu_exposed() -> bool {
    navigator_gpu().is_ok()
}

/// The load-time check: `Error::NoAdapter` with the reason when WebGPU cannot give an adapter.
pub async fn check_webgpu() -> Result<()> {
    request_adapter().await.map(drop).map_err(Error::NoAdapter)
}

fn string_of(v: &JsValue, k: &str) -> JsValue {
    get(v, k).as_string().unwrap_or_default().into()
}

/// `{vendor, architecture, device, description, isFallbackAdapter}` of an adapter.
fn adapter_summary(adapter: &JsValue) -> JsValue {
    let info = get(adapter, "info");
    let o = Object::new();
    for k in ["vendor", "architecture", "device", "description"] {
        set(&o, k, &string_of(&info, k));
    }
    // Newer browsers put it in `info`, older ones on the adapter.
    let fallback = get(&info, "isFallbackAdapter")
        .as_bool()
        .or_else(|| get(adapter, "isFallbackAdapter").as_bool())
        .unwrap_or(false);
    set(&o, "isFallbackAdapter", &fallback.into());
    o.into()
}

/// The feature names of a `GPUSupportedFeatures` set, sorted.
fn feature_list(adapter: &JsValue) -> Array {
    let features = get(adapter, "features");
    let arr = if absent(&features) {
        Array::new()
    } else {
        Array::from(&features)
    };
    arr.sort();
    arr
}

/// The numeric attributes of a `GPUSupportedLimits` (WebIDL attributes live on its prototype, so
/// `Object.keys` sees none of them).
fn limits_object(adapter: &JsValue) -> JsValue {
    let limits = get(adapter, "limits");
    let out = Object::new();
    if absent(&limits) {
        return out.into();
    }
    let mut keys = Vec::new();
    let object_proto: JsValue = Object::get_prototype_of(&Object::new()).into();
    let mut proto: JsValue = limits.clone();
    while let Some(p) = proto.dyn_ref::<Object>() {
        if let Ok(own) = Reflect::own_keys(p) {
            keys.extend(own.iter().filter_map(|k| k.as_string()));
        }
        proto = Object::get_prototype_of(p).into();
        if proto.is_null() || proto == object_proto {
            break;
        }
    }
    keys.sort();
    keys.dedup();
    for k in keys {
        let v = get(&limits, &k);
        if let Some(n) = v.as_f64() {
            set(&out, &k, &JsValue::from_f64(n));
        }
    }
    out.into()
}

async fn probe() -> JsValue {
    let o = Object::new();
    set(&o, "supported", &true.into());
    set(&o, "cpu", &true.into());
    match request_adapter().await {
        Ok(adapter) => {
            let summary = adapter_summary(&adapter);
            let fallback = get(&summary, "isFallbackAdapter").as_bool() == Some(true);
            set(&o, "webgpu", &true.into());
            set(
                &o,
                "device",
                &(if fallback { "cpu" } else { "webgpu" }).into(),
            );
            set(&o, "reason", &"".into());
            set(&o, "adapter", &summary);
            set(&o, "features", &feature_list(&adapter));
            set(&o, "limits", &limits_object(&adapter));
        }
        Err(reason) => {
            set(&o, "webgpu", &false.into());
            set(&o, "device", &"cpu".into());
            set(&o, "reason", &reason.into());
            set(&o, "adapter", &JsValue::NULL);
            set(&o, "features", &Array::new());
            set(&o, "limits", &Object::new());
        }
    }
    o.into()
}

#[wasm_bindgen(js_class = Florence2)]
impl JsFlorence2 {
    /// Where the model can run here: `{supported, webgpu, cpu, device, reason, adapter, features,
    /// limits}` (`supported` is true on either device). Never rejects; opens no device.
    #[wasm_bindgen(js_name = isSupported, unchecked_return_type = "SupportInfo")]
    pub async fn is_supported() -> JsValue {
        probe().await
    }
}
