//! Native loading of a model directory into a [`Pipeline`] (every file through the byte-capped reader).

use std::path::Path;
use std::sync::Arc;

use crate::error::Result;
use crate::files::{read_capped, read_capped_opt, MAX_JSON_FILE};
use crate::gpu::Gpu;
use crate::model::florence2::Florence2;
use crate::pipeline::{Pipeline, Settings};
use crate::processor::tokenizer::MAX_TOKENIZER_JSON_BYTES;
use crate::weights::{self, LoadOptions, WeightDType};

impl Pipeline {
    /// Load `dir`: config.json, the weights (`model.safetensors` or an index + shards, any supported
    /// layout), `tokenizer.json`, and the optional `preprocessor_config.json` and
    /// `generation_config.json` (see [`Settings::from_files`]), and the model's own task markers from
    /// `processor_config.json` / `preprocessor_config.json` ([`Settings::with_processor_tasks`]). Returns
    /// once the weights are on the GPU.
    ///
    /// Weights are f32 (the reference precision); see [`Pipeline::load_dir_with`] for the resident
    /// dtype (fp16, q8, q4).
    pub fn load_dir(gpu: &Arc<Gpu>, dir: &Path) -> Result<Pipeline> {
        Self::load_dir_with(gpu, dir, LoadOptions::with_dtype(WeightDType::Fp32))
    }

    /// [`Pipeline::load_dir`] with loader options (resident dtype, chunk sizes).
    pub fn load_dir_with(gpu: &Arc<Gpu>, dir: &Path, opts: LoadOptions) -> Result<Pipeline> {
        let dtype = opts.dtype;
        let (cfg, weights) = weights::load_dir_with(gpu, dir, opts)?;
        let settings = Settings::from_files(
            &cfg,
            &read_capped(&dir.join("tokenizer.json"), MAX_TOKENIZER_JSON_BYTES as u64)?,
            read_capped_opt(&dir.join("preprocessor_config.json"), MAX_JSON_FILE)?.as_deref(),
            read_capped_opt(&dir.join("generation_config.json"), MAX_JSON_FILE)?.as_deref(),
        )?
        .with_processor_tasks(
            read_capped_opt(&dir.join("processor_config.json"), MAX_JSON_FILE)?.as_deref(),
        )?
        .with_processor_tasks(
            read_capped_opt(&dir.join("preprocessor_config.json"), MAX_JSON_FILE)?.as_deref(),
        )?;
        let model = Florence2::new(gpu, cfg, &weights)?;
        drop(weights);
        gpu.wait_idle()?;
        Ok(Pipeline::new(model, settings).with_weight_dtype(dtype))
    }
}
