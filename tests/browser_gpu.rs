//! Browser tests of GPU failures and long runs in the JS facade (`src/wasm.rs`, `src/wasm/recover.rs`,
//! `src/wasm/support.rs`): `wasm-pack test --headless --chrome -- --test browser_gpu` (scripts/test.sh).
//! In headless Chromium's WebGPU (SwiftShader):
//! - `Florence2.isSupported()` describes the adapter; with `navigator.gpu` hidden it says why not, still
//!   offers the CPU backend, and `load` with `device: "webgpu"` rejects with `WebGPUUnavailableError`;
//! - a device destroyed mid-generation rejects that call with `DeviceLostError`; the next call reloads the
//!   model from the Cache API (no model file requested again) and answers exactly as before; the same
//!   with `autoRecover: false` and `reload()`;
//! - a request whose activations do not fit (a test hook adds one buffer of `maxBufferSize`, which
//!   SwiftShader cannot allocate) rejects with `GpuOutOfMemoryError`; the engine's GPU bytes return to
//!   their level before it and the next call answers as before;
//! - a soak of 200 mixed calls on one model.
//!
//! Natively this file compiles to nothing.
#![cfg(target_arch = "wasm32")]

use std::collections::BTreeMap;
use std::rc::Rc;

use florence2_wasm::wasm::{is_florence2_error, JsFlorence2 as Florence2, CACHE_NAME};
use js_sys::{Array, Object, Reflect};
use serde_json::Value;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

#[wasm_bindgen(inline_js = r#"
const files = new Map();
const counts = new Map();
let installed = false;
const PREFIX = () => location.origin + "/__gpu_net__/";
export function net_prefix() { return PREFIX(); }
export function install_net() {
  if (installed) return;
  installed = true;
  const orig = globalThis.fetch.bind(globalThis);
  globalThis.fetch = async (input, init) => {
    const url = typeof input === "string" ? input : input.url;
    if (!url.startsWith(PREFIX())) return orig(input, init);
    const path = url.slice(PREFIX().length);
    counts.set(path, (counts.get(path) || 0) + 1);
    if (init && init.signal && init.signal.aborted) throw new DOMException("aborted", "AbortError");
    const f = files.get(path);
    if (!f) return new Response("not found", { status: 404, statusText: "Not Found" });
    return new Response(f, { headers: { "content-length": String(f.size) } });
  };
}
export function serve(path, bytes) { files.set(path, new Blob([bytes])); }
/// Requests made for `path` so far.
export function requests(path) { return counts.get(path) || 0; }
export function blob_url(bytes) { return URL.createObjectURL(new Blob([bytes])); }
export function blob_of(bytes, type) { return new Blob([bytes], { type }); }
export async function cache_clear(name) { await caches.delete(name); }
export function wasm_bytes(memory) { return memory.buffer.byteLength; }
let saved;
export function hide_webgpu() {
  saved = Object.getOwnPropertyDescriptor(navigator, "gpu");
  Object.defineProperty(navigator, "gpu", { value: undefined, configurable: true });
}
export function restore_webgpu() {
  delete navigator.gpu;
  if (saved) Object.defineProperty(navigator, "gpu", saved);
}
export function sleep(ms) { return new Promise(r => setTimeout(r, ms)); }
"#)]
extern "C" {
    fn net_prefix() -> String;
    fn install_net();
    fn serve(path: &str, bytes: &[u8]);
    fn requests(path: &str) -> u32;
    fn blob_url(bytes: &[u8]) -> String;
    fn blob_of(bytes: &[u8], mime: &str) -> JsValue;
    async fn cache_clear(name: &str) -> JsValue;
    fn wasm_bytes(memory: &JsValue) -> f64;
    fn hide_webgpu();
    fn restore_webgpu();
    async fn sleep(ms: u32) -> JsValue;
}

// ---- fixtures and helpers ---------------------------------------------------------------------------

/// Destroy `m`'s device and wait for the event a real loss gives: the device's `lost` promise resolves
/// (on a busy machine, later than any fixed sleep). Two minutes is only a last guard.
async fn lose_device(m: &Florence2) {
    m.debug_lose_device();
    let gpu = m.debug_gpu();
    let start = js_sys::Date::now();
    while !gpu.is_lost() {
        assert!(
            js_sys::Date::now() - start < 120_000.0,
            "the destroyed device's lost promise did not resolve in 120 s"
        );
        sleep(5).await;
    }
}

const TINY2: &[(&str, &[u8])] = &[
    (
        "config.json",
        include_bytes!("fixtures/models/tiny2/config.json"),
    ),
    (
        "tokenizer.json",
        include_bytes!("fixtures/models/tiny2/tokenizer.json"),
    ),
    (
        "preprocessor_config.json",
        include_bytes!("fixtures/models/tiny2/preprocessor_config.json"),
    ),
    (
        "generation_config.json",
        include_bytes!("fixtures/models/tiny2/generation_config.json"),
    ),
    (
        "model.safetensors",
        include_bytes!("fixtures/models/tiny2/model.safetensors"),
    ),
];
const SCENE_PNG: &[u8] = include_bytes!("fixtures/images/scene.png");
const RGBA_PNG: &[u8] = include_bytes!("fixtures/images/rgba.png");

/// Serve tiny2 under `dir/` on the counting network; its base URL.
fn net_source(dir: &str) -> String {
    install_net();
    for (name, bytes) in TINY2 {
        serve(&format!("{dir}/{name}"), bytes);
    }
    format!("{}{dir}/", net_prefix())
}

/// Requests made for tiny2's files under `dir/` (the optional index probe, answered 404, excluded).
fn model_requests(dir: &str) -> u32 {
    TINY2
        .iter()
        .map(|(name, _)| requests(&format!("{dir}/{name}")))
        .sum()
}

fn blob_source() -> JsValue {
    let o = Object::new();
    for (name, bytes) in TINY2 {
        Reflect::set(&o, &(*name).into(), &blob_url(bytes).into()).unwrap();
    }
    o.into()
}

fn obj(pairs: &[(&str, JsValue)]) -> JsValue {
    let o = Object::new();
    for (k, v) in pairs {
        Reflect::set(&o, &(*k).into(), v).unwrap();
    }
    o.into()
}

fn get(v: &JsValue, k: &str) -> JsValue {
    Reflect::get(v, &k.into()).unwrap()
}

fn to_json(v: &JsValue) -> Value {
    let s: String = js_sys::JSON::stringify(v).unwrap().into();
    serde_json::from_str(&s).unwrap()
}

fn err_name(e: &JsValue) -> String {
    get(e, "name").as_string().unwrap_or_default()
}

fn err_msg(e: &JsValue) -> String {
    get(e, "message").as_string().unwrap_or_default()
}

fn assert_err(e: &JsValue, name: &str, contains: &str) {
    assert!(e.is_instance_of::<js_sys::Error>(), "not a JS Error: {e:?}");
    assert_eq!(err_name(e), name, "message: {}", err_msg(e));
    assert!(
        err_msg(e).contains(contains),
        "{name}: message {:?} lacks {contains:?}",
        err_msg(e)
    );
    assert!(is_florence2_error(e), "isFlorence2Error({name})");
}

async fn run(m: &Florence2, image: JsValue, prompt: &str, opts: JsValue) -> Result<Value, JsValue> {
    let out = JsFuture::from(m.run_task(image, prompt.to_string(), opts)).await?;
    let mut v = to_json(&out);
    // Timings and memory figures differ from call to call; everything else must not.
    v.as_object_mut().unwrap().remove("timings");
    v.as_object_mut().unwrap().remove("memory");
    Ok(v)
}

fn scene() -> JsValue {
    blob_of(SCENE_PNG, "image/png")
}

fn greedy(tokens: u32) -> JsValue {
    obj(&[("maxNewTokens", tokens.into()), ("numBeams", 1.into())])
}

/// `{maxNewTokens, numBeams: 1, onToken}` where `onToken` runs `f` once, at the first token.
fn on_first_token(tokens: u32, f: impl FnOnce() + 'static) -> (JsValue, OnToken) {
    let mut f = Some(f);
    let cb = Closure::<dyn FnMut(JsValue, JsValue)>::new(move |_t: JsValue, _id: JsValue| {
        if let Some(f) = f.take() {
            f();
        }
    });
    let o = greedy(tokens);
    Reflect::set(&o, &"onToken".into(), cb.as_ref()).unwrap();
    (o, cb)
}

/// `Florence2.load` on WebGPU (SwiftShader here, which `device: "auto"` would pass over for the CPU
/// backend) unless `opts` names a device: these tests cover the GPU path and its failures.
async fn load(source: JsValue, opts: JsValue) -> Result<Florence2, JsValue> {
    let opts = if opts.is_object() {
        opts
    } else {
        Object::new().into()
    };
    if !Reflect::has(&opts, &"device".into()).unwrap_or(false) {
        Reflect::set(&opts, &"device".into(), &"webgpu".into()).unwrap();
    }
    Florence2::load(source, opts).await
}

// ---- support probe and WebGPU unavailable -------------------------------------------------------------

#[wasm_bindgen_test]
async fn is_supported_describes_the_adapter_and_says_why_not() {
    let info = to_json(&Florence2::is_supported().await);
    assert_eq!(info["supported"], Value::Bool(true), "{info}");
    assert_eq!(info["webgpu"], Value::Bool(true), "{info}");
    assert_eq!(info["cpu"], Value::Bool(true), "{info}");
    // `device: "auto"` takes the CPU backend over a fallback adapter.
    assert_eq!(info["device"], "cpu", "{info}");
    assert_eq!(info["reason"], "");
    // SwiftShader is a fallback (CPU) adapter.
    assert_eq!(
        info["adapter"]["isFallbackAdapter"],
        Value::Bool(true),
        "{info}"
    );
    assert!(info["features"].is_array());
    let max_buffer = info["limits"]["maxBufferSize"].as_f64().unwrap_or(0.0);
    assert!(max_buffer >= 256.0 * 1024.0 * 1024.0, "{info}");
    assert!(
        info["limits"]["maxComputeInvocationsPerWorkgroup"]
            .as_f64()
            .unwrap_or(0.0)
            >= 256.0
    );

    hide_webgpu();
    let info = to_json(&Florence2::is_supported().await);
    let e = load(blob_source(), obj(&[("cache", false.into())]))
        .await
        .err();
    restore_webgpu();
    // The CPU backend still runs the model.
    assert_eq!(info["supported"], Value::Bool(true), "{info}");
    assert_eq!(info["webgpu"], Value::Bool(false), "{info}");
    assert_eq!(info["cpu"], Value::Bool(true), "{info}");
    assert_eq!(info["device"], "cpu", "{info}");
    assert!(
        info["reason"].as_str().unwrap().contains("navigator.gpu"),
        "{info}"
    );
    assert_eq!(info["adapter"], Value::Null);
    assert_err(
        &e.expect("load without WebGPU"),
        "WebGPUUnavailableError",
        "navigator.gpu",
    );
    // Restored: loads again.
    assert_eq!(
        to_json(&Florence2::is_supported().await)["webgpu"],
        Value::Bool(true)
    );
    assert!(!is_florence2_error(&js_sys::Error::new("plain").into()));
    assert!(!is_florence2_error(&JsValue::from("DeviceLostError")));
}

// ---- device loss -------------------------------------------------------------------------------------

/// A device destroyed during a generation: that call rejects with DeviceLostError; the next call
/// reloads the model from the Cache API (not one model file requested) and answers exactly as before;
/// a loss between calls is recovered the same way.
#[wasm_bindgen_test]
async fn lost_device_fails_the_call_in_flight_and_recovers_from_the_cache() {
    cache_clear(CACHE_NAME).await;
    let dir = "lost";
    let m = Rc::new(
        load(net_source(dir).into(), JsValue::UNDEFINED)
            .await
            .unwrap(),
    );
    assert_eq!(
        model_requests(dir),
        TINY2.len() as u32,
        "first load downloads every file"
    );
    let before = run(&m, scene(), "<CAPTION>", greedy(12)).await.unwrap();
    let od_before = run(&m, scene(), "<OD>", greedy(12)).await.unwrap();
    let encoded = JsFuture::from(m.encode_image(scene(), JsValue::UNDEFINED))
        .await
        .unwrap();
    let on_encoded = run(&m, encoded.clone(), "<CAPTION>", greedy(12));
    assert_eq!(on_encoded.await.unwrap(), before);
    let downloads = model_requests(dir);

    // Lost while generating.
    let m2 = m.clone();
    let (opts, _cb) = on_first_token(12, move || m2.debug_lose_device());
    let e = run(&m, scene(), "<CAPTION>", opts).await.unwrap_err();
    assert_err(&e, "DeviceLostError", "lost");
    // The next call reloads (from the cache) and answers as before.
    assert_eq!(
        run(&m, scene(), "<CAPTION>", greedy(12)).await.unwrap(),
        before
    );
    assert_eq!(
        run(&m, scene(), "<OD>", greedy(12)).await.unwrap(),
        od_before
    );
    assert_eq!(
        model_requests(dir),
        downloads,
        "recovery downloaded model files"
    );
    // An image encoded on the lost device must be encoded again.
    let e = run(&m, encoded, "<CAPTION>", greedy(12)).await.unwrap_err();
    assert_err(&e, "DeviceLostError", "encode the image again");

    // Lost between calls; calls queued behind the first one after the loss also succeed.
    lose_device(&m).await;
    let p1 = m.run_task(scene(), "<CAPTION>".into(), greedy(12));
    let p2 = m.run_task(scene(), "<OD>".into(), greedy(12));
    let strip = |v: JsValue| {
        let mut v = to_json(&v);
        v.as_object_mut().unwrap().remove("timings");
        v.as_object_mut().unwrap().remove("memory");
        v
    };
    assert_eq!(strip(JsFuture::from(p1).await.unwrap()), before);
    assert_eq!(strip(JsFuture::from(p2).await.unwrap()), od_before);
    assert_eq!(
        model_requests(dir),
        downloads,
        "recovery downloaded model files"
    );
    cache_clear(CACHE_NAME).await;
}

/// With `autoRecover: false` calls reject with DeviceLostError until `reload()`; reload() after
/// dispose() rejects with Florence2DisposedError.
#[wasm_bindgen_test]
async fn without_auto_recover_calls_fail_until_reload() {
    cache_clear(CACHE_NAME).await;
    let dir = "manual";
    let m = load(
        net_source(dir).into(),
        obj(&[("autoRecover", false.into())]),
    )
    .await
    .unwrap();
    let before = run(&m, scene(), "<CAPTION>", greedy(10)).await.unwrap();
    let downloads = model_requests(dir);
    lose_device(&m).await;
    for _ in 0..2 {
        let e = run(&m, scene(), "<CAPTION>", greedy(10)).await.unwrap_err();
        assert_err(&e, "DeviceLostError", "reload()");
    }
    // reload() reports progress from the cache.
    let events = Array::new();
    let on_progress = {
        let events = events.clone();
        Closure::<dyn FnMut(JsValue)>::new(move |e: JsValue| {
            events.push(&e);
        })
    };
    JsFuture::from(m.reload(obj(&[("onProgress", on_progress.as_ref().clone())])))
        .await
        .unwrap();
    assert_eq!(
        model_requests(dir),
        downloads,
        "reload downloaded model files"
    );
    let last = to_json(&events.get(events.length() - 1));
    assert_eq!(last["status"], "ready");
    assert!(events
        .iter()
        .map(|e| to_json(&e))
        .filter(|e| e["file"] == "model.safetensors" && e["status"] == "done")
        .all(|e| e["cached"] == Value::Bool(true)));
    assert_eq!(
        run(&m, scene(), "<CAPTION>", greedy(10)).await.unwrap(),
        before
    );
    m.dispose();
    let e = JsFuture::from(m.reload(JsValue::UNDEFINED))
        .await
        .unwrap_err();
    assert_err(&e, "Florence2DisposedError", "disposed");
    cache_clear(CACHE_NAME).await;
}

// ---- GPU out of memory ---------------------------------------------------------------------------------

/// A request whose activations cannot be allocated rejects with GpuOutOfMemoryError; its buffers are
/// released (the engine's GPU bytes return to their level before it) and the model keeps answering.
#[wasm_bindgen_test]
async fn out_of_memory_in_one_request_leaves_the_model_usable() {
    let m = load(blob_source(), obj(&[("cache", false.into())]))
        .await
        .unwrap();
    let before = run(&m, scene(), "<CAPTION>", greedy(10)).await.unwrap();
    let base = m.debug_gpu_memory();
    // SwiftShader accepts buffers up to maxBufferSize (1 GiB) but cannot back one that large
    // (vkAllocateMemory: VK_ERROR_OUT_OF_DEVICE_MEMORY, measured): a real allocation failure.
    let max = m.debug_gpu().caps.max_buffer;
    m.debug_allocate_in_next_call(max);
    let e = run(&m, scene(), "<CAPTION>", greedy(10)).await.unwrap_err();
    assert_err(&e, "GpuOutOfMemoryError", "out of memory");
    let after = m.debug_gpu_memory();
    assert_eq!(
        after.current_bytes, base.current_bytes,
        "GPU bytes after the failed request"
    );
    assert!(
        after.peak_bytes >= base.current_bytes + max,
        "the failed buffer was counted while alive"
    );
    assert_eq!(
        run(&m, scene(), "<CAPTION>", greedy(10)).await.unwrap(),
        before
    );
    assert_eq!(
        run(&m, scene(), "<OD>", greedy(10)).await.map(|_| ()),
        Ok(())
    );
    m.dispose();
}

// ---- soak ------------------------------------------------------------------------------------------------

/// What one soak call is and what it must give.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Caption,
    Od,
    CaptionBeams,
    Grounding,
    OcrImageData,
    UnknownTask,
    ExtraText,
    EmptyPrompt,
    RegionWithoutBox,
    PreAborted,
    AbortMidDecode,
    NotAnImage,
    TruncatedPng,
    NotABlob,
    OutOfMemory,
}

impl Kind {
    const ALL: [Kind; 15] = [
        Kind::Caption,
        Kind::Od,
        Kind::CaptionBeams,
        Kind::Grounding,
        Kind::OcrImageData,
        Kind::UnknownTask,
        Kind::ExtraText,
        Kind::EmptyPrompt,
        Kind::RegionWithoutBox,
        Kind::PreAborted,
        Kind::AbortMidDecode,
        Kind::NotAnImage,
        Kind::TruncatedPng,
        Kind::NotABlob,
        Kind::OutOfMemory,
    ];

    /// `None`: a valid call (its answer must equal the first one of its kind); else the error name.
    fn expected_error(self) -> Option<&'static str> {
        match self {
            Kind::Caption
            | Kind::Od
            | Kind::CaptionBeams
            | Kind::Grounding
            | Kind::OcrImageData => None,
            Kind::UnknownTask | Kind::ExtraText | Kind::EmptyPrompt | Kind::RegionWithoutBox => {
                Some("Florence2PromptError")
            }
            Kind::PreAborted | Kind::AbortMidDecode => Some("AbortError"),
            Kind::NotAnImage | Kind::TruncatedPng | Kind::NotABlob => Some("Florence2ImageError"),
            Kind::OutOfMemory => Some("GpuOutOfMemoryError"),
        }
    }
}

/// RGBA pixels of rgba.png as ImageData (pixels owned by JS).
fn rgba_image_data() -> JsValue {
    use florence2_wasm::processor::image::{decode_image, ImageLimits};
    let rgb = decode_image(RGBA_PNG, &ImageLimits::default()).unwrap();
    let (w, h) = (rgb.width(), rgb.height());
    let mut rgba = Vec::with_capacity((w * h * 4) as usize);
    for px in rgb.as_raw().chunks_exact(3) {
        rgba.extend_from_slice(&[px[0], px[1], px[2], 255]);
    }
    // A JS-owned copy: `new_with_u8_clamped_array_and_sh` would wrap a view of wasm memory, which the
    // allocator reuses once `rgba` is dropped.
    let pixels = js_sys::Uint8ClampedArray::from(&rgba[..]);
    web_sys::ImageData::new_with_js_u8_clamped_array_and_sh(&pixels, w, h)
        .unwrap()
        .into()
}

/// A started call and the callback it may need alive.
type Started = (js_sys::Promise, Option<OnToken>);
type OnToken = Closure<dyn FnMut(JsValue, JsValue)>;

/// Start one call of `kind` (not awaited). The closure that aborts mid-decode lives as long as the
/// promise needs it.
fn start(m: &Florence2, kind: Kind, max_buffer: u64) -> Started {
    let call = |image: JsValue, prompt: &str, opts: JsValue| m.run_task(image, prompt.into(), opts);
    let mut keep = None;
    let p = match kind {
        Kind::Caption => call(scene(), "<CAPTION>", greedy(6)),
        Kind::Od => call(scene(), "<OD>", greedy(6)),
        Kind::CaptionBeams => call(
            scene(),
            "<CAPTION>",
            obj(&[("maxNewTokens", 4.into()), ("numBeams", 2.into())]),
        ),
        Kind::Grounding => call(
            scene(),
            "<CAPTION_TO_PHRASE_GROUNDING>a red square",
            greedy(6),
        ),
        Kind::OcrImageData => call(rgba_image_data(), "<OCR>", greedy(6)),
        Kind::UnknownTask => call(scene(), "<NOT_A_TASK>", greedy(6)),
        Kind::ExtraText => call(scene(), "<CAPTION>unexpected text", greedy(6)),
        Kind::EmptyPrompt => call(scene(), "", greedy(6)),
        Kind::RegionWithoutBox => call(scene(), "<REGION_TO_CATEGORY>", greedy(6)),
        Kind::PreAborted => {
            let ctrl = web_sys::AbortController::new().unwrap();
            ctrl.abort();
            let o = greedy(6);
            Reflect::set(&o, &"signal".into(), &ctrl.signal()).unwrap();
            call(scene(), "<CAPTION>", o)
        }
        Kind::AbortMidDecode => {
            let ctrl = web_sys::AbortController::new().unwrap();
            let signal = ctrl.signal();
            let (o, cb) = on_first_token(6, move || ctrl.abort());
            Reflect::set(&o, &"signal".into(), &signal).unwrap();
            keep = Some(cb);
            call(scene(), "<CAPTION>", o)
        }
        Kind::NotAnImage => call(
            blob_of(b"not an image at all", "image/png"),
            "<CAPTION>",
            greedy(6),
        ),
        Kind::TruncatedPng => call(
            blob_of(&SCENE_PNG[..SCENE_PNG.len() / 3], "image/png"),
            "<CAPTION>",
            greedy(6),
        ),
        Kind::NotABlob => call(JsValue::from(42), "<CAPTION>", greedy(6)),
        Kind::OutOfMemory => {
            m.debug_allocate_in_next_call(max_buffer);
            // Issued alone (see the schedule), so the hook applies to this call.
            call(scene(), "<CAPTION>", greedy(6))
        }
    };
    (p, keep)
}

/// 200 calls on one loaded model, issued in bursts of up to 10 without awaiting (so they queue), in a
/// fixed pseudo-random mix of 15 kinds: 5 valid tasks (greedy, beams, grounding text, ImageData), 4
/// invalid prompts, aborted before and during decoding, 3 kinds of bad image, and requests that run
/// out of GPU memory. Every call must end with an answer or the named error of its kind; every valid
/// answer must equal the first answer of its kind; afterwards the wasm memory and the engine's GPU
/// bytes must be back at their level after the warm-up (one call of each kind).
#[wasm_bindgen_test]
async fn soak_200_mixed_calls() {
    const CALLS: usize = 200;
    let m = load(blob_source(), obj(&[("cache", false.into())]))
        .await
        .unwrap();
    let max_buffer = m.debug_gpu().caps.max_buffer;
    let mem = wasm_bindgen::memory();

    let mut first: BTreeMap<Kind, Value> = BTreeMap::new();
    let mut outcomes: BTreeMap<(Kind, String), usize> = BTreeMap::new();
    let mut check = |kind: Kind, r: Result<JsValue, JsValue>, first: &mut BTreeMap<Kind, Value>| {
        let label = match (kind.expected_error(), r) {
            (None, Ok(out)) => {
                let mut v = to_json(&out);
                v.as_object_mut().unwrap().remove("timings");
                v.as_object_mut().unwrap().remove("memory");
                let want = first.entry(kind).or_insert_with(|| v.clone());
                assert_eq!(&v, want, "{kind:?}: answer differs from its first answer");
                "ok".to_string()
            }
            (Some(name), Err(e)) => {
                assert_eq!(err_name(&e), name, "{kind:?}: {}", err_msg(&e));
                assert!(is_florence2_error(&e));
                name.to_string()
            }
            (None, Err(e)) => panic!("{kind:?} failed: {}: {}", err_name(&e), err_msg(&e)),
            (Some(name), Ok(out)) => {
                panic!("{kind:?} should fail with {name}, got {}", to_json(&out))
            }
        };
        *outcomes.entry((kind, label)).or_default() += 1;
    };

    // Warm-up: one call of each kind, in order (kernels compiled, uniform pages pooled, allocator and
    // tokenizer caches grown).
    for kind in Kind::ALL {
        let (p, _keep) = start(&m, kind, max_buffer);
        check(kind, JsFuture::from(p).await, &mut first);
    }
    let wasm0 = wasm_bytes(&mem);
    let gpu0 = m.debug_gpu_memory();

    // The schedule: a fixed linear congruential sequence over the kinds.
    let mut state = 0x2545_f491_u32;
    let mut next = || {
        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        state >> 8
    };
    let t0 = js_sys::Date::now();
    let mut done = 0;
    while done < CALLS {
        let burst = (1 + next() as usize % 10).min(CALLS - done);
        let mut calls = Vec::new();
        for _ in 0..burst {
            let kind = Kind::ALL[next() as usize % Kind::ALL.len()];
            if kind == Kind::OutOfMemory && !calls.is_empty() {
                // The hook applies to the next call to start: keep it alone in its burst.
                continue;
            }
            calls.push((kind, start(&m, kind, max_buffer)));
            if kind == Kind::OutOfMemory {
                break;
            }
        }
        for (kind, (p, _keep)) in calls {
            check(kind, JsFuture::from(p).await, &mut first);
            done += 1;
        }
    }
    let secs = (js_sys::Date::now() - t0) / 1e3;
    let wasm1 = wasm_bytes(&mem);
    let gpu1 = m.debug_gpu_memory();

    let mut summary = String::new();
    for ((kind, label), n) in &outcomes {
        summary.push_str(&format!("\n  {kind:?} -> {label}: {n}"));
    }
    web_sys::console::log_1(
        &format!(
            "soak: {done} calls after a warm-up of {} in {secs:.1} s; outcomes (warm-up included):{summary}\n\
             wasm memory {:.2} MiB -> {:.2} MiB; engine GPU bytes (weights + activations) {} -> {} \
             (weights {}), peak {}",
            Kind::ALL.len(),
            wasm0 / 1048576.0,
            wasm1 / 1048576.0,
            gpu0.current_bytes,
            gpu1.current_bytes,
            gpu1.weights_bytes,
            gpu1.peak_bytes
        )
        .into(),
    );
    assert_eq!(done, CALLS);
    let total: usize = outcomes.values().sum();
    assert_eq!(total, CALLS + Kind::ALL.len(), "every call settled");
    for kind in Kind::ALL {
        assert!(
            outcomes.keys().any(|(k, _)| *k == kind),
            "{kind:?} never ran"
        );
    }
    assert_eq!(
        gpu1.current_bytes, gpu0.current_bytes,
        "engine GPU bytes back to the baseline"
    );
    assert_eq!(gpu1.weights_bytes, gpu0.weights_bytes);
    assert_eq!(wasm1, wasm0, "wasm memory grew during the soak");
    m.dispose();
}
