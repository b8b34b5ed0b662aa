//! The settings a pipeline runs with, read from a model's JSON files.

use crate::config::Florence2Config;
use crate::error::Result;
use crate::model::generate::GenerateOptions;
use crate::pipeline::options::DEFAULT_MAX_NEW_TOKENS;
use crate::processor::custom_tasks::CustomTasks;
use crate::processor::image::{ImageLimits, ImageProcessorConfig};
use crate::processor::tokenizer::Florence2Tokenizer;

/// Tokenizer, image processor, input limits and generation defaults of one model.
pub struct Settings {
    pub tokenizer: Florence2Tokenizer,
    pub processor: ImageProcessorConfig,
    pub limits: ImageLimits,
    pub generation: GenerateOptions,
    /// The model's own task markers (fine-tunes) on top of the 15 built-in ones; see
    /// [`Settings::with_processor_tasks`].
    pub tasks: CustomTasks,
}

impl Settings {
    /// From the model's files: `tokenizer.json`, and the optional `preprocessor_config.json` (else
    /// Florence-2's processor) and `generation_config.json` (over config.json's settings, over
    /// Florence-2's defaults: 3 beams, no-repeat-n-gram 3). Default limits, max 1024 new tokens; the generation ids are checked against the vocabulary.
    pub fn from_files(
        config: &Florence2Config,
        tokenizer_json: &[u8],
        preprocessor_json: Option<&[u8]>,
        generation_json: Option<&[u8]>,
    ) -> Result<Settings> {
        let tokenizer = Florence2Tokenizer::from_json_bytes(tokenizer_json)?;
        let processor = match preprocessor_json {
            Some(b) => ImageProcessorConfig::from_json_bytes(b)?,
            None => ImageProcessorConfig::default(),
        };
        let mut generation = GenerateOptions::from_config(config, DEFAULT_MAX_NEW_TOKENS);
        if let Some(b) = generation_json {
            generation = generation.with_generation_config(b)?;
        }
        generation.check_ids(config.text.vocab_size)?;
        Ok(Settings {
            tokenizer,
            processor,
            limits: ImageLimits::default(),
            generation,
            tasks: CustomTasks::new(),
        })
    }

    /// Add the task markers a processor config declares (`processor_config.json` or
    /// `preprocessor_config.json`: `task_prompts_without_inputs`, `task_prompts_with_input`, `tasks`).
    pub fn with_processor_tasks(mut self, config_json: Option<&[u8]>) -> Result<Settings> {
        if let Some(b) = config_json {
            self.tasks.extend(&CustomTasks::from_processor_config(b)?)?;
        }
        Ok(self)
    }
}
