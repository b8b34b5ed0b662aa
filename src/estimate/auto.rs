//! `dtype: "auto"` at load: the device's limits from its capabilities, the model's estimates from its
//! files (no weights read), and the chooser's pick ([`choose_dtype`]).

use crate::error::{Error, Result};
use crate::estimate::ModelFacts;
use crate::estimate::{choose_dtype, Choice, DeviceClass, DeviceLimits, EstimateOptions};
use crate::gpu::Device;
use crate::weights::source::ModelFiles;
use crate::weights::{DTypePlan, WeightDType};

/// A `dtype` option: one weight format or one per part of the model ([`DTypePlan`]), or `auto` (the
/// best-quality format or mix that fits the device).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DTypeRequest {
    Auto,
    Fixed(DTypePlan),
}

impl Default for DTypeRequest {
    /// fp16 ([`WeightDType::default`]).
    fn default() -> Self {
        DTypeRequest::Fixed(DTypePlan::default())
    }
}

impl From<WeightDType> for DTypeRequest {
    fn from(d: WeightDType) -> Self {
        DTypeRequest::Fixed(d.into())
    }
}

impl From<DTypePlan> for DTypeRequest {
    fn from(p: DTypePlan) -> Self {
        DTypeRequest::Fixed(p)
    }
}

impl DTypeRequest {
    /// The format (or mix) asked for, when it is not `auto`.
    pub fn fixed(self) -> Option<DTypePlan> {
        match self {
            DTypeRequest::Auto => None,
            DTypeRequest::Fixed(d) => Some(d),
        }
    }

    /// `auto`, or the plan's text form ([`DTypePlan::label`]).
    pub fn label(self) -> String {
        match self {
            DTypeRequest::Auto => "auto".to_owned(),
            DTypeRequest::Fixed(d) => d.label(),
        }
    }
}

impl std::str::FromStr for DTypeRequest {
    type Err = Error;
    /// `auto`, or what [`DTypePlan`] parses: a format (case-insensitive) or `PART=FORMAT` entries.
    fn from_str(s: &str) -> Result<Self> {
        if s.trim().eq_ignore_ascii_case("auto") {
            return Ok(DTypeRequest::Auto);
        }
        match s.parse::<DTypePlan>() {
            Ok(p) => Ok(DTypeRequest::Fixed(p)),
            Err(Error::UnknownDType { got, .. }) => Err(Error::UnknownDType {
                got,
                expected:
                    "auto, fp32, fp16, q8 or q4, or PART=FORMAT entries (vision=fp16,text=q4)",
            }),
            Err(e) => Err(e),
        }
    }
}

/// What the chooser knows of `gpu`: its class (from the adapter's type, a software adapter or the
/// CPU backend counting as `cpu`; `mobile` from the platform, which the adapter does not say) and
/// its buffer limits.
pub fn device_limits(gpu: &Device, mobile: bool) -> DeviceLimits {
    let c = &gpu.caps;
    let class = DeviceClass::of_adapter(&c.device_type, c.is_cpu || gpu.is_host(), mobile);
    DeviceLimits {
        class,
        budget: class.budget(),
        max_buffer: c.max_buffer,
        max_binding: c.max_storage_binding,
    }
}

/// The format `request` resolves to for the model in `files` on `gpu`: the fixed one as it is, or
/// `auto`'s choice with its reason (a named [`Error::NoFittingDType`] when nothing fits).
pub async fn resolve_dtype<F: ModelFiles>(
    request: DTypeRequest,
    files: &F,
    gpu: &Device,
    mobile: bool,
) -> Result<(DTypePlan, Option<String>)> {
    resolve_dtype_for(request, files, &device_limits(gpu, mobile), gpu.is_host()).await
}

/// The one `dtype` rule: the fixed format as it is, or the best-quality format whose estimate for
/// the model in `files` fits a device of `limits` (`host`: the CPU backend's sizes), with its reason.
pub async fn resolve_dtype_for<F: ModelFiles>(
    request: DTypeRequest,
    files: &F,
    limits: &DeviceLimits,
    host: bool,
) -> Result<(DTypePlan, Option<String>)> {
    if let Some(d) = request.fixed() {
        return Ok((d, None));
    }
    let facts = ModelFacts::read(files).await?;
    let opts = EstimateOptions {
        max_binding: limits.max_binding,
        host,
        ..Default::default()
    };
    let all = facts.estimate_all(&opts)?;
    let Choice { dtype, reason } = choose_dtype(&all, limits)?;
    Ok((dtype, Some(reason)))
}
