//! `dtype: "auto"` at load: the device's limits from its capabilities, the model's estimates from its
//! files (no weights read), and the chooser's pick ([`choose_dtype`]).

use crate::error::{Error, Result};
use crate::estimate::ModelFacts;
use crate::estimate::{choose_dtype, Choice, DeviceClass, DeviceLimits, EstimateOptions};
use crate::gpu::Device;
use crate::weights::source::ModelFiles;
use crate::weights::WeightDType;

/// A `dtype` option: one weight format, or `auto` (the best-quality format that fits the device).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DTypeRequest {
    Auto,
    Fixed(WeightDType),
}

impl Default for DTypeRequest {
    /// fp16 ([`WeightDType::default`]).
    fn default() -> Self {
        DTypeRequest::Fixed(WeightDType::default())
    }
}

impl DTypeRequest {
    /// The format asked for, when it is not `auto`.
    pub fn fixed(self) -> Option<WeightDType> {
        match self {
            DTypeRequest::Auto => None,
            DTypeRequest::Fixed(d) => Some(d),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DTypeRequest::Auto => "auto",
            DTypeRequest::Fixed(d) => d.as_str(),
        }
    }
}

impl std::str::FromStr for DTypeRequest {
    type Err = Error;
    /// `auto`, or a format [`WeightDType`] parses (case-insensitive).
    fn from_str(s: &str) -> Result<Self> {
        if s.eq_ignore_ascii_case("auto") {
            return Ok(DTypeRequest::Auto);
        }
        s.parse::<WeightDType>()
            .map(DTypeRequest::Fixed)
            .map_err(|_| Error::UnknownDType {
                got: s.chars().take(32).collect(),
                expected: "auto, fp32, fp16, q8 or q4",
            })
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
) -> Result<(WeightDType, Option<String>)> {
    resolve_dtype_for(request, files, &device_limits(gpu, mobile), gpu.is_host()).await
}

/// The one `dtype` rule: the fixed format as it is, or the best-quality format whose estimate for
/// the model in `files` fits a device of `limits` (`host`: the CPU backend's sizes), with its reason.
pub async fn resolve_dtype_for<F: ModelFiles>(
    request: DTypeRequest,
    files: &F,
    limits: &DeviceLimits,
    host: bool,
) -> Result<(WeightDType, Option<String>)> {
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
