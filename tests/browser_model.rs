//! Browser tests of the JS facade (`src/wasm.rs`): run with `wasm-pack test --headless --chrome --
//! --test browser_model` (scripts/test.sh). In headless Chromium's WebGPU (SwiftShader):
//! - load through the streaming fetch path (blob: URLs, and same-origin http URLs answered by a fake
//!   network that wraps `globalThis.fetch` and counts requests);
//! - `runTask` on `scene.png` as a Blob for `<CAPTION>`, `<OD>`, `<OCR_WITH_REGION>` equals the native CLI's
//!   answer (tests/fixtures/browser/cli_expected.json, recorded by scripts/fixtures/record_browser_expected.sh; the
//!   CLI itself is checked against the Python reference by tests/model/text_parity.rs);
//! - `tiles: "2x2"` on scene.png equals the CLI's tiled answer (tests/fixtures/browser/tiles_expected.json);
//! - abort mid-decode rejects with `AbortError` and the next call succeeds; concurrent calls queue;
//! - named errors for an invalid prompt, a 404, a truncated file, a short body, a bad header;
//! - progress events in order; a cached second load makes no request; `cache: false` stores nothing;
//! - peak wasm memory while streaming a synthetic ~320 MB checkpoint stays under 64 MiB + one chunk.
//!
//! Natively this file compiles to nothing.
#![cfg(target_arch = "wasm32")]

use florence2_wasm::config::tensors::expected_tensors;
use florence2_wasm::config::Florence2Config;
use florence2_wasm::postprocess::post_process_generation;
use florence2_wasm::processor::image::{decode_image, ImageLimits};
use florence2_wasm::processor::prompt::Task;
use florence2_wasm::wasm::{JsFlorence2 as Florence2, CACHE_NAME, PIECE_BYTES};
use js_sys::{Array, Object, Reflect, Uint8Array};
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

#[wasm_bindgen(inline_js = r#"
const files = new Map();
let count = 0;
let installed = false;
const PREFIX = () => location.origin + "/__fake_net__/";
export function fake_prefix() { return PREFIX(); }
export function install_fake_net() {
  if (installed) return;
  installed = true;
  const orig = globalThis.fetch.bind(globalThis);
  globalThis.fetch = async (input, init) => {
    const url = typeof input === "string" ? input : input.url;
    if (!url.startsWith(PREFIX())) return orig(input, init);
    count++;
    if (init && init.signal && init.signal.aborted) throw new DOMException("aborted", "AbortError");
    const f = files.get(url.slice(PREFIX().length));
    if (!f) return new Response("not found", { status: 404, statusText: "Not Found" });
    if (f.announce !== undefined) {
      // A body shorter than its Content-Length (a connection cut mid-file).
      const bytes = f.bytes;
      const body = new ReadableStream({ start(c) { c.enqueue(bytes.slice()); c.close(); } });
      return new Response(body, { headers: { "content-length": String(f.announce) } });
    }
    return new Response(f.blob, { headers: { "content-length": String(f.blob.size) } });
  };
}
export function serve(path, bytes) { files.set(path, { blob: new Blob([bytes]) }); }
export function serve_short(path, bytes, announce) { files.set(path, { bytes: bytes.slice(), announce }); }
export function net_count() { return count; }
export function blob_url(bytes) { return URL.createObjectURL(new Blob([bytes])); }
export function blob_of(bytes, type) { return new Blob([bytes], { type }); }
export function origin() { return location.origin; }
export function big_blob_url(head, piece, pieces, tail_len) {
  const parts = [head];
  for (let i = 0; i < pieces; i++) parts.push(piece);
  parts.push(piece.subarray(0, tail_len));
  const b = new Blob(parts);
  return [URL.createObjectURL(b), b.size];
}
export function wasm_bytes(memory) { return memory.buffer.byteLength; }
export async function cache_has(name, url) {
  const c = await caches.open(name);
  return (await c.match(url)) !== undefined;
}
export async function cache_clear(name) { await caches.delete(name); }
export async function cache_delete(name, url) { return (await caches.open(name)).delete(url); }
export async function cache_put_text(name, url, text) { await (await caches.open(name)).put(url, new Response(text)); }
export function meta_key(url) { return "https://florence2-wasm.invalid/meta?url=" + encodeURIComponent(url); }
export function typeof_(v) { return typeof v; }
"#)]
extern "C" {
    fn fake_prefix() -> String;
    fn install_fake_net();
    fn serve(path: &str, bytes: &[u8]);
    fn serve_short(path: &str, bytes: &[u8], announce: f64);
    fn net_count() -> u32;
    fn blob_url(bytes: &[u8]) -> String;
    fn blob_of(bytes: &[u8], mime: &str) -> JsValue;
    fn origin() -> String;
    fn big_blob_url(head: &[u8], piece: &Uint8Array, pieces: u32, tail_len: u32) -> Array;
    fn wasm_bytes(memory: &JsValue) -> f64;
    async fn cache_has(name: &str, url: &str) -> JsValue;
    async fn cache_clear(name: &str) -> JsValue;
    async fn cache_delete(name: &str, url: &str) -> JsValue;
    async fn cache_put_text(name: &str, url: &str, text: &str) -> JsValue;
    fn meta_key(url: &str) -> String;
    fn typeof_(v: &JsValue) -> String;
}

// ---- fixtures ---------------------------------------------------------------------------------------

macro_rules! model_files {
    ($dir:literal, [$($f:literal),*]) => {
        &[$(($f, include_bytes!(concat!("fixtures/models/", $dir, "/", $f)) as &[u8])),*]
    };
}

type Files = &'static [(&'static str, &'static [u8])];

const COMMON: [&str; 4] = [
    "config.json",
    "tokenizer.json",
    "preprocessor_config.json",
    "generation_config.json",
];

fn model(dir: &str) -> Files {
    match dir {
        "tiny2" => model_files!(
            "tiny2",
            [
                "config.json",
                "tokenizer.json",
                "preprocessor_config.json",
                "generation_config.json",
                "model.safetensors"
            ]
        ),
        "tiny4" => model_files!(
            "tiny4",
            [
                "config.json",
                "tokenizer.json",
                "preprocessor_config.json",
                "generation_config.json",
                "model.safetensors"
            ]
        ),
        "tiny4-f16-sharded" => model_files!(
            "tiny4-f16-sharded",
            [
                "config.json",
                "tokenizer.json",
                "preprocessor_config.json",
                "generation_config.json",
                "model.safetensors.index.json",
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"
            ]
        ),
        "tiny2-q8" => model_files!(
            "tiny2-q8",
            [
                "config.json",
                "tokenizer.json",
                "preprocessor_config.json",
                "generation_config.json",
                "model.safetensors"
            ]
        ),
        "tiny2-orig-q4-sharded" => model_files!(
            "tiny2-orig-q4-sharded",
            [
                "config.json",
                "tokenizer.json",
                "preprocessor_config.json",
                "generation_config.json",
                "model.safetensors.index.json",
                "model-00001-of-00003.safetensors",
                "model-00002-of-00003.safetensors",
                "model-00003-of-00003.safetensors"
            ]
        ),
        "tiny2-pt" => model_files!(
            "tiny2-pt",
            [
                "config.json",
                "tokenizer.json",
                "preprocessor_config.json",
                "generation_config.json",
                "pytorch_model.bin"
            ]
        ),
        "tiny2-orig-pt-sharded" => model_files!(
            "tiny2-orig-pt-sharded",
            [
                "config.json",
                "tokenizer.json",
                "preprocessor_config.json",
                "generation_config.json",
                "pytorch_model.bin.index.json",
                "pytorch_model-00001-of-00003.bin",
                "pytorch_model-00002-of-00003.bin",
                "pytorch_model-00003-of-00003.bin"
            ]
        ),
        _ => panic!("no fixture {dir}"),
    }
}

fn file_of(files: Files, name: &str) -> &'static [u8] {
    files.iter().find(|(n, _)| *n == name).unwrap().1
}

const SCENE_PNG: &[u8] = include_bytes!("fixtures/images/scene.png");
const RGBA_PNG: &[u8] = include_bytes!("fixtures/images/rgba.png");
const CLI_EXPECTED: &str = include_str!("fixtures/browser/cli_expected.json");
const TILES_EXPECTED: &str = include_str!("fixtures/browser/tiles_expected.json");

fn image_bytes(name: &str) -> &'static [u8] {
    match name {
        "scene.png" => SCENE_PNG,
        "rgba.png" => RGBA_PNG,
        _ => panic!("no image {name}"),
    }
}

fn expected() -> Vec<Value> {
    serde_json::from_str::<Value>(CLI_EXPECTED)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

/// The CLI's answer; `beams` None: the model's generation_config.json (3 beams), Some(1): greedy.
fn expected_for(model: &str, image: &str, prompt: &str, beams: Option<u64>) -> Value {
    expected()
        .into_iter()
        .find(|c| {
            c["model"] == model
                && c["image"] == image
                && c["prompt"] == prompt
                && c["num_beams"].as_u64() == beams
        })
        .unwrap_or_else(|| panic!("no expected answer for {model} {image} {prompt} {beams:?}"))
}

/// `{file: blobURL}` for a model dir.
fn blob_source(files: Files) -> JsValue {
    let o = Object::new();
    for (name, bytes) in files {
        Reflect::set(&o, &(*name).into(), &blob_url(bytes).into()).unwrap();
    }
    o.into()
}

/// Serve a model dir on the fake network under `path/`; returns the base URL.
fn fake_source(path: &str, files: Files) -> String {
    install_fake_net();
    for (name, bytes) in files {
        serve(&format!("{path}/{name}"), bytes);
    }
    format!("{}{path}/", fake_prefix())
}

// ---- helpers ----------------------------------------------------------------------------------------

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

async fn run(
    m: &Florence2,
    image: JsValue,
    prompt: &str,
    opts: JsValue,
) -> Result<JsValue, JsValue> {
    JsFuture::from(m.run_task(image, prompt.to_string(), opts)).await
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
}

/// Compare a runTask output with the CLI's answer: same task, ids, generated text, result, rendering.
fn check_output(out: &JsValue, case: &Value) {
    let cli = &case["cli"];
    let what = format!(
        "{} {} {} beams {}",
        case["model"], case["image"], case["prompt"], case["num_beams"]
    );
    let got = to_json(out);
    assert_eq!(got["task"], cli["task"], "{what}: task");
    assert_eq!(got["tokenIds"], cli["token_ids"], "{what}: token ids");
    assert_eq!(
        got["generatedText"], cli["generated_text"],
        "{what}: generated text"
    );
    assert_eq!(got["result"], cli["result"], "{what}: result");
    assert_eq!(got["text"], cli["text"], "{what}: text");
    // Plain JS values: an Array of JS numbers, plain objects, numbers for coordinates.
    let ids = get(out, "tokenIds");
    assert!(Array::is_array(&ids), "{what}: tokenIds is not an Array");
    assert_eq!(typeof_(&Array::from(&ids).get(0)), "number");
    let result = get(out, "result");
    assert_eq!(
        Object::get_prototype_of(&result),
        Object::get_prototype_of(&Object::new()),
        "{what}: result is not a plain object"
    );
    let marker = cli["task"].as_str().unwrap();
    let value = get(&result, marker);
    for key in ["bboxes", "quad_boxes"] {
        let boxes = Reflect::get(&value, &key.into()).unwrap_or(JsValue::UNDEFINED);
        if Array::is_array(&boxes) && Array::from(&boxes).length() > 0 {
            let first = Array::from(&Array::from(&boxes).get(0));
            assert_eq!(typeof_(&first.get(0)), "number", "{what}: {key} coordinate");
        }
    }
    for k in ["preprocess", "encode", "decode", "total"] {
        let t = get(&get(out, "timings"), k).as_f64().unwrap();
        assert!(t >= 0.0, "{what}: timing {k}");
    }
    web_sys::console::log_1(
        &format!(
            "{what}: identical to the CLI ({} tokens, {:.0} ms)",
            cli["token_ids"].as_array().unwrap().len(),
            get(&get(out, "timings"), "total").as_f64().unwrap()
        )
        .into(),
    );
}

/// `{maxNewTokens, numBeams?}` of a case (no numBeams: the model's default).
fn max_new(case: &Value) -> JsValue {
    let o = obj(&[(
        "maxNewTokens",
        case["max_new_tokens"].as_f64().unwrap().into(),
    )]);
    if let Some(b) = case["num_beams"].as_f64() {
        Reflect::set(&o, &"numBeams".into(), &b.into()).unwrap();
    }
    o
}

async fn run_case(m: &Florence2, case: &Value) -> JsValue {
    let img = blob_of(image_bytes(case["image"].as_str().unwrap()), "image/png");
    run(m, img, case["prompt"].as_str().unwrap(), max_new(case))
        .await
        .unwrap()
}

// ---- tests ------------------------------------------------------------------------------------------

/// tiny2 (blob: URLs) and tiny4 (same-origin http on the fake network): every scene.png case, plus
/// rgba.png's OCR (a non-empty region), equals the CLI.
#[wasm_bindgen_test]
async fn run_task_matches_cli_tiny2_tiny4() {
    let m = load(blob_source(model("tiny2")), obj(&[("cache", false.into())]))
        .await
        .unwrap();
    for case in expected().iter().filter(|c| c["model"] == "tiny2") {
        let out = run_case(&m, case).await;
        check_output(&out, case);
    }
    m.dispose();
    let base = fake_source("tiny4", model("tiny4"));
    let m = load(base.into(), obj(&[("cache", false.into())]))
        .await
        .unwrap();
    for case in expected().iter().filter(|c| c["model"] == "tiny4") {
        let out = run_case(&m, case).await;
        check_output(&out, case);
    }
    m.dispose();
}

/// `tiles: "2x2"` on scene.png (tiny2, greedy): the page runs the views one after another (no batched
/// vision tower or encoder in wasm) and the merged answer and what was chosen equal the CLI's `florence2
/// run --tiles 2x2` (tests/fixtures/browser/tiles_expected.json, recorded by
/// scripts/fixtures/record_browser_expected.sh); tiles on a task that cannot tile, or on an `EncodedImage`, are
/// named errors.
#[wasm_bindgen_test]
async fn tiled_run_task_matches_cli() {
    let want: Value = serde_json::from_str(TILES_EXPECTED).unwrap();
    let m = load(blob_source(model("tiny2")), obj(&[("cache", false.into())]))
        .await
        .unwrap();
    let opts = |tiles: &str| {
        obj(&[
            ("maxNewTokens", 24.into()),
            ("numBeams", 1.into()),
            ("tiles", tiles.into()),
        ])
    };
    let img = || blob_of(SCENE_PNG, "image/png");
    let got = to_json(&run(&m, img(), "<OD>", opts("2x2")).await.unwrap());
    assert_eq!(got["tiles"], want["tiles"]);
    assert_eq!(got["result"], want["result"]);
    assert_eq!(got["text"], want["text"]);
    assert_eq!(got["tokenIds"], json!([]));
    let e = run(&m, img(), "<CAPTION>", opts("auto")).await.unwrap_err();
    assert_err(&e, "Florence2PromptError", "cannot be tiled");
    let e = run(&m, img(), "<OD>", opts("5x5")).await.unwrap_err();
    assert_err(&e, "Florence2InputError", "2 to 16 tiles");
    let enc = JsFuture::from(m.encode_image(img(), JsValue::UNDEFINED))
        .await
        .unwrap();
    let e = run(&m, enc, "<OD>", opts("2x2")).await.unwrap_err();
    assert_err(&e, "Florence2InputError", "EncodedImage");
    m.dispose();
}

/// The CPU backend in the page: `device: "cpu"` answers every tiny2 case as the CLI does (the same
/// model over the `crate::cpu` kernels, single-threaded wasm); with `navigator.gpu` hidden, `auto`
/// falls back to it.
#[wasm_bindgen_test]
async fn cpu_device_answers_like_the_cli_and_auto_falls_back_to_it() {
    let m = load(
        blob_source(model("tiny2")),
        obj(&[("cache", false.into()), ("device", "cpu".into())]),
    )
    .await
    .unwrap();
    assert!(
        m.adapter_info().contains("CPU backend"),
        "{}",
        m.adapter_info()
    );
    for case in expected().iter().filter(|c| c["model"] == "tiny2") {
        let out = run_case(&m, case).await;
        check_output(&out, case);
    }
    m.dispose();
    let nav = Reflect::get(&js_sys::global(), &"navigator".into()).unwrap();
    let desc = js_sys::Object::new();
    Reflect::set(&desc, &"value".into(), &JsValue::UNDEFINED).unwrap();
    Reflect::set(&desc, &"configurable".into(), &true.into()).unwrap();
    js_sys::Object::define_property(&nav.clone().into(), &"gpu".into(), &desc);
    let m = load(
        blob_source(model("tiny2")),
        obj(&[("cache", false.into()), ("device", "auto".into())]),
    )
    .await;
    Reflect::delete_property(&nav.into(), &"gpu".into()).unwrap();
    let m = m.unwrap();
    assert!(
        m.adapter_info().contains("CPU backend"),
        "{}",
        m.adapter_info()
    );
    let case = expected()
        .iter()
        .find(|c| c["model"] == "tiny2")
        .unwrap()
        .clone();
    check_output(&run_case(&m, &case).await, &case);
}

/// f16 shards through `model.safetensors.index.json`: the CLI's answers (f16 converted at load).
#[wasm_bindgen_test]
async fn run_task_matches_cli_f16_sharded() {
    let m = load(
        blob_source(model("tiny4-f16-sharded")),
        obj(&[("cache", false.into())]),
    )
    .await
    .unwrap();
    for case in expected()
        .iter()
        .filter(|c| c["model"] == "tiny4-f16-sharded")
    {
        let out = run_case(&m, case).await;
        check_output(&out, case);
    }
}

/// PyTorch checkpoints streamed over fetch through the restricted pickle reader: tiny2-pt (one zip
/// `pytorch_model.bin`, blob: URLs) answers as tiny2 (its safetensors twin, the same weights); the
/// original-layout zip shards of tiny2-orig-pt-sharded (`pytorch_model.bin.index.json`, on the fake
/// network, after the safetensors probes) load and answer.
#[wasm_bindgen_test]
async fn pytorch_checkpoints_match_their_safetensors_twins() {
    let m = load(
        blob_source(model("tiny2-pt")),
        obj(&[("cache", false.into())]),
    )
    .await
    .unwrap();
    for case in expected().iter().filter(|c| c["model"] == "tiny2") {
        check_output(&run_case(&m, case).await, case);
    }
    m.dispose();
    let base = fake_source("tiny2-orig-pt-sharded", model("tiny2-orig-pt-sharded"));
    let m = load(base.into(), obj(&[("cache", false.into())]))
        .await
        .unwrap();
    let case = expected_for("tiny2", "scene.png", "<CAPTION>", None);
    let out = run_case(&m, &case).await;
    assert!(get(&out, "text").is_string(), "{}", to_json(&out));
    m.dispose();
}

/// Quantized checkpoints (scripts/fixtures/convert_checkpoint.py --dtype q8|q4: `.qweight` rows streamed straight
/// into the GPU buffers) loaded with `dtype` equal to their format, one single-file HF-native q8 and one
/// original-layout q4 in 3 shards: the CLI's answers at that dtype. The q8 file loaded as fp16 (rows
/// dequantized while streaming) answers too, with more weight bytes. Broken `quantization` entries give
/// named load errors.
#[wasm_bindgen_test]
async fn quantized_checkpoints_match_cli() {
    // Hostile variants first (a named load error each, nothing panics across the boundary; the
    // loads below then work): no quantization entry in config.json, and one with 3 bits.
    let files = model("tiny2-q8");
    let cfg: Value = serde_json::from_slice(file_of(files, "config.json")).unwrap();
    let with_config = |cfg: &Value| {
        let o = Object::new();
        for (n, bytes) in files {
            let url = if *n == "config.json" {
                blob_url(cfg.to_string().as_bytes())
            } else {
                blob_url(bytes)
            };
            Reflect::set(&o, &(*n).into(), &url.into()).unwrap();
        }
        JsValue::from(o)
    };
    let mut no_entry = cfg.clone();
    no_entry.as_object_mut().unwrap().remove("quantization");
    let e = load(with_config(&no_entry), obj(&[("cache", false.into())]))
        .await
        .err()
        .unwrap();
    assert_err(&e, "Florence2LoadError", "no quantization entry");
    let mut bits3 = cfg.clone();
    bits3["quantization"]["bits"] = json!(3);
    let e = load(with_config(&bits3), obj(&[("cache", false.into())]))
        .await
        .err()
        .unwrap();
    assert_err(&e, "Florence2LoadError", "unsupported bits 3");

    let mut q8_bytes = 0.0;
    for dir in ["tiny2-q8", "tiny2-orig-q4-sharded"] {
        for case in expected().iter().filter(|c| c["model"] == dir) {
            let dtype = case["dtype"].as_str().unwrap();
            let m = load(
                blob_source(model(dir)),
                obj(&[("cache", false.into()), ("dtype", dtype.into())]),
            )
            .await
            .unwrap();
            let out = run_case(&m, case).await;
            check_output(&out, case);
            if dir == "tiny2-q8" {
                q8_bytes = get(&get(&out, "memory"), "weightsBytes").as_f64().unwrap();
            }
            m.dispose();
        }
    }
    let case = expected_for("tiny2-q8", "scene.png", "<CAPTION>", None);
    let m = load(
        blob_source(model("tiny2-q8")),
        obj(&[("cache", false.into()), ("dtype", "fp16".into())]),
    )
    .await
    .unwrap();
    let out = run_case(&m, &case).await;
    let ids = to_json(&out)["tokenIds"].clone();
    assert!(ids.as_array().is_some_and(|a| !a.is_empty()));
    let f16_bytes = get(&get(&out, "memory"), "weightsBytes").as_f64().unwrap();
    assert!(
        f16_bytes > q8_bytes && q8_bytes > 0.0,
        "{f16_bytes} vs {q8_bytes}"
    );
    m.dispose();
}

/// The same pixels as ImageData and through an OffscreenCanvas (the drawable path) give the Blob's answer.
#[wasm_bindgen_test]
async fn image_data_and_canvas_inputs_match_blob() {
    let case = expected_for("tiny2", "scene.png", "<CAPTION>", Some(1));
    let m = load(blob_source(model("tiny2")), obj(&[("cache", false.into())]))
        .await
        .unwrap();
    let rgb = decode_image(SCENE_PNG, &ImageLimits::default()).unwrap();
    let (w, h) = (rgb.width(), rgb.height());
    let mut rgba = Vec::with_capacity((w * h * 4) as usize);
    for px in rgb.as_raw().chunks_exact(3) {
        rgba.extend_from_slice(&[px[0], px[1], px[2], 255]);
    }
    let data =
        web_sys::ImageData::new_with_u8_clamped_array_and_sh(wasm_bindgen::Clamped(&rgba), w, h)
            .unwrap();
    let out = run(&m, data.clone().into(), "<CAPTION>", max_new(&case))
        .await
        .unwrap();
    check_output(&out, &case);
    let canvas = web_sys::OffscreenCanvas::new(w, h).unwrap();
    let ctx: web_sys::OffscreenCanvasRenderingContext2d = canvas
        .get_context("2d")
        .unwrap()
        .unwrap()
        .dyn_into()
        .unwrap();
    ctx.put_image_data(&data, 0.0, 0.0).unwrap();
    let out = run(&m, canvas.into(), "<CAPTION>", max_new(&case))
        .await
        .unwrap();
    check_output(&out, &case);
    // Not an image at all: a named error, and the model still works.
    let e = run(&m, JsValue::from(42), "<CAPTION>", max_new(&case))
        .await
        .unwrap_err();
    assert_err(&e, "Florence2ImageError", "unsupported image");
    // Too many pixels for the load's limit.
    let small = load(
        blob_source(model("tiny2")),
        obj(&[
            ("cache", false.into()),
            ("limits", obj(&[("maxImagePixels", 100.into())])),
        ]),
    )
    .await
    .unwrap();
    let e = run(
        &small,
        blob_of(SCENE_PNG, "image/png"),
        "<CAPTION>",
        max_new(&case),
    )
    .await
    .unwrap_err();
    assert_err(&e, "Florence2ImageTooLargeError", "exceeds the limit");
}

/// Abort mid-decode (greedy; from onToken, after 3 tokens) rejects with AbortError; the next call
/// succeeds. onToken gets one call per generated token, as it is chosen.
#[wasm_bindgen_test]
async fn abort_mid_decode_then_next_call_succeeds() {
    let case = expected_for("tiny2", "scene.png", "<CAPTION>", Some(1));
    let m = load(blob_source(model("tiny2")), obj(&[("cache", false.into())]))
        .await
        .unwrap();
    let ctrl = web_sys::AbortController::new().unwrap();
    let seen = Array::new();
    let on_token = {
        let ctrl = ctrl.clone();
        let seen = seen.clone();
        Closure::<dyn FnMut(JsValue, JsValue)>::new(move |text: JsValue, _id: JsValue| {
            seen.push(&text);
            if seen.length() == 3 {
                ctrl.abort();
            }
        })
    };
    let opts = obj(&[
        ("maxNewTokens", 24.into()),
        ("numBeams", 1.into()),
        ("signal", ctrl.signal().into()),
        ("onToken", on_token.as_ref().clone()),
    ]);
    let e = run(&m, blob_of(SCENE_PNG, "image/png"), "<CAPTION>", opts)
        .await
        .unwrap_err();
    assert_err(&e, "AbortError", "aborted");
    assert_eq!(seen.length(), 3, "decoding stopped right after the abort");
    // An already-aborted signal rejects at once.
    let e = run(
        &m,
        blob_of(SCENE_PNG, "image/png"),
        "<CAPTION>",
        obj(&[("signal", ctrl.signal().into())]),
    )
    .await
    .unwrap_err();
    assert_err(&e, "AbortError", "aborted");
    // The model is still usable; onToken streams every token of the answer.
    let pieces = Array::new();
    let collect = {
        let pieces = pieces.clone();
        Closure::<dyn FnMut(JsValue, JsValue)>::new(move |text: JsValue, _id: JsValue| {
            pieces.push(&text);
        })
    };
    let opts = obj(&[
        ("maxNewTokens", 24.into()),
        ("numBeams", 1.into()),
        ("onToken", collect.as_ref().clone()),
    ]);
    let out = run(&m, blob_of(SCENE_PNG, "image/png"), "<CAPTION>", opts)
        .await
        .unwrap();
    check_output(&out, &case);
    let n_ids = case["cli"]["token_ids"].as_array().unwrap().len() as u32;
    assert_eq!(pieces.length(), n_ids - 1, "one onToken call per new token");
    let streamed: String = pieces.iter().map(|p| p.as_string().unwrap()).collect();
    let full = case["cli"]["generated_text"].as_str().unwrap();
    assert!(
        full.ends_with(&streamed) && !streamed.is_empty(),
        "streamed {streamed:?} is not the tail of {full:?}"
    );
}

/// Calls made without awaiting are queued (FIFO) and all answer correctly; a failing call in between
/// (invalid prompt) does not disturb them; after dispose() calls reject with Florence2DisposedError.
#[wasm_bindgen_test]
async fn concurrent_calls_queue_and_dispose() {
    let cap = expected_for("tiny2", "scene.png", "<CAPTION>", Some(1));
    let od = expected_for("tiny2", "scene.png", "<OD>", Some(1));
    let m = load(blob_source(model("tiny2")), obj(&[("cache", false.into())]))
        .await
        .unwrap();
    let img = || blob_of(SCENE_PNG, "image/png");
    let p1 = m.run_task(img(), "<CAPTION>".into(), max_new(&cap));
    let p2 = m.run_task(img(), "<NOT_A_TASK>".into(), max_new(&cap));
    let p3 = m.run_task(img(), "<OD>".into(), max_new(&od));
    let p4 = m.run_task(img(), "<CAPTION>".into(), max_new(&cap));
    let (r1, r2, r3, r4) = (
        JsFuture::from(p1).await,
        JsFuture::from(p2).await,
        JsFuture::from(p3).await,
        JsFuture::from(p4).await,
    );
    check_output(&r1.unwrap(), &cap);
    assert_err(
        &r2.unwrap_err(),
        "Florence2PromptError",
        "invalid task prompt",
    );
    check_output(&r3.unwrap(), &od);
    check_output(&r4.unwrap(), &cap);
    // dispose() right after a call: that call still finishes, later ones are rejected.
    let running = m.run_task(img(), "<CAPTION>".into(), max_new(&cap));
    m.dispose();
    assert!(m.disposed());
    check_output(&JsFuture::from(running).await.unwrap(), &cap);
    let e = run(&m, img(), "<CAPTION>", max_new(&cap))
        .await
        .unwrap_err();
    assert_err(&e, "Florence2DisposedError", "disposed");
}

/// Named errors: invalid prompt, 404 (a missing path on the test server itself), truncated file, body
/// shorter than Content-Length, bad header, aborted load, bad source.
#[wasm_bindgen_test]
async fn errors_are_named() {
    let tiny2 = model("tiny2");
    let m = load(blob_source(tiny2), obj(&[("cache", false.into())]))
        .await
        .unwrap();
    let e = run(
        &m,
        blob_of(SCENE_PNG, "image/png"),
        "<NOPE>",
        JsValue::UNDEFINED,
    )
    .await
    .unwrap_err();
    assert_err(&e, "Florence2PromptError", "invalid task prompt");
    let e = run(
        &m,
        blob_of(SCENE_PNG, "image/png"),
        "<CAPTION>extra input",
        JsValue::UNDEFINED,
    )
    .await
    .unwrap_err();
    assert_err(&e, "Florence2PromptError", "invalid task prompt");
    let e = run(
        &m,
        blob_of(b"not a png", "image/png"),
        "<CAPTION>",
        JsValue::UNDEFINED,
    )
    .await
    .unwrap_err();
    assert_err(&e, "Florence2ImageError", "");

    // 404 from the test server's own origin.
    let e = load(
        format!("{}/no-such-model-dir/", origin()).into(),
        obj(&[("cache", false.into())]),
    )
    .await
    .err()
    .unwrap();
    assert_err(&e, "Florence2LoadError", "HTTP 404");

    // A model dir whose safetensors file is cut short / has a bad header / a short body.
    let st = file_of(tiny2, "model.safetensors");
    let with = |st_url: String| {
        let o = Object::new();
        for n in COMMON {
            Reflect::set(&o, &n.into(), &blob_url(file_of(tiny2, n)).into()).unwrap();
        }
        Reflect::set(&o, &"model.safetensors".into(), &st_url.into()).unwrap();
        JsValue::from(o)
    };
    let e = load(
        with(blob_url(&st[..st.len() - 1000])),
        obj(&[("cache", false.into())]),
    )
    .await
    .err()
    .unwrap();
    assert_err(&e, "Florence2LoadError", "truncated");
    let mut bad = st.to_vec();
    bad[8..16].copy_from_slice(b"{\"oops\":");
    let e = load(with(blob_url(&bad)), obj(&[("cache", false.into())]))
        .await
        .err()
        .unwrap();
    assert_err(&e, "Florence2LoadError", "bad safetensors header");
    let mut huge = st.to_vec();
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = load(with(blob_url(&huge)), obj(&[("cache", false.into())]))
        .await
        .err()
        .unwrap();
    assert_err(&e, "Florence2LoadError", "bad safetensors header");
    install_fake_net();
    serve_short(
        "short/model.safetensors",
        &st[..st.len() / 2],
        st.len() as f64,
    );
    let e = load(
        with(format!("{}short/model.safetensors", fake_prefix())),
        obj(&[("cache", false.into())]),
    )
    .await
    .err()
    .unwrap();
    assert_err(&e, "Florence2LoadError", "truncated");

    // An aborted load, a bad source, a bad option.
    let ctrl = web_sys::AbortController::new().unwrap();
    ctrl.abort();
    let e = load(blob_source(tiny2), obj(&[("signal", ctrl.signal().into())]))
        .await
        .err()
        .unwrap();
    assert_err(&e, "AbortError", "aborted");
    let e = load(JsValue::from(7), JsValue::UNDEFINED)
        .await
        .err()
        .unwrap();
    assert_err(&e, "Florence2InputError", "source must be");
    let e = load(blob_source(tiny2), obj(&[("cache", "yes".into())]))
        .await
        .err()
        .unwrap();
    assert_err(&e, "Florence2InputError", "cache");
    // postProcess: a named prompt error for text with no task marker; a marker that is not built in is
    // pure text keyed by it (as the reference's post_process_generation); the reference's shape otherwise.
    let e = Florence2::post_process("x", "NOPE", 10, 10).unwrap_err();
    assert_err(&e, "Florence2PromptError", "");
    let r = Florence2::post_process("x", "<NOPE>", 10, 10).unwrap();
    assert_eq!(
        js_sys::JSON::stringify(&r).unwrap().as_string().unwrap(),
        r#"{"<NOPE>":"x"}"#
    );
    // postProcess gives post_process_generation's value as plain JS (compared through JSON).
    let raw = "cat<loc_0><loc_0><loc_999><loc_999>";
    let r = Florence2::post_process(raw, "<OD>", 100, 50).unwrap();
    let want = post_process_generation(raw, Task::Od, (100, 50))
        .unwrap()
        .to_json(Task::Od);
    assert_eq!(to_json(&r), want);
    assert_eq!(want["<OD>"]["labels"], json!(["cat"]));
}

/// Progress events in order (per file: initiate, download, progress..., done; ready last); the cached
/// second load makes no request and says `cached: true`; `cache: false` stores nothing.
#[wasm_bindgen_test]
async fn progress_events_and_cache() {
    cache_clear(CACHE_NAME).await;
    let base = fake_source("cached-tiny2", model("tiny2"));
    let events = Array::new();
    let on_progress = {
        let events = events.clone();
        Closure::<dyn FnMut(JsValue)>::new(move |e: JsValue| {
            events.push(&e);
        })
    };
    let opts = || obj(&[("onProgress", on_progress.as_ref().clone())]);

    let before = net_count();
    let m = load(base.clone().into(), opts()).await.unwrap();
    let first_requests = net_count() - before;
    let evs: Vec<Value> = events.iter().map(|e| to_json(&e)).collect();
    check_event_order(&evs, false);
    // config, tokenizer, preprocessor, generation, index (404), processor_config (404: the probe for a
    // model's own task list), model.safetensors.
    assert_eq!(first_requests, 7, "first load requests");
    m.dispose();

    events.set_length(0);
    let before = net_count();
    let m = load(base.clone().into(), opts()).await.unwrap();
    let second_requests = net_count() - before;
    let evs: Vec<Value> = events.iter().map(|e| to_json(&e)).collect();
    check_event_order(&evs, true);
    // None: the files are cached and the two absent probes (index, processor_config) are remembered as
    // absent (negative cache entries).
    assert_eq!(second_requests, 0, "cached load requests");
    let case = expected_for("tiny2", "scene.png", "<CAPTION>", None);
    check_output(&run_case(&m, &case).await, &case);
    m.dispose();

    // cache: false neither reads nor writes.
    let base2 = fake_source("uncached-tiny2", model("tiny2"));
    let before = net_count();
    load(base2.clone().into(), obj(&[("cache", false.into())]))
        .await
        .unwrap()
        .dispose();
    assert_eq!(net_count() - before, 7);
    let url = format!("{base2}model.safetensors");
    assert_eq!(cache_has(CACHE_NAME, &url).await, JsValue::FALSE);
    assert_eq!(
        cache_has(CACHE_NAME, &format!("{base}model.safetensors")).await,
        JsValue::TRUE
    );
    let before = net_count();
    load(base.clone().into(), obj(&[("cache", false.into())]))
        .await
        .unwrap()
        .dispose();
    assert_eq!(
        net_count() - before,
        7,
        "cache: false does not read the cache"
    );
    cache_clear(CACHE_NAME).await;
}

/// Torn cache writes (a body without its meta record, a record without its body, a record cut off mid-JSON)
/// are never used: the next load fetches that file again (one request) and answers like the CLI.
#[wasm_bindgen_test]
async fn torn_cache_entries_are_fetched_again_never_used() {
    cache_clear(CACHE_NAME).await;
    let base = fake_source("torn-tiny2", model("tiny2"));
    load(base.clone().into(), JsValue::UNDEFINED)
        .await
        .unwrap()
        .dispose();
    let case = expected_for("tiny2", "scene.png", "<CAPTION>", None);
    for file in ["model.safetensors", "config.json"] {
        let url = format!("{base}{file}");
        let record = meta_key(&url);
        let tears: [(&str, &str); 3] = [
            ("meta without body", &url),
            ("body without meta", &record),
            ("meta cut mid-JSON", &record),
        ];
        for (what, key) in tears {
            if what == "meta cut mid-JSON" {
                let torn = format!("{{\"url\":\"{url}\",\"byt");
                cache_put_text(CACHE_NAME, key, &torn).await;
            } else {
                assert_eq!(cache_delete(CACHE_NAME, key).await, JsValue::TRUE, "{what}");
            }
            let before = net_count();
            let m = load(base.clone().into(), JsValue::UNDEFINED).await.unwrap();
            assert_eq!(net_count() - before, 1, "{file}, {what}: one request");
            check_output(&run_case(&m, &case).await, &case);
            m.dispose();
            assert_eq!(cache_has(CACHE_NAME, &url).await, JsValue::TRUE, "{what}");
        }
    }
    cache_clear(CACHE_NAME).await;
}

fn check_event_order(evs: &[Value], cached: bool) {
    let files = [
        "config.json",
        "tokenizer.json",
        "preprocessor_config.json",
        "generation_config.json",
        "model.safetensors",
    ];
    let mut i = 0;
    for f in files {
        let mine: Vec<&Value> = evs.iter().filter(|e| e["file"] == f).collect();
        let statuses: Vec<&str> = mine.iter().map(|e| e["status"].as_str().unwrap()).collect();
        assert!(statuses.len() >= 3, "{f}: {statuses:?}");
        assert_eq!(statuses[0], "initiate", "{f}");
        assert_eq!(statuses[1], "download", "{f}");
        assert_eq!(*statuses.last().unwrap(), "done", "{f}");
        assert!(
            statuses[2..statuses.len() - 1]
                .iter()
                .all(|s| *s == "progress"),
            "{f}: {statuses:?}"
        );
        let mut last = 0.0;
        for e in &mine {
            let l = e["loaded"].as_f64().unwrap();
            assert!(l >= last, "{f}: loaded decreased");
            last = l;
            // Every event of a file says where its bytes come from: the loader knows it is cached (the
            // Cache API record) before `initiate`.
            assert_eq!(e["cached"], json!(cached), "{f}: {e}");
        }
        let done = mine.last().unwrap();
        let size = file_of(model("tiny2"), f).len() as f64;
        assert_eq!(done["loaded"].as_f64().unwrap(), size, "{f}");
        assert_eq!(done["progress"].as_f64().unwrap(), 100.0, "{f}");
        // Files come one after the other, in load order.
        let first = evs.iter().position(|e| e["file"] == f).unwrap();
        assert!(first >= i, "{f} started before the previous file finished");
        i = evs.iter().rposition(|e| e["file"] == f).unwrap();
    }
    assert!(
        evs.iter()
            .all(|e| e["file"] != "model.safetensors.index.json"),
        "an absent optional file has no events"
    );
    let last = evs.last().unwrap();
    assert_eq!(last["status"], "ready");
    assert_eq!(evs.iter().filter(|e| e["status"] == "ready").count(), 1);
}

/// A synthetic checkpoint of ~320 MB (tiny2's vision tower; text d_model 1024, one encoder and one decoder
/// layer, vocab 65 536: the shared embedding alone is 256 MiB) streamed from a blob: URL. The data bytes
/// are generated in JS (a 1 MiB pattern repeated), so wasm memory only sees the loader. Peak wasm memory
/// (memory only grows, so its size after the load is the peak) must stay under 64 MiB + one chunk.
#[wasm_bindgen_test]
async fn peak_wasm_memory_while_streaming_a_320mb_checkpoint() {
    let tiny2 = model("tiny2");
    let mut cfg: Value = serde_json::from_slice(file_of(tiny2, "config.json")).unwrap();
    cfg["text_config"]["vocab_size"] = json!(65_536);
    cfg["text_config"]["d_model"] = json!(1024);
    cfg["text_config"]["encoder_layers"] = json!(1);
    cfg["text_config"]["decoder_layers"] = json!(1);
    cfg["vision_config"]["projection_dim"] = json!(1024);
    let cfg_text = serde_json::to_string(&cfg).unwrap();
    let parsed = Florence2Config::from_json_str(&cfg_text).unwrap();
    // Header: every expected tensor, f32, in table order.
    let tensors = expected_tensors(&parsed);
    let mut header = serde_json::Map::new();
    let mut off = 0u64;
    for (name, shape) in &tensors {
        let bytes = shape.iter().product::<usize>() as u64 * 4;
        header.insert(
            name.clone(),
            json!({"dtype": "F32", "shape": shape, "data_offsets": [off, off + bytes]}),
        );
        off += bytes;
    }
    let total_data = off;
    let mut h = serde_json::to_vec(&Value::Object(header)).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    // head = 8-byte length + header; then the data: a 1 MiB pattern of small f32 values, repeated.
    let mut head = (h.len() as u64).to_le_bytes().to_vec();
    head.extend_from_slice(&h);
    drop(h);
    let piece_len = 1usize << 20;
    let piece_vals: Vec<f32> = (0..piece_len / 4)
        .map(|i| ((i % 89) as f32 - 44.0) / 440.0)
        .collect();
    let piece = Uint8Array::from(bytemuck_cast(&piece_vals));
    drop(piece_vals);
    let pieces = (total_data / piece_len as u64) as u32;
    let tail = (total_data % piece_len as u64) as u32;
    let r = big_blob_url(&head, &piece, pieces, tail);
    let url = r.get(0).as_string().unwrap();
    let size = r.get(1).as_f64().unwrap();
    assert_eq!(size as u64, head.len() as u64 + total_data);
    assert!(size > 256e6, "checkpoint must exceed 256 MB, is {size}");
    drop(head);

    let mem = wasm_bindgen::memory();
    let before = wasm_bytes(&mem);
    let o = Object::new();
    for n in COMMON {
        Reflect::set(&o, &n.into(), &blob_url(file_of(tiny2, n)).into()).unwrap();
    }
    Reflect::set(
        &o,
        &"config.json".into(),
        &blob_url(cfg_text.as_bytes()).into(),
    )
    .unwrap();
    Reflect::set(&o, &"model.safetensors".into(), &url.into()).unwrap();
    let t0 = js_sys::Date::now();
    let m = load(o.into(), obj(&[("cache", false.into())]))
        .await
        .unwrap();
    let after = wasm_bytes(&mem);
    let secs = (js_sys::Date::now() - t0) / 1e3;
    m.dispose();
    let limit = (64u64 << 20) as f64 + PIECE_BYTES as f64;
    web_sys::console::log_1(
        &format!(
            "streamed a {:.1} MB checkpoint in {secs:.1} s: wasm memory {:.1} MiB before, {:.1} MiB after \
             (peak; limit {:.0} MiB)",
            size / 1e6,
            before / 1048576.0,
            after / 1048576.0,
            limit / 1048576.0
        )
        .into(),
    );
    assert!(after <= limit, "wasm memory grew to {after} bytes");
}

fn bytemuck_cast(v: &[f32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

async fn encode(m: &Florence2, image: JsValue) -> Result<JsValue, JsValue> {
    JsFuture::from(m.encode_image(image, JsValue::UNDEFINED)).await
}

/// Call `obj[key]()`.
fn call_method(o: &JsValue, key: &JsValue) {
    let f: js_sys::Function = Reflect::get(o, key).unwrap().dyn_into().unwrap();
    f.call0(o).unwrap();
}

/// `encodeImage` once, then every tiny2 scene.png task (default beams and greedy) on the encoding
/// equals the CLI's answer and `runTask` on the image itself, twice over; the encoding knows its size;
/// another model refuses it; after `dispose()` or `[Symbol.dispose]()` it is refused by name.
#[wasm_bindgen_test]
async fn encoded_image_runs_every_task_like_the_image() {
    let m = load(blob_source(model("tiny2")), obj(&[("cache", false.into())]))
        .await
        .unwrap();
    let img = encode(&m, blob_of(SCENE_PNG, "image/png")).await.unwrap();
    let rgb = decode_image(SCENE_PNG, &ImageLimits::default()).unwrap();
    assert_eq!(get(&img, "width").as_f64(), Some(f64::from(rgb.width())));
    assert_eq!(get(&img, "height").as_f64(), Some(f64::from(rgb.height())));
    assert_eq!(get(&img, "disposed").as_bool(), Some(false));
    let cases: Vec<Value> = expected()
        .into_iter()
        .filter(|c| c["model"] == "tiny2" && c["image"] == "scene.png")
        .collect();
    assert!(cases.len() >= 4, "several tasks on one image");
    for round in 0..2 {
        for case in &cases {
            let out = run(
                &m,
                img.clone(),
                case["prompt"].as_str().unwrap(),
                max_new(case),
            )
            .await
            .unwrap();
            check_output(&out, case);
            if round == 0 {
                let fresh = to_json(&run_case(&m, case).await);
                let got = to_json(&out);
                for k in ["task", "tokenIds", "generatedText", "result", "text"] {
                    assert_eq!(got[k], fresh[k], "{k}: encoded vs image");
                }
            }
        }
    }
    // Another model's encoding.
    let other = load(blob_source(model("tiny2")), obj(&[("cache", false.into())]))
        .await
        .unwrap();
    let e = run(&other, img.clone(), "<CAPTION>", JsValue::UNDEFINED)
        .await
        .unwrap_err();
    assert_err(&e, "Florence2InputError", "another model");
    other.dispose();
    // dispose(): refused afterwards, the model still works.
    call_method(&img, &"dispose".into());
    assert_eq!(get(&img, "disposed").as_bool(), Some(true));
    let e = run(&m, img.clone(), "<CAPTION>", JsValue::UNDEFINED)
        .await
        .unwrap_err();
    assert_err(&e, "Florence2InputError", "disposed");
    // [Symbol.dispose]() (what `using img = ...` calls) frees the object itself.
    let img2 = encode(&m, blob_of(SCENE_PNG, "image/png")).await.unwrap();
    call_method(&img2, &js_sys::Symbol::dispose().into());
    let e = run(&m, img2, "<CAPTION>", JsValue::UNDEFINED)
        .await
        .unwrap_err();
    assert_err(&e, "Florence2InputError", "disposed");
    let out = run_case(&m, &cases[0]).await;
    check_output(&out, &cases[0]);
    m.dispose();
}

/// `profile: true`: with timestamp queries (SwiftShader in headless Chromium has them) every dispatch
/// of the call comes back with its phase, kernel, variant, shape and GPU time, the phase totals add up,
/// and the answer is the CLI's; without them `available` is false with the reason. Without the option
/// the result has no `profile`.
#[wasm_bindgen_test]
async fn profile_option_returns_gpu_times_per_dispatch() {
    let m = load(
        blob_source(model("tiny2")),
        obj(&[("cache", false.into()), ("tuning", "off".into())]),
    )
    .await
    .unwrap();
    let case = expected()
        .iter()
        .find(|c| c["model"] == "tiny2")
        .cloned()
        .unwrap();
    let opts = max_new(&case);
    Reflect::set(&opts, &"profile".into(), &true.into()).unwrap();
    let img = blob_of(image_bytes(case["image"].as_str().unwrap()), "image/png");
    let out = run(&m, img, case["prompt"].as_str().unwrap(), opts)
        .await
        .unwrap();
    check_output(&out, &case);
    let support = to_json(&Florence2::is_supported().await);
    let has_ts = support["features"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f == "timestamp-query");
    let p = to_json(&get(&out, "profile"));
    web_sys::console::log_1(&format!("profile phases: {}", p["phases"]).into());
    if !has_ts {
        assert_eq!(p["available"], false, "{p}");
        assert!(
            p["reason"].as_str().unwrap().contains("timestamp-query"),
            "{p}"
        );
        assert_eq!(p["entries"].as_array().unwrap().len(), 0);
    } else {
        assert_eq!(p["available"], true, "{p}");
        let entries = p["entries"].as_array().unwrap();
        assert!(entries.len() > 10, "{} entries", entries.len());
        for e in entries {
            let ms = e["ms"].as_f64().unwrap();
            assert!(ms.is_finite() && ms >= 0.0, "{e}");
            assert!(e["op"].as_str().unwrap().contains(':'), "{e}");
            assert!(
                ["vision", "encoder", "decode"].contains(&e["phase"].as_str().unwrap()),
                "{e}"
            );
        }
        // Every phase of the call, each total the sum of its entries, all adding up to totalMs.
        let phases = p["phases"].as_array().unwrap();
        let names: Vec<&str> = phases
            .iter()
            .map(|x| x["phase"].as_str().unwrap())
            .collect();
        for want in ["vision", "encoder", "decode"] {
            assert!(names.contains(&want), "{names:?}");
        }
        let total = p["totalMs"].as_f64().unwrap();
        let sum: f64 = phases.iter().map(|x| x["ms"].as_f64().unwrap()).sum();
        assert!(
            (sum - total).abs() <= 1e-9 * total.max(1.0),
            "{sum} vs {total}"
        );
        for ph in phases {
            let of: f64 = entries
                .iter()
                .filter(|e| e["phase"] == ph["phase"])
                .map(|e| e["ms"].as_f64().unwrap())
                .sum();
            assert!((of - ph["ms"].as_f64().unwrap()).abs() <= 1e-9 * of.max(1.0));
            let n = entries.iter().filter(|e| e["phase"] == ph["phase"]).count();
            assert_eq!(ph["dispatches"].as_u64().unwrap() as usize, n);
        }
        // A linear dispatch names its shape and variant.
        assert!(
            entries
                .iter()
                .any(|e| e["shape"].as_str().unwrap().starts_with("M=")),
            "no linear shape note"
        );
    }
    // Without the option: no profile, and the profiler is off again.
    let img = blob_of(image_bytes(case["image"].as_str().unwrap()), "image/png");
    let out = run(&m, img, case["prompt"].as_str().unwrap(), max_new(&case))
        .await
        .unwrap();
    assert!(get(&out, "profile").is_undefined());
    check_output(&out, &case);
    m.dispose();
}

/// `tuning: "auto"` in the browser: the first load (fresh tuning cache) times kernels within its budget
/// and writes the Cache API; the next loads continue from the cache. Load times are logged
/// (informational: speed lives in the benches).
#[wasm_bindgen_test]
async fn tuning_auto_continues_across_loads() {
    cache_clear("florence2-wasm-tuning").await;
    let now = || js_sys::Date::now();
    let t = now();
    let off = load(
        blob_source(model("tiny2")),
        obj(&[("cache", false.into()), ("tuning", "off".into())]),
    )
    .await
    .unwrap();
    let off_ms = now() - t;
    assert_eq!(off.tuning_table(), "", "off times nothing");
    off.dispose();
    let summary = |table: &str| -> (usize, usize, usize) {
        // "... N classes timed (...), M from the cache, K left for later loads; ..."
        let last = table.lines().last().unwrap_or_default().to_string();
        let num = |after: &str| -> usize {
            let words: Vec<&str> = last.split_whitespace().collect();
            let i = words
                .windows(2)
                .position(|w| w[1].starts_with(after))
                .unwrap_or_else(|| panic!("no {after:?} in {last:?}"));
            words[i].parse().unwrap()
        };
        (num("classes"), num("from"), num("left"))
    };
    // Each load continues where the last stopped: it times at least one class (a positive budget
    // always admits a load's first class), what the cache holds finished never shrinks, and within a
    // few loads classes come from the cache. (What is left may grow on a busier load: a class cut
    // short counts as timed when it starts and as left when a later load has no time to resume it.)
    // (That the loads end with everything cached and nothing timed is tested natively, in
    // tests/model/tuning.rs, with a step clock: SwiftShader compiles slowly, so a model takes many
    // loads here.)
    let mut loads = Vec::new();
    let mut cached_seen = 0;
    for i in 0..5 {
        let t = now();
        let m = load(blob_source(model("tiny2")), obj(&[("cache", false.into())]))
            .await
            .unwrap();
        let ms = now() - t;
        let table = m.tuning_table();
        m.dispose();
        let (timed, cached, left) = summary(&table);
        loads.push(format!(
            "load {i}: {ms:.0} ms, {timed} timed, {cached} cached, {left} left"
        ));
        if i == 0 {
            assert!(timed >= 1 && cached == 0, "{table}");
        }
        assert!(timed >= 1 || left == 0, "every load progresses: {table}");
        assert!(cached >= cached_seen, "{loads:?}");
        cached_seen = cached;
        if left == 0 && timed == 0 {
            break;
        }
    }
    assert!(cached_seen >= 1, "later loads read the cache: {loads:?}");
    web_sys::console::log_1(
        &format!(
            "tuning off: load {off_ms:.0} ms; auto: {}",
            loads.join("; ")
        )
        .into(),
    );
}
