//! The model behind the server: a thin adapter over the library [`Pipeline`] (no model sequencing here).
//! It loads a model directory and runs one (image, prompt) request, returning what the response needs.

use std::path::Path;

use image::RgbImage;

use florence2_wasm::gpu::{Gpu, GpuOptions};
use florence2_wasm::pipeline::{Callbacks, Image, Pipeline, TaskInput, TaskOptions, TaskOutput};
use florence2_wasm::processor::prompt::TaskPrompt;
use florence2_wasm::Result;

/// What the HTTP side needs to know about the loaded model.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// Largest effective `max_tokens`: the decoder's positions minus the start token.
    pub max_new_tokens: usize,
}

/// One answer: the pipeline's output plus what the usage block and the metrics need.
#[derive(Clone, Debug)]
pub struct Answer {
    pub out: TaskOutput,
    /// Encoder sequence length: image features + prompt tokens.
    pub encoder_tokens: usize,
    /// Whether generation ended on an end-of-sequence token (else it hit `max_tokens`).
    pub stopped: bool,
    /// Preprocess + vision + encoder, seconds.
    pub encode_s: f64,
    /// Decoding, seconds.
    pub generate_s: f64,
}

impl Answer {
    pub fn completion_tokens(&self) -> usize {
        self.out.token_ids.len().saturating_sub(1)
    }
}

pub struct Engine {
    pipeline: Pipeline,
}

impl Engine {
    /// Open the GPU and load `dir` into a pipeline.
    pub fn load(dir: &Path) -> std::result::Result<Engine, String> {
        let load = || -> Result<Engine> {
            let gpu = pollster::block_on(Gpu::new(GpuOptions::default()))?;
            Ok(Engine {
                pipeline: Pipeline::load_dir(&gpu, dir)?,
            })
        };
        load().map_err(|e| format!("loading {}: {e}", dir.display()))
    }

    pub fn info(&self) -> ModelInfo {
        let positions = self.pipeline.model().config.text.max_position_embeddings;
        ModelInfo {
            max_new_tokens: positions.saturating_sub(1).max(1),
        }
    }

    /// Run one request. `cancel` is asked between stages and before every decode step (the caller also
    /// asks it before calling, so a request cancelled while queued never reaches the GPU).
    pub fn run(
        &self,
        image: &RgbImage,
        prompt: &TaskPrompt,
        max_tokens: Option<usize>,
        num_beams: Option<usize>,
        cancel: &dyn Fn() -> bool,
    ) -> Result<Answer> {
        let p = &self.pipeline;
        let encoded = p.encode_image(Image::Rgb(image))?;
        let prompt_tokens = p.tokenizer().encode_prompt(&prompt.encoder_text())?.len();
        let options = TaskOptions {
            max_new_tokens: max_tokens,
            num_beams,
            ..TaskOptions::default()
        };
        let text = format!("{}{}", prompt.task().marker(), prompt.input().unwrap_or(""));
        let out = p.run_task_blocking(
            TaskInput::Encoded(&encoded),
            &text,
            &options,
            &cancel,
            &Callbacks::default(),
        )?;
        let stopped = out.token_ids.len() > 1
            && out
                .token_ids
                .last()
                .is_some_and(|t| p.generation().eos_token_ids.contains(t));
        let t = &out.timings;
        let encode_ms =
            encoded.preprocess_ms() + encoded.vision_ms() + t.preprocess_ms + t.encoder_ms;
        Ok(Answer {
            encoder_tokens: encoded.tokens() + prompt_tokens,
            stopped,
            encode_s: encode_ms / 1e3,
            generate_s: t.decode_ms / 1e3,
            out,
        })
    }
}
