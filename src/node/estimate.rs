//! `Florence2.estimate(source, options)` on the native engine: the memory of a model in a weight format
//! (or what `dtype: "auto"` picks) before loading it, judged against the device the addon would load on
//! (the native CPU backend's or GPU adapter's limits, not the wasm's), in the wasm facade's
//! `MemoryEstimate` shape ([`EstimateReport`]). Reads config.json and friends and the weights files'
//! sizes and safetensors headers; no weight is read.

use napi::bindgen_prelude::AsyncTask;
use napi::{Env, Task};
use napi_derive::napi;

use super::{guarded, js_error, parse_device, source};
use crate::estimate::{device_limits, DTypeRequest, EstimateOptions, EstimateReport, ModelFacts};
use crate::gpu::DeviceOptions;
use crate::pipeline::{open_device, DeviceChoice};
use crate::weights::DirFiles;
use crate::{Error, Result};

/// `estimate(source, options)`'s options (the JS side routes `fetch`, `adapterLimits` and
/// `device: "wasm"` to the wasm's estimate).
#[napi(object)]
pub struct NativeEstimateOptions {
    pub device: Option<String>,
    /// As `load`'s: "auto", a format, or a mix in its text form.
    pub dtype: Option<String>,
    pub max_new_tokens: Option<u32>,
    pub num_beams: Option<u32>,
}

pub struct EstimateTask {
    source: String,
    device: DeviceChoice,
    dtype: DTypeRequest,
    request: EstimateOptions,
}

impl EstimateTask {
    fn report(&self) -> Result<serde_json::Value> {
        let dir = source::model_dir(&self.source, None)?;
        let gpu = pollster::block_on(open_device(self.device, DeviceOptions::default()))?;
        let facts = pollster::block_on(ModelFacts::read(&DirFiles::new(&dir)))?;
        let opts = EstimateOptions {
            max_binding: gpu.caps.max_storage_binding,
            host: gpu.is_host(),
            ..self.request
        };
        let limits = device_limits(&gpu, false);
        let all = facts.estimate_with(self.dtype.fixed(), &opts)?;
        let report = EstimateReport::answer(&all, &limits, self.dtype.fixed())?;
        serde_json::to_value(report).map_err(|e| Error::InvalidInput(e.to_string()))
    }
}

impl Task for EstimateTask {
    type Output = serde_json::Value;
    type JsValue = napi::JsUnknown;

    fn compute(&mut self) -> napi::Result<serde_json::Value> {
        guarded("estimate", || self.report().map_err(|e| js_error(&e)))
    }

    fn resolve(&mut self, env: Env, v: serde_json::Value) -> napi::Result<napi::JsUnknown> {
        env.to_js_value(&super::numbers::js_numbers(v))
    }
}

/// Estimates a model directory, `file://` URL or hub id (as `load` takes them) on the thread pool.
#[napi]
pub fn estimate(
    source: String,
    options: Option<NativeEstimateOptions>,
) -> napi::Result<AsyncTask<EstimateTask>> {
    let o = options.as_ref();
    let device = parse_device(o.and_then(|o| o.device.as_deref()))?;
    let dtype = match o.and_then(|o| o.dtype.as_deref()) {
        None => DTypeRequest::default(),
        Some(d) => d.parse::<DTypeRequest>().map_err(|e: Error| js_error(&e))?,
    };
    let num_beams = match o.and_then(|o| o.num_beams) {
        Some(n) if !(1..=64).contains(&n) => {
            return Err(js_error(&Error::InvalidInput(
                "option numBeams must be between 1 and 64".into(),
            )))
        }
        n => n.map(|n| n as usize),
    };
    Ok(AsyncTask::new(EstimateTask {
        source,
        device,
        dtype,
        request: EstimateOptions {
            max_new_tokens: o.and_then(|o| o.max_new_tokens).map(|n| n as usize),
            num_beams,
            ..Default::default()
        },
    }))
}
