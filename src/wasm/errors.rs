//! The errors the package rejects with, as JS sees them: a JS `Error` whose `name` is one of
//! [`crate::error::ERROR_NAMES`] (see [`crate::error::Error::name`]), typed by the `Florence2ErrorName`
//! union, and `isFlorence2Error` to narrow a caught value.
//!
//! The three GPU failures a page should handle differently:
//! - `WebGPUUnavailableError`: no `navigator.gpu`, or no adapter; nothing will run (offer a fallback; see
//!   `Florence2.isSupported()`).
//! - `GpuOutOfMemoryError`: an allocation failed (caught by error scopes); when it came from one request's
//!   activations the model is still loaded and the next (smaller) request works.
//! - `DeviceLostError`: the GPU device was lost (driver reset, GPU process crash); the call failed, and the
//!   model reloads itself from the Cache API on the next call (or on `model.reload()`).

use wasm_bindgen::prelude::*;

use crate::error::{ERROR_NAMES, JS_ERROR_NAMES};
use crate::wasm::js::describe_js;

#[wasm_bindgen(typescript_custom_section)]
const TS_ERRORS: &'static str = r#"
/** The `name` of every error florence2-wasm rejects with (`Florence2InitError`: a static method that
 * needs the wasm module was called before `init()`; `Florence2WorkerError`: the `florence2-wasm/worker`
 * worker failed). */
export type Florence2ErrorName =
  | "WebGPUUnavailableError" | "DeviceLostError" | "GpuOutOfMemoryError" | "Florence2GpuError"
  | "Florence2LimitError" | "Florence2ShapeError" | "Florence2LoadError" | "Florence2PromptError"
  | "Florence2ImageError" | "Florence2ImageTooLargeError" | "Florence2TokenizerError"
  | "Florence2CancelledError" | "AbortError" | "Florence2DisposedError" | "Florence2InputError"
  | "Florence2InitError" | "Florence2WorkerError";

/** An error thrown by florence2-wasm: a JS `Error` whose `name` says what failed
 * (`switch (e.name) { case "DeviceLostError": ... }`). */
export interface Florence2Error extends Error {
  name: Florence2ErrorName;
}
"#;

/// `e` is an `Error` whose `name` is one of the package's error names.
#[wasm_bindgen(js_name = isFlorence2Error, unchecked_return_type = "e is Florence2Error")]
pub fn is_florence2_error(#[wasm_bindgen(unchecked_param_type = "unknown")] e: &JsValue) -> bool {
    let name = describe_js(e).0;
    e.is_instance_of::<js_sys::Error>()
        && (ERROR_NAMES.contains(&name.as_str()) || JS_ERROR_NAMES.contains(&name.as_str()))
}
