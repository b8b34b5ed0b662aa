//! One way to open a model, for every front end: the device (`auto`: [`decide_device`]), the resident
//! weight format (`auto`: [`resolve_dtype_for`]), the load ([`Pipeline::load`]) and the kernel tuning
//! ([`Pipeline::tune`]), returned with the decisions made and their reasons so that each front end only
//! prints or returns them. Nothing here is native- or wasm-only.

use std::sync::Arc;

use super::device::{open_device_decided, DeviceChoice, DeviceDecision};
use super::load::PipelineOptions;
use super::tune::TuneSizes;
use super::Pipeline;
use crate::error::Result;
use crate::estimate::{device_limits, resolve_dtype_for, DTypeRequest, DeviceLimits};
use crate::gpu::tune::{CacheLocation, TuneOptions, TuneReport, Tuning};
use crate::gpu::{Device, DeviceOptions};
use crate::weights::load::ModelSource;
use crate::weights::source::ModelFiles;
use crate::weights::DTypePlan;

/// What to open a model with.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// `auto`, `gpu` or `cpu`.
    pub device: DeviceChoice,
    /// A format, or `auto` (the best-quality format that fits the device).
    pub dtype: DTypeRequest,
    /// Kernel tuning after the load (mode and budget).
    pub tuning: TuneOptions,
    /// The image side tuned for (default: the processor's).
    pub tune_image_size: Option<usize>,
    /// The decoder rows tuned for (default: the generation config's beams).
    pub tune_beams: Option<usize>,
    /// Where tuning results are kept.
    pub tune_cache: CacheLocation,
    /// The device's options.
    pub gpu: DeviceOptions,
    /// Whether the platform is a phone or tablet (the adapter does not say; `auto` dtype uses it).
    pub mobile: bool,
    /// The limits `auto` dtype judges against instead of the device's (a test override of the wasm
    /// facade's `adapterLimits`).
    pub limits: Option<DeviceLimits>,
    /// Task markers and input limits; the weights' dtype is the one resolved here.
    pub pipeline: PipelineOptions,
}

impl Default for OpenOptions {
    /// `auto` device, fp16, `auto` tuning in the default cache.
    fn default() -> Self {
        OpenOptions {
            device: DeviceChoice::Auto,
            dtype: DTypeRequest::default(),
            tuning: TuneOptions::new(Tuning::Auto),
            tune_image_size: None,
            tune_beams: None,
            tune_cache: CacheLocation::Default,
            gpu: DeviceOptions::default(),
            mobile: false,
            limits: None,
            pipeline: PipelineOptions::default(),
        }
    }
}

/// A ready pipeline and the decisions that made it.
pub struct Opened {
    pub gpu: Arc<Device>,
    pub pipeline: Pipeline,
    /// The backend chosen and why.
    pub device: DeviceDecision,
    /// The resident weight format, per part.
    pub dtype: DTypePlan,
    /// Why `auto` chose it (None for a fixed format).
    pub dtype_reason: Option<String>,
    /// The tuning run (a failure costs only speed: see [`TuneReport::failed`]).
    pub tuning: TuneReport,
    /// The sizes tuned for.
    pub tune_sizes: TuneSizes,
}

/// Open the device `opts.device` asks for, then [`open_on`] it.
pub async fn open<S: ModelSource, F: ModelFiles>(
    source: &S,
    files: &F,
    opts: &OpenOptions,
) -> Result<Opened> {
    let (gpu, device) = open_device_decided(opts.device, opts.gpu.clone()).await?;
    open_on(gpu, device, source, files, opts).await
}

/// Resolve the dtype for `gpu`, load the model from `source` (its sizes and headers read from `files`
/// first, no weight read) and tune the kernels, on a device a front end opened itself.
pub async fn open_on<S: ModelSource, F: ModelFiles>(
    gpu: Arc<Device>,
    device: DeviceDecision,
    source: &S,
    files: &F,
    opts: &OpenOptions,
) -> Result<Opened> {
    open_on_observed(gpu, device, source, files, opts, &()).await
}

/// What [`open_on_observed`] reports between its steps (a front end's progress events).
pub trait OpenObserver {
    /// The resident format is chosen (`reason`: `auto`'s, empty for a fixed format); the load starts.
    fn dtype_chosen(&self, _reason: &str) {}
    /// The load is done; the kernel tuning starts.
    fn tuning(&self) {}
}

impl OpenObserver for () {}

/// [`open_on`], telling `obs` when the dtype is chosen and when the tuning starts.
pub async fn open_on_observed<S: ModelSource, F: ModelFiles>(
    gpu: Arc<Device>,
    device: DeviceDecision,
    source: &S,
    files: &F,
    opts: &OpenOptions,
    obs: &dyn OpenObserver,
) -> Result<Opened> {
    let limits = opts
        .limits
        .unwrap_or_else(|| device_limits(&gpu, opts.mobile));
    let (dtype, dtype_reason) =
        resolve_dtype_for(opts.dtype, files, &limits, gpu.is_host()).await?;
    obs.dtype_chosen(dtype_reason.as_deref().unwrap_or_default());
    let mut load = opts.pipeline.clone();
    load.weights.dtype = dtype;
    let pipeline = Pipeline::load(&gpu, source, &load).await?;
    let mut sizes = pipeline.tune_sizes();
    if let Some(n) = opts.tune_image_size {
        (sizes.height, sizes.width) = (n, n);
    }
    sizes.beams = opts.tune_beams.unwrap_or(sizes.beams);
    if opts.tuning.mode != Tuning::Off {
        obs.tuning();
    }
    let tuning = pipeline.tune(sizes, &opts.tuning, &opts.tune_cache).await;
    Ok(Opened {
        gpu,
        pipeline,
        device,
        dtype,
        dtype_reason,
        tuning,
        tune_sizes: sizes,
    })
}
