//! `MemoryEstimate`, the JS packages' estimate object (camelCase), built once for both engines: the
//! wasm facade (`Florence2.estimate` in a browser or in Node on the wasm) and the Node addon (the native
//! engine), so the two answer in the same shape by the same rule.

use serde::Serialize;

use super::{choose_dtype, fits, DeviceClass, DeviceLimits, Estimate, PartBytes};
use crate::error::{Error, Result};
use crate::weights::DTypePlan;

/// The largest integer a JS number holds exactly (2^53 - 1): the CPU backend's "no limit" (u64::MAX)
/// is reported as it.
const MAX_SAFE: u64 = (1 << 53) - 1;

/// One format's estimate for JS, judged against a device's limits.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EstimateReport {
    pub dtype: DTypePlan,
    pub download_bytes: u64,
    pub weights_bytes: u64,
    pub part_bytes: PartBytes,
    pub peak_bytes: u64,
    pub largest_buffer_bytes: u64,
    pub fits: bool,
    pub reason: String,
    pub vision_bytes: u64,
    pub encoder_bytes: u64,
    pub decode_bytes: u64,
    pub stored: String,
    pub exact: bool,
    pub note: String,
    pub device: DeviceReport,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimates: Option<Vec<EstimateReport>>,
}

/// The limits an estimate was judged against.
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceReport {
    pub class: DeviceClass,
    pub budget_bytes: u64,
    pub max_buffer_size: u64,
    pub max_storage_buffer_binding_size: u64,
}

impl EstimateReport {
    /// `e` judged against `limits`.
    pub fn of(e: &Estimate, limits: &DeviceLimits) -> EstimateReport {
        let (ok, reason) = fits(e, limits);
        EstimateReport {
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
            device: DeviceReport {
                class: limits.class,
                budget_bytes: limits.budget,
                max_buffer_size: limits.max_buffer.min(MAX_SAFE),
                max_storage_buffer_binding_size: limits.max_binding.min(MAX_SAFE),
            },
            estimates: None,
        }
    }

    /// What `estimate` answers from every format's estimate `all`: the `fixed` format's, or (None:
    /// `dtype: "auto"`) the chosen format's with its reason and every estimate beside it.
    pub fn answer(
        all: &[Estimate],
        limits: &DeviceLimits,
        fixed: Option<DTypePlan>,
    ) -> Result<EstimateReport> {
        let find = |d: DTypePlan| {
            all.iter()
                .find(|e| e.dtype == d)
                .map(|e| EstimateReport::of(e, limits))
                .ok_or_else(|| Error::InvalidInput(format!("no estimate for {d}")))
        };
        match fixed {
            Some(d) => find(d),
            None => {
                let choice = choose_dtype(all, limits)?;
                let mut chosen = find(choice.dtype)?;
                chosen.reason = choice.reason;
                chosen.estimates =
                    Some(all.iter().map(|e| EstimateReport::of(e, limits)).collect());
                Ok(chosen)
            }
        }
    }
}
