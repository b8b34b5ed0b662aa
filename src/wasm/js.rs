//! Small JS interop helpers of the facade: errors both ways, option lookups, serialization.

use js_sys::{Function, Object, Reflect};
use serde::Serialize;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::AbortSignal;

use crate::error::{Error, Result};

/// Yield to the event loop for one task (`setTimeout(0)`), letting pending promise callbacks and
/// events (such as `device.lost`) run.
pub use crate::gpu::next_task;

/// A JS `Error` whose `name` is [`Error::name`] and whose `message` is the error's text.
pub fn js_error(e: &Error) -> JsValue {
    let err = js_sys::Error::new(&e.to_string());
    err.set_name(e.name());
    err.into()
}

/// The `name` and `message` of a thrown JS value (an `Error`, a `DOMException`, or anything else).
pub fn describe_js(v: &JsValue) -> (String, String) {
    let get = |k: &str| {
        Reflect::get(v, &JsValue::from_str(k))
            .ok()
            .and_then(|x| x.as_string())
    };
    if v.is_object() {
        let name = get("name").unwrap_or_else(|| "Error".into());
        let msg = get("message").unwrap_or_default();
        (name, msg)
    } else {
        (
            "Error".into(),
            v.as_string().unwrap_or_else(|| format!("{v:?}")),
        )
    }
}

/// Map a JS failure while reading `file` to our error: a DOM `AbortError` stays an abort, the rest is a
/// read failure (network error, CORS, ...).
pub fn read_error(file: &str, v: &JsValue) -> Error {
    let (name, msg) = describe_js(v);
    if name == "AbortError" {
        Error::Aborted(format!("reading {file}: {msg}"))
    } else {
        Error::FileRead {
            file: file.to_owned(),
            msg: format!("{name}: {msg}"),
        }
    }
}

/// `signal.aborted` as an error.
pub fn check_signal(signal: Option<&AbortSignal>, what: &str) -> Result<()> {
    match signal {
        Some(s) if s.aborted() => {
            let reason = s.reason();
            let (_, msg) = describe_js(&reason);
            Err(Error::Aborted(if msg.is_empty() {
                what.to_owned()
            } else {
                format!("{what}: {msg}")
            }))
        }
        _ => Ok(()),
    }
}

/// `obj[key]` when `obj` is an object and the value is neither `undefined` nor `null`.
pub fn opt_get(obj: &JsValue, key: &str) -> Option<JsValue> {
    if !obj.is_object() {
        return None;
    }
    Reflect::get(obj, &JsValue::from_str(key))
        .ok()
        .filter(|v| !v.is_undefined() && !v.is_null())
}

/// An optional option `key` converted by `conv`; a value it refuses is an error saying the option
/// must be `what`.
fn opt_as<T>(
    obj: &JsValue,
    key: &str,
    what: &str,
    conv: impl FnOnce(JsValue) -> Option<T>,
) -> Result<Option<T>> {
    match opt_get(obj, key) {
        None => Ok(None),
        Some(v) => conv(v)
            .map(Some)
            .ok_or_else(|| Error::InvalidInput(format!("option {key} must be {what}"))),
    }
}

/// An optional callback option.
pub fn opt_fn(obj: &JsValue, key: &str) -> Result<Option<Function>> {
    opt_as(obj, key, "a function", |v| v.dyn_into::<Function>().ok())
}

/// An optional boolean option.
pub fn opt_bool(obj: &JsValue, key: &str) -> Result<Option<bool>> {
    opt_as(obj, key, "a boolean", |v| v.as_bool())
}

/// An optional non-negative integer option no larger than `max`.
pub fn opt_uint(obj: &JsValue, key: &str, max: f64) -> Result<Option<u64>> {
    match opt_get(obj, key) {
        None => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if x >= 0.0 && x.fract() == 0.0 && x <= max => Ok(Some(x as u64)),
            _ => Err(Error::InvalidInput(format!(
                "option {key} must be an integer between 0 and {max}"
            ))),
        },
    }
}

/// An optional string option.
pub fn opt_string(obj: &JsValue, key: &str) -> Result<Option<String>> {
    opt_as(obj, key, "a string", |v| v.as_string())
}

/// An optional `AbortSignal` option.
pub fn opt_signal(obj: &JsValue, key: &str) -> Result<Option<AbortSignal>> {
    opt_as(obj, key, "an AbortSignal", |v| {
        v.dyn_into::<AbortSignal>().ok()
    })
}

/// Serialize to plain JS values (objects, not `Map`s; numbers as JS numbers).
pub fn to_js<T: Serialize + ?Sized>(v: &T) -> Result<JsValue> {
    let ser = serde_wasm_bindgen::Serializer::new().serialize_maps_as_objects(true);
    v.serialize(&ser)
        .map_err(|e| Error::InvalidInput(format!("serializing a result: {e}")))
}

/// Set `obj[key] = value` (never fails on a plain object).
pub fn set(obj: &Object, key: &str, value: &JsValue) {
    let _ = Reflect::set(obj, &JsValue::from_str(key), value);
}

/// Call a user callback with one argument; a throwing callback is reported on the console and ignored.
pub fn call1(f: &Function, arg: &JsValue) {
    if let Err(e) = f.call1(&JsValue::NULL, arg) {
        let (name, msg) = describe_js(&e);
        web_sys::console::warn_1(&JsValue::from_str(&format!(
            "florence2-wasm: a callback threw {name}: {msg}"
        )));
    }
}

/// Call a user callback with two arguments (see [`call1`]).
pub fn call2(f: &Function, a: &JsValue, b: &JsValue) {
    if let Err(e) = f.call2(&JsValue::NULL, a, b) {
        let (name, msg) = describe_js(&e);
        web_sys::console::warn_1(&JsValue::from_str(&format!(
            "florence2-wasm: a callback threw {name}: {msg}"
        )));
    }
}

/// Whether a response says it is an HTML page (`Content-Type: text/html`): what a server's fallback
/// page answers for a missing file.
pub fn is_html(resp: &web_sys::Response) -> bool {
    resp.headers()
        .get("content-type")
        .ok()
        .flatten()
        .is_some_and(|t| t.trim().to_ascii_lowercase().starts_with("text/html"))
}

/// A Promise of `f`'s value; an error rejects it with its named JS error.
pub fn promise<F>(f: F) -> js_sys::Promise
where
    F: std::future::Future<Output = Result<JsValue>> + 'static,
{
    wasm_bindgen_futures::future_to_promise(async move { f.await.map_err(|e| js_error(&e)) })
}
