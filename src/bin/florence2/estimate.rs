//! `florence2 estimate`: what a model needs in each weight format on this device, before loading it:
//! the download, the resident weights, a request's peak and the largest buffer, whether each fits the
//! device, and what `--dtype auto` would choose (`florence2_wasm::estimate`; no weight is read). One
//! JSON object on stdout.

use std::path::PathBuf;

use clap::Args;
use florence2_wasm::estimate::{
    choose_dtype, device_limits, fits, DTypeRequest, EstimateOptions, ModelFacts,
};
use florence2_wasm::gpu::DeviceOptions;
use florence2_wasm::pipeline::{open_device, DeviceChoice};
use florence2_wasm::weights::DirFiles;
use serde_json::json;

use super::Failure;

#[derive(Args, Debug)]
pub struct EstimateArgs {
    /// Model directory or hub id org/name[@revision] (as for `run`)
    #[arg(long, value_name = "DIR|ORG/NAME")]
    model: PathBuf,
    /// One format or a mix (PART=FORMAT,...: vision, projector, encoder, decoder, embed, text), or auto
    /// (every format, the mixes auto considers, and the choice)
    #[arg(long, value_name = "auto|fp32|fp16|q8|q4|PART=FORMAT,..", default_value = "auto", value_parser = super::parse_dtype_request)]
    dtype: DTypeRequest,
    /// The device whose limits and class the estimate is judged against (as for `run`)
    #[arg(long, value_name = "auto|gpu|cpu", default_value = "auto", value_parser = super::parse_device)]
    device: DeviceChoice,
    /// New tokens a request may generate [default: 1024, capped by the position table]
    #[arg(long, value_name = "N")]
    max_new_tokens: Option<usize>,
    /// Beams [default: the model's generation config]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    num_beams: Option<u16>,
}

pub fn estimate_cmd(a: EstimateArgs) -> Result<(), Failure> {
    let dir = super::model_dir(&a.model)?;
    let gpu = pollster::block_on(open_device(a.device, DeviceOptions::default()))?;
    let facts = pollster::block_on(ModelFacts::read(&DirFiles::new(&dir)))?;
    let opts = EstimateOptions {
        max_new_tokens: a.max_new_tokens,
        num_beams: a.num_beams.map(usize::from),
        max_binding: gpu.caps.max_storage_binding,
        host: gpu.is_host(),
        ..Default::default()
    };
    let limits = device_limits(&gpu, false);
    let all = facts.estimate_with(a.dtype.fixed(), &opts)?;
    let shown: Vec<serde_json::Value> = all
        .iter()
        .filter(|e| a.dtype.fixed().is_none_or(|d| d == e.dtype))
        .map(|e| {
            let (ok, reason) = fits(e, &limits);
            let mut v = json!(e);
            v["fits"] = json!(ok);
            v["reason"] = json!(reason);
            v
        })
        .collect();
    let mut out = json!({
        "model": dir.display().to_string(),
        "adapter": gpu.describe(),
        "device": {
            "class": limits.class,
            "budget_bytes": limits.budget,
            "max_buffer_bytes": limits.max_buffer,
            "max_binding_bytes": limits.max_binding,
        },
        "estimates": shown,
    });
    if a.dtype == DTypeRequest::Auto {
        out["auto"] = match choose_dtype(&all, &limits) {
            Ok(c) => json!({"dtype": c.dtype, "reason": c.reason}),
            Err(e) => json!({"error": e.name(), "message": e.to_string()}),
        };
    }
    super::print_json(&out)
}
