//! Loading a model into a [`Pipeline`], the same natively and in the browser: every file through a
//! [`ModelSource`] (a native directory, memory, the browser's `fetch()`), in this order: `config.json`,
//! the settings (`tokenizer.json`, the optional `preprocessor_config.json` and
//! `generation_config.json`), the model's own task markers (`processor_config.json`, then
//! `preprocessor_config.json`, then the caller's), then the weights ([`ModelSource::load_weights`]: streamed
//! into GPU buffers, inside the device's error scopes) and the model.

use std::sync::Arc;

use crate::error::Result;
use crate::gpu::Device;
use crate::model::florence2::Florence2;
use crate::pipeline::{Pipeline, Settings};
use crate::processor::custom_tasks::CustomTasks;
use crate::processor::image::ImageLimits;
use crate::processor::tokenizer::MAX_TOKENIZER_JSON_BYTES;
use crate::weights::load::{load_config, MAX_JSON_BYTES};
use crate::weights::{DTypePlan, LoadOptions, ModelSource};

const TOKENIZER_FILE: &str = "tokenizer.json";
const PREPROCESSOR_FILE: &str = "preprocessor_config.json";
const GENERATION_FILE: &str = "generation_config.json";
const PROCESSOR_FILE: &str = "processor_config.json";

/// How to load a pipeline.
#[derive(Clone, Debug, Default)]
pub struct PipelineOptions {
    /// The weights' resident dtype and the loader's chunk sizes.
    pub weights: LoadOptions,
    /// Task markers of the caller's, on top of the model's own.
    pub tasks: CustomTasks,
    /// Input limits.
    pub limits: ImageLimits,
}

impl PipelineOptions {
    /// Default options with weights resident in `dtype`.
    pub fn with_dtype(dtype: impl Into<DTypePlan>) -> Self {
        PipelineOptions {
            weights: LoadOptions::with_dtype(dtype),
            ..Default::default()
        }
    }
}

impl Pipeline {
    /// Load a model from `src` (see the module doc for the files and their order); returns once the
    /// weights are on the GPU. A failed GPU allocation is [`crate::Error::OutOfMemory`].
    pub async fn load<S: ModelSource>(
        gpu: &Arc<Device>,
        src: &S,
        opts: &PipelineOptions,
    ) -> Result<Pipeline> {
        let cfg = load_config(src).await?;
        let tok = src
            .read_small(TOKENIZER_FILE, true, MAX_TOKENIZER_JSON_BYTES as u64)
            .await?
            .unwrap_or_default();
        let pre = src
            .read_small(PREPROCESSOR_FILE, false, MAX_JSON_BYTES)
            .await?;
        let gen = src
            .read_small(GENERATION_FILE, false, MAX_JSON_BYTES)
            .await?;
        let mut settings = Settings::from_files(&cfg, &tok, pre.as_deref(), gen.as_deref())?;
        drop(tok);
        settings.limits = opts.limits;
        let proc = src
            .read_small(PROCESSOR_FILE, false, MAX_JSON_BYTES)
            .await?;
        settings = settings
            .with_processor_tasks(proc.as_deref())?
            .with_processor_tasks(pre.as_deref())?;
        settings.tasks.extend(&opts.tasks)?;

        let dtype = opts.weights.dtype;
        let model = gpu
            .scoped(async {
                let weights = src.load_weights(gpu, &cfg, opts.weights.clone()).await?;
                let model = Florence2::new(gpu, cfg, &weights)?;
                drop(weights);
                gpu.check()?;
                Ok(model)
            })
            .await?;
        gpu.wait_idle()?;
        Ok(Pipeline::new(model, settings).with_weight_dtype(dtype))
    }

    /// Natively, [`Pipeline::load`] from the directory `dir`, with f32 weights (the reference
    /// precision); see [`Pipeline::load_dir_with`] for the resident dtype (fp16, q8, q4).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load_dir(gpu: &Arc<Device>, dir: &std::path::Path) -> Result<Pipeline> {
        Self::load_dir_with(
            gpu,
            dir,
            LoadOptions::with_dtype(crate::weights::WeightDType::Fp32),
        )
    }

    /// [`Pipeline::load_dir`] with loader options (resident dtype, chunk sizes).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load_dir_with(
        gpu: &Arc<Device>,
        dir: &std::path::Path,
        opts: LoadOptions,
    ) -> Result<Pipeline> {
        let opts = PipelineOptions {
            weights: opts,
            ..Default::default()
        };
        let files = crate::weights::DirFiles::new(dir);
        pollster::block_on(Self::load(gpu, &files, &opts))
    }
}
