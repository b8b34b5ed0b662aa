//! `Florence2.estimate(source, options)`: a model's memory in a weight format (or what `dtype: "auto"`
//! picks) before loading it, from its small files and the sizes and safetensors headers of the
//! others ([`crate::estimate`], over [`RemoteFiles`]: no weight is downloaded); and the device limits
//! `dtype: "auto"` judges against, at load and here (the adapter's, or the `adapterLimits` option's).

use js_sys::Reflect;
use serde::Serialize;
use wasm_bindgen::prelude::*;

use crate::error::{Error, Result};
use crate::estimate::{
    choose_dtype, device_limits, fits, DTypeRequest, DeviceClass, DeviceLimits, Estimate,
    EstimateOptions, ModelFacts, PartBytes,
};
use crate::gpu::Device;
use crate::pipeline::{cpu_device, decide_device, AdapterProbe, Backend, DeviceChoice};
use crate::wasm::fetch::Fetcher;
use crate::wasm::js::{js_error, opt_bool, opt_fn, opt_get, opt_signal, opt_uint, to_js};
use crate::wasm::remote_files::RemoteFiles;
use crate::wasm::source::Source;
use crate::wasm::{support, JsFlorence2, MAX_SAFE};
use crate::weights::DTypePlan;

#[wasm_bindgen(typescript_custom_section)]
const TS_ESTIMATE: &'static str = r#"
/** A device class with its own memory budget (README "Weight precision"). */
export type DeviceClass = "mobile" | "integrated" | "discrete" | "cpu";

/** Advanced (and test) option of `Florence2.load` and `Florence2.estimate`: the limits `dtype: "auto"` and
 * the estimate judge against, instead of (or on top of) what the adapter reports. */
export interface AdapterLimits {
  class?: DeviceClass;
  /** Peak bytes a request may hold (default: the class's budget: mobile 1 GB, integrated 2 GB, discrete
   * 4 GB, cpu 3 GB). */
  budgetBytes?: number;
  maxBufferSize?: number;
  maxStorageBufferBindingSize?: number;
}

/** What `Florence2.estimate` resolves to. */
export interface MemoryEstimate {
  /** The format estimated (for `dtype: "auto"`, the one chosen; a mix as its text form). */
  dtype: WeightDType | WeightDTypeLabel;
  /** Bytes of the files a load fetches (the checkpoint as stored, whatever `dtype` is). */
  downloadBytes: number;
  /** Resident weight bytes once loaded. */
  weightsBytes: number;
  /** `weightsBytes` per part of the model (they add up to it). */
  partBytes: { vision: number; projector: number; encoder: number; decoder: number; embed: number };
  /** Weights plus the largest phase of one request (vision, encoder or decode). */
  peakBytes: number;
  /** The largest single GPU buffer. */
  largestBufferBytes: number;
  /** Whether it fits the device: largest buffer within min(maxBufferSize, maxStorageBufferBindingSize)
   * and peak within the device class's budget. */
  fits: boolean;
  /** Why it fits or not (for `dtype: "auto"`: why this format was chosen). */
  reason: string;
  visionBytes: number;
  encoderBytes: number;
  decodeBytes: number;
  /** How the checkpoint stores its matrices: "f32", "f16", "bf16", "q8", "q4" or "unknown". */
  stored: string;
  /** `weightsBytes` is exact (read from the safetensors headers; no `final_logits_bias`, which is kept
   * only when non-zero). */
  exact: boolean;
  /** What the download is (e.g. an f32 checkpoint converted while it streams). */
  note: string;
  device: {
    class: DeviceClass;
    budgetBytes: number;
    maxBufferSize: number;
    maxStorageBufferBindingSize: number;
  };
  /** With `dtype: "auto"`: every format's estimate, fp32 first, then the mixes auto considers. */
  estimates?: MemoryEstimate[];
}
"#;

/// `MemoryEstimate` for JS (camelCase).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsEstimate {
    dtype: DTypePlan,
    download_bytes: u64,
    weights_bytes: u64,
    part_bytes: PartBytes,
    peak_bytes: u64,
    largest_buffer_bytes: u64,
    fits: bool,
    reason: String,
    vision_bytes: u64,
    encoder_bytes: u64,
    decode_bytes: u64,
    stored: String,
    exact: bool,
    note: String,
    device: JsDevice,
    #[serde(skip_serializing_if = "Option::is_none")]
    estimates: Option<Vec<JsEstimate>>,
}

#[derive(Clone, Copy, Serialize)]
#[serde(rename_all = "camelCase")]
struct JsDevice {
    class: DeviceClass,
    budget_bytes: u64,
    max_buffer_size: u64,
    max_storage_buffer_binding_size: u64,
}

impl JsEstimate {
    fn of(e: &Estimate, limits: &DeviceLimits) -> JsEstimate {
        let (ok, reason) = fits(e, limits);
        JsEstimate {
            dtype: e.dtype,
            download_bytes: e.download_bytes,
            weights_bytes: e.weights_bytes,
            part_bytes: e.part_bytes,
            peak_bytes: e.peak_bytes,
            largest_buffer_bytes: e.largest_buffer_bytes,
            fits: ok,
            reason,
            vision_bytes: e.vision_bytes,
            encoder_bytes: e.encoder_bytes,
            decode_bytes: e.decode_bytes,
            stored: e.stored.clone(),
            exact: e.exact,
            note: e.note.clone(),
            // The CPU backend's "no limit" (u64::MAX) as the largest exact JS number.
            device: JsDevice {
                class: limits.class,
                budget_bytes: limits.budget,
                max_buffer_size: limits.max_buffer.min(MAX_SAFE as u64),
                max_storage_buffer_binding_size: limits.max_binding.min(MAX_SAFE as u64),
            },
            estimates: None,
        }
    }
}

/// The `dtype` option (absent: fp16): `auto`, a format or a mix as a string (`"vision=fp16,text=q4"`),
/// or a mix as an object of part names to formats (`{vision: "fp16", text: "q4"}`).
pub fn dtype_option(options: &JsValue) -> Result<DTypeRequest> {
    const WANT: &str =
        "option dtype must be a string (\"fp16\", \"auto\", \"vision=fp16,text=q4\") \
                        or an object of part names to formats ({vision: \"fp16\", text: \"q4\"})";
    let Some(v) = opt_get(options, "dtype") else {
        return Ok(DTypeRequest::default());
    };
    if let Some(s) = v.as_string() {
        return s.parse();
    }
    if !v.is_object() || js_sys::Array::is_array(&v) {
        return Err(Error::InvalidInput(WANT.into()));
    }
    let mut pairs = Vec::new();
    for entry in js_sys::Object::entries(v.unchecked_ref()).iter() {
        let entry: js_sys::Array = entry.unchecked_into();
        let key = entry.get(0).as_string().unwrap_or_default();
        let Some(format) = entry.get(1).as_string() else {
            return Err(Error::InvalidInput(format!(
                "option dtype.{key} must be a format string (fp32, fp16, q8 or q4)"
            )));
        };
        pairs.push((key, format));
    }
    DTypePlan::from_entries(pairs.iter().map(|(k, f)| (k.as_str(), f.as_str())))
        .map(DTypeRequest::Fixed)
}

/// The `device` option (absent: auto).
pub fn device_option(options: &JsValue) -> Result<DeviceChoice> {
    match opt_get(options, "device") {
        None => Ok(DeviceChoice::Auto),
        Some(v) => v
            .as_string()
            .ok_or_else(|| {
                Error::InvalidInput("option device must be \"auto\", \"webgpu\" or \"cpu\"".into())
            })?
            .parse::<DeviceChoice>(),
    }
}

/// The `adapterLimits` option, checked.
#[derive(Clone, Copy, Debug, Default)]
pub struct LimitsOverride {
    class: Option<DeviceClass>,
    budget: Option<u64>,
    max_buffer: Option<u64>,
    max_binding: Option<u64>,
}

impl LimitsOverride {
    pub fn from_options(options: &JsValue) -> Result<LimitsOverride> {
        let Some(o) = opt_get(options, "adapterLimits") else {
            return Ok(LimitsOverride::default());
        };
        let class = match opt_get(&o, "class") {
            None => None,
            Some(v) => Some(match v.as_string().as_deref() {
                Some("mobile") => DeviceClass::Mobile,
                Some("integrated") => DeviceClass::Integrated,
                Some("discrete") => DeviceClass::Discrete,
                Some("cpu") => DeviceClass::Cpu,
                _ => {
                    return Err(Error::InvalidInput(
                        "adapterLimits.class must be \"mobile\", \"integrated\", \"discrete\" or \"cpu\""
                            .into(),
                    ))
                }
            }),
        };
        Ok(LimitsOverride {
            class,
            budget: opt_uint(&o, "budgetBytes", MAX_SAFE)?,
            max_buffer: opt_uint(&o, "maxBufferSize", MAX_SAFE)?,
            max_binding: opt_uint(&o, "maxStorageBufferBindingSize", MAX_SAFE)?,
        })
    }

    fn apply(self, mut l: DeviceLimits) -> DeviceLimits {
        if let Some(c) = self.class {
            l.class = c;
            l.budget = c.budget();
        }
        l.budget = self.budget.unwrap_or(l.budget);
        l.max_buffer = self.max_buffer.unwrap_or(l.max_buffer);
        l.max_binding = self.max_binding.unwrap_or(l.max_binding);
        l
    }
}

/// Whether the browser says it runs on a phone or tablet (`navigator.userAgentData.mobile`, else the
/// user agent; iPadOS reports a Mac with touch points).
pub fn is_mobile() -> bool {
    let nav = Reflect::get(&js_sys::global(), &"navigator".into()).unwrap_or(JsValue::UNDEFINED);
    if nav.is_undefined() {
        return false;
    }
    let get = |o: &JsValue, k: &str| Reflect::get(o, &k.into()).unwrap_or(JsValue::UNDEFINED);
    if let Some(m) = get(&get(&nav, "userAgentData"), "mobile").as_bool() {
        return m;
    }
    let ua = get(&nav, "userAgent").as_string().unwrap_or_default();
    let touch = get(&nav, "maxTouchPoints").as_f64().unwrap_or(0.0);
    ["Mobi", "Android", "iPhone", "iPad"]
        .iter()
        .any(|k| ua.contains(k))
        || (ua.contains("Macintosh") && touch > 1.0)
}

/// The limits `auto` judges a loaded device against.
pub fn limits_of(gpu: &Device, over: LimitsOverride) -> DeviceLimits {
    over.apply(device_limits(gpu, is_mobile()))
}

/// The limits of the device a load with `device` would open, without opening one: the WebGPU
/// adapter's (its limits and whether it is a fallback adapter), or the CPU backend's; and whether the
/// model would run on the CPU backend (`auto` passes over a fallback adapter, as `load` does).
async fn probe_limits(device: DeviceChoice, over: LimitsOverride) -> (DeviceLimits, bool) {
    let cpu = || (device_limits(&cpu_device(), false), true);
    let (base, host) = match device {
        DeviceChoice::Cpu => cpu(),
        DeviceChoice::Auto if !support::webgpu_exposed() => cpu(),
        DeviceChoice::Auto | DeviceChoice::Gpu => match support::request_adapter().await {
            Err(_) => cpu(),
            Ok(adapter) => {
                let get = |o: &JsValue, k: &str| Reflect::get(o, &k.into()).unwrap_or_default();
                let limits = get(&adapter, "limits");
                let num = |k: &str| get(&limits, k).as_f64().map(|x| x as u64);
                let fallback = get(&get(&adapter, "info"), "isFallbackAdapter")
                    .as_bool()
                    .or_else(|| get(&adapter, "isFallbackAdapter").as_bool())
                    .unwrap_or(false);
                let class = DeviceClass::of_adapter("", fallback, is_mobile());
                let limits = DeviceLimits {
                    class,
                    budget: class.budget(),
                    max_buffer: num("maxBufferSize").unwrap_or(256 << 20),
                    max_binding: num("maxStorageBufferBindingSize").unwrap_or(128 << 20),
                };
                let probe = if fallback {
                    AdapterProbe::Software("a WebGPU fallback adapter".into())
                } else {
                    AdapterProbe::Hardware("a WebGPU adapter".into())
                };
                (
                    limits,
                    decide_device(device, &probe).backend == Backend::Cpu,
                )
            }
        },
    };
    (over.apply(base), host)
}

/// The estimates of every format for the model `f` serves, for a device of `limits` (`host`: the CPU
/// backend) and requests of `request` (its `max_binding` and `host` are set here).
pub async fn estimates(
    f: &Fetcher,
    limits: &DeviceLimits,
    host: bool,
    request: EstimateOptions,
    extra: Option<DTypePlan>,
) -> Result<Vec<Estimate>> {
    let facts = ModelFacts::read(&RemoteFiles { fetcher: f }).await?;
    let opts = EstimateOptions {
        max_binding: limits.max_binding,
        host,
        ..request
    };
    facts.estimate_with(extra, &opts)
}

async fn estimate_impl(source: &JsValue, options: &JsValue) -> Result<JsValue> {
    let src = Source::from_js(source, options)?;
    let dtype = dtype_option(options)?;
    let device = device_option(options)?;
    let over = LimitsOverride::from_options(options)?;
    let use_cache = opt_bool(options, "cache")?.unwrap_or(true);
    let f = Fetcher::new(
        src,
        use_cache,
        opt_fn(options, "fetch")?,
        opt_signal(options, "signal")?,
        opt_fn(options, "onProgress")?,
    )
    .await?;
    let (limits, host) = probe_limits(device, over).await;
    let request = EstimateOptions {
        max_new_tokens: opt_uint(options, "maxNewTokens", MAX_SAFE)?.map(|n| n as usize),
        num_beams: match opt_uint(options, "numBeams", 64.0)? {
            Some(0) => {
                return Err(Error::InvalidInput(
                    "option numBeams must be between 1 and 64".into(),
                ))
            }
            n => n.map(|n| n as usize),
        },
        ..Default::default()
    };
    let all = estimates(&f, &limits, host, request, dtype.fixed()).await?;
    let out = match dtype.fixed() {
        Some(d) => all
            .iter()
            .find(|e| e.dtype == d)
            .map(|e| JsEstimate::of(e, &limits))
            .ok_or_else(|| Error::InvalidInput(format!("no estimate for {d}")))?,
        None => {
            let choice = choose_dtype(&all, &limits)?;
            let mut chosen = all
                .iter()
                .find(|e| e.dtype == choice.dtype)
                .map(|e| JsEstimate::of(e, &limits))
                .ok_or_else(|| Error::InvalidInput("no estimate for the choice".into()))?;
            chosen.reason = choice.reason;
            chosen.estimates = Some(all.iter().map(|e| JsEstimate::of(e, &limits)).collect());
            chosen
        }
    };
    to_js(&out)
}

#[wasm_bindgen(js_class = Florence2)]
impl JsFlorence2 {
    /// A model's memory before loading it: `{dtype, downloadBytes, weightsBytes, peakBytes,
    /// largestBufferBytes, fits, reason, ...}` for `options.dtype` (default fp16; `"auto"`: the format
    /// `load` would choose, with every format's estimate), from config.json, generation_config.json,
    /// preprocessor_config.json and the sizes (and safetensors headers) of the weights files: no weight
    /// is downloaded. Takes the load's source and options (`revision`, `remoteHost`, `fetch`, `cache`,
    /// `device`, `adapterLimits`, `signal`, `onProgress`) and the requests' `maxNewTokens` and
    /// `numBeams`.
    #[wasm_bindgen(js_name = estimate, unchecked_return_type = "MemoryEstimate")]
    pub async fn estimate(
        #[wasm_bindgen(unchecked_param_type = "ModelSource")] source: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "EstimateOptions")] options: JsValue,
    ) -> std::result::Result<JsValue, JsValue> {
        estimate_impl(&source, &options)
            .await
            .map_err(|e| js_error(&e))
    }
}
