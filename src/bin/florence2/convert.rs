//! `florence2 convert`: a checkpoint the loader reads into the package's own format
//! ([`florence2_wasm::weights::export::convert_dir`]), then a summary: tensors and bytes per format.

use std::path::PathBuf;

use clap::Args;
use florence2_wasm::hub_cache::ModelId;
use florence2_wasm::weights::export::{convert_dir, parse_size, ExportOptions};
use florence2_wasm::weights::DTypePlan;

use super::Failure;

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// Source model directory (any checkpoint `run` loads: safetensors or pytorch_model.bin, single or
    /// sharded, any layout, f32/f16/bf16/q8/q4), or a hub id org/name[@revision] (as for `run`)
    #[arg(long, value_name = "SRC|ORG/NAME")]
    model: PathBuf,
    /// Target format of the matrix weights (loading the output with this --dtype gives exactly the
    /// weights of loading SRC with it); a format per part (vision=fp16,text=q4) with at most one of
    /// q8 and q4
    #[arg(long, value_name = "fp32|fp16|q8|q4|PART=FORMAT,..", value_parser = parse_dtype)]
    dtype: DTypePlan,
    /// Split the weights into files of at most this size (500MB, 100MiB, bytes), with
    /// model.safetensors.index.json
    #[arg(long, value_name = "N", value_parser = parse_shard_size)]
    shard_size: Option<u64>,
    /// Output directory (must not exist, or be empty)
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

fn parse_dtype(s: &str) -> Result<DTypePlan, String> {
    s.parse().map_err(|e: florence2_wasm::Error| e.to_string())
}

fn parse_shard_size(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

pub fn convert_cmd(a: ConvertArgs) -> Result<(), Failure> {
    let is_id = a.model.to_str().and_then(ModelId::parse).is_some();
    if !a.model.is_dir() && !is_id {
        return Err(Failure::Usage(format!(
            "--model {}: not a directory (nor a hub id org/name[@revision])",
            a.model.display()
        )));
    }
    let src = super::model_dir(&a.model)?;
    let mut opts = ExportOptions::new(a.dtype);
    opts.shard_size = a.shard_size;
    let s = convert_dir(&src, &a.out, &opts)?;
    for n in &s.notes {
        super::out_line(n)?;
    }
    if !s.dropped.is_empty() {
        super::out_line(&format!("tied copies dropped: {}", s.dropped.join(", ")))?;
    }
    if !s.ignored.is_empty() {
        super::out_line(&format!(
            "{} source tensors the model does not use left out",
            s.ignored.len()
        ))?;
    }
    for (label, (n, bytes)) in s.by_format() {
        super::out_line(&format!("{label:>5}: {n:4} tensors, {bytes:>12} bytes"))?;
    }
    let files: Vec<&str> = s.files.iter().map(|f| f.name.as_str()).collect();
    super::out_line(&format!(
        "wrote {}: {} tensors ({}), {} bytes in {} file(s): {}",
        a.out.display(),
        s.tensors(),
        s.dtype,
        s.file_bytes(),
        files.len(),
        files.join(", ")
    ))
}
