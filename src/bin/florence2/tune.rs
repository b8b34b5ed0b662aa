//! `florence2 tune`: load a model, run the kernel tuner for the shapes it runs at an image size, print the
//! table (op and shape class, each candidate's time, the chosen one). The choice is cached like a normal
//! load's (user cache directory), so this also pre-warms later runs. Like every front end it tunes
//! through `Pipeline::tune`; a failed run prints the report and its warning and, tuning being this
//! command's whole job, exits non-zero (`run` and `serve` go on with the static choices).

use std::path::PathBuf;

use clap::Args;
use florence2_wasm::estimate::DTypeRequest;
use florence2_wasm::gpu::tune::{TuneOptions, Tuning};
use florence2_wasm::pipeline::{open, DeviceChoice, OpenOptions, Opened};
use florence2_wasm::weights::DirFiles;

use super::Failure;

#[derive(Args, Debug)]
pub struct TuneArgs {
    /// Model directory or hub id org/name[@revision] (as for `run`)
    #[arg(long, value_name = "DIR|ORG/NAME")]
    model: PathBuf,
    /// Square image side the shapes are derived for [default: the processor's size]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=8192))]
    image_size: Option<u32>,
    /// Rows of a decode step (beams) [default: the model's num_beams]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    num_beams: Option<u16>,
    /// auto: time what the cache lacks; exhaustive: ignore the cache and time every candidate at the
    /// full shape; off: print nothing timed
    #[arg(long, value_name = "MODE", default_value = "exhaustive", value_parser = parse_tuning)]
    tuning: Tuning,
    /// Time budget of `auto` in ms (classes left over are timed by later runs) [default: none here;
    /// a model load uses 3000]
    #[arg(long, value_name = "MS", value_parser = parse_budget)]
    budget_ms: Option<f64>,
    /// Device: auto (a hardware GPU, else the CPU backend, also when the only adapter is a software
    /// one), gpu (any wgpu adapter), or cpu (the CPU backend, on all cores)
    #[arg(long, value_name = "auto|gpu|cpu", default_value = "auto", value_parser = super::parse_device)]
    device: DeviceChoice,
    /// Resident weight format the shapes are tuned with (the default is `run`'s, so a plain `tune`
    /// pre-warms a plain `run`; auto: the best that fits)
    #[arg(long, value_name = "auto|fp32|fp16|q8|q4|PART=FORMAT,..", default_value = super::DEFAULT_DTYPE, value_parser = super::parse_dtype_request)]
    dtype: DTypeRequest,
}

fn parse_budget(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        _ => Err(format!("takes milliseconds >= 0, got {s:?}")),
    }
}

pub fn parse_tuning(s: &str) -> Result<Tuning, String> {
    s.parse::<Tuning>().map_err(|e| e.to_string())
}

pub fn tune_cmd(a: TuneArgs) -> Result<(), Failure> {
    let dir = super::model_dir(&a.model)?;
    let opts = OpenOptions {
        device: a.device,
        dtype: a.dtype,
        tuning: TuneOptions::new(a.tuning).with_budget_ms(a.budget_ms),
        tune_image_size: a.image_size.map(|n| n as usize),
        tune_beams: a.num_beams.map(usize::from),
        ..OpenOptions::default()
    };
    let files = DirFiles::new(&dir);
    let Opened {
        gpu,
        dtype,
        dtype_reason,
        tuning: report,
        tune_sizes: sizes,
        ..
    } = pollster::block_on(open(&files, &files, &opts))?;
    if let Some(r) = &dtype_reason {
        eprintln!("florence2 tune: dtype auto: {r}");
    }
    let (h, w, beams) = (sizes.height, sizes.width, sizes.beams);
    super::out(&format!(
        "adapter: {}\nweights: {dtype}\nimage {w}x{h}, decode rows 1 and {beams}, tuning {}; cache: {}\n{}",
        gpu.describe(),
        a.tuning.name(),
        report.cache_path.as_deref().unwrap_or("none"),
        report.table()
    ))?;
    for warning in &report.warnings {
        eprintln!("warning: {warning}");
    }
    // Tuning is all this command does: a failed run (static choices kept) is a failed command.
    // So is a cache it could not write (a full disk, say): later runs would not find the choices.
    match (report.failed, report.cache_error) {
        (Some(e), _) => Err(Failure::Run(format!("kernel tuning failed: {e}"))),
        (None, Some(e)) => Err(Failure::Run(e)),
        (None, None) => Ok(()),
    }
}
