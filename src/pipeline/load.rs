//! Native loading of a model directory into a [`Pipeline`].

use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::model::florence2::Florence2;
use crate::pipeline::{Pipeline, Settings};
use crate::weights;

fn read(dir: &Path, name: &str) -> Result<Vec<u8>> {
    let path = dir.join(name);
    std::fs::read(&path).map_err(|e| Error::FileRead {
        file: path.display().to_string(),
        msg: e.to_string(),
    })
}

fn read_optional(dir: &Path, name: &str) -> Result<Option<Vec<u8>>> {
    if dir.join(name).exists() {
        read(dir, name).map(Some)
    } else {
        Ok(None)
    }
}

impl Pipeline {
    /// Load `dir`: config.json, the weights (`model.safetensors` or an index + shards, any supported
    /// layout), `tokenizer.json`, and the optional `preprocessor_config.json` and
    /// `generation_config.json` (see [`Settings::from_files`]). Returns once the weights are on the GPU.
    pub fn load_dir(gpu: &Arc<Gpu>, dir: &Path) -> Result<Pipeline> {
        let (cfg, weights) = weights::load_dir(gpu, dir)?;
        let settings = Settings::from_files(
            &cfg,
            &read(dir, "tokenizer.json")?,
            read_optional(dir, "preprocessor_config.json")?.as_deref(),
            read_optional(dir, "generation_config.json")?.as_deref(),
        )?;
        let model = Florence2::new(gpu, cfg, &weights)?;
        drop(weights);
        gpu.wait_idle()?;
        Ok(Pipeline::new(model, settings))
    }
}
