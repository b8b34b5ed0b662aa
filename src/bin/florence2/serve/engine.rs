//! The model behind the server: a thin adapter over the library [`Pipeline`] (no model sequencing here).
//! It loads a model directory and runs one (image, prompt) request, returning what the response needs.

use std::path::Path;
use std::sync::Arc;

use image::RgbImage;

use florence2_wasm::estimate::DTypeRequest;
use florence2_wasm::gpu::tune::{RowStatus, TuneOptions, Tuning};
use florence2_wasm::pipeline::{
    open, DeviceChoice, EncodedImage, Image, OpenOptions, Opened, Pipeline, PrepareItem, Prepared,
    TaskOptions, TaskOutput,
};
use florence2_wasm::postprocess::post_process_generation;
use florence2_wasm::processor::custom_tasks::AnyTaskPrompt;
use florence2_wasm::processor::custom_tasks::CustomTasks;
use florence2_wasm::processor::prompt::AnswerType;
use florence2_wasm::render::render;
use florence2_wasm::weights::{DTypePlan, DirFiles};
use florence2_wasm::Result;

/// What the HTTP side needs to know about the loaded model.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// The resident weight format (`--dtype`, or what `auto` chose), and why `auto` chose it (/health).
    pub dtype: DTypePlan,
    pub dtype_reason: Option<String>,
    /// Largest effective `max_tokens`: the decoder's positions minus the start token.
    pub max_new_tokens: usize,
    /// What the kernel tuner did at load (reported by /health).
    pub tuning: TuningInfo,
    /// The model's own task markers (accepted beside the built-in ones, listed by /v1/models).
    pub tasks: Arc<CustomTasks>,
}

/// The load's kernel tuning: mode and how many shape classes were timed, read from the per-adapter
/// cache, or left for a later start (budget spent).
#[derive(Clone, Debug, serde::Serialize)]
pub struct TuningInfo {
    pub mode: &'static str,
    pub timed: usize,
    pub cached: usize,
    pub skipped: usize,
    pub ms: f64,
    /// The cache file, when one was used.
    pub cache: Option<String>,
}

/// One answer: the pipeline's output (with its token counts and stop reason) plus the timings the
/// metrics need and what was streamed.
#[derive(Clone, Debug)]
pub struct Answer {
    pub out: TaskOutput,
    /// Preprocess + vision + encoder, seconds.
    pub encode_s: f64,
    /// Decoding, seconds.
    pub generate_s: f64,
    /// What `on_text` already delivered: a prefix of `out.text`.
    pub streamed: String,
    /// What a tiled run chose (`florence2.tiles`; `None` for one view).
    pub tiles: Option<serde_json::Value>,
}

pub struct Engine {
    pipeline: Pipeline,
    tuning: TuningInfo,
    /// Why `--dtype auto` chose the resident format.
    dtype_reason: Option<String>,
}

impl Engine {
    /// Open the GPU, load `dir` into a pipeline with `dtype` resident weights (`auto`: the choice is
    /// printed on stderr) and tune the kernels for
    /// its shapes (as `florence2 run` does; cached per adapter in the user's cache directory). A failed
    /// tuning only costs speed: the static choices stay and a warning is printed.
    pub fn load(
        dir: &Path,
        dtype: DTypeRequest,
        tuning: Tuning,
        device: DeviceChoice,
    ) -> std::result::Result<Engine, String> {
        let load = || -> Result<Engine> {
            let opts = OpenOptions {
                device,
                dtype,
                tuning: TuneOptions::new(tuning),
                ..OpenOptions::default()
            };
            let files = DirFiles::new(dir);
            let Opened {
                pipeline,
                dtype_reason,
                tuning: r,
                ..
            } = pollster::block_on(open(&files, &files, &opts))?;
            if let Some(r) = &dtype_reason {
                eprintln!("florence2 serve: dtype auto: {r}");
            }
            // A failed tuning only costs speed: the static choices stay and the report says so.
            for w in &r.warnings {
                eprintln!("florence2 serve: warning: {w}");
            }
            let count = |s: RowStatus| r.rows.iter().filter(|x| x.status == s).count();
            let info = TuningInfo {
                mode: tuning.name(),
                timed: count(RowStatus::Timed),
                cached: count(RowStatus::Cached),
                skipped: count(RowStatus::Skipped),
                ms: r.elapsed_ms,
                cache: r.cache_path.clone(),
            };
            if tuning != Tuning::Off {
                eprintln!(
                    "florence2 serve: kernel tuning {}: {} classes timed, {} cached, {} left for a later start ({:.0} ms)",
                    info.mode, info.timed, info.cached, info.skipped, info.ms
                );
            }
            Ok(Engine {
                pipeline,
                tuning: info,
                dtype_reason,
            })
        };
        load().map_err(|e| format!("loading {}: {e}", dir.display()))
    }

    pub fn info(&self) -> ModelInfo {
        let positions = self.pipeline.model().config.text.max_position_embeddings;
        ModelInfo {
            max_new_tokens: positions.saturating_sub(1).max(1),
            dtype: self.pipeline.weight_dtype(),
            dtype_reason: self.dtype_reason.clone(),
            tuning: self.tuning.clone(),
            tasks: Arc::new(self.pipeline.tasks().clone()),
        }
    }

    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// The images of the requests that join the batch together, through the vision tower as one batch
    /// where that gives each image its own bits ([`Pipeline::encode_images`]), else one by one.
    pub fn encode_images(&self, images: &[&RgbImage]) -> Vec<Result<EncodedImage>> {
        let images: Vec<Image> = images.iter().map(|i| Image::Rgb(i)).collect();
        self.pipeline.encode_images(&images)
    }

    /// Everything of the requests joining the batch together before decoding, on their encoded images
    /// (prompt, encoder): prompts of one encoder length share the encoder's batch
    /// ([`Pipeline::prepare_batch`]), each with the bits it gets alone. Each result is the task for a
    /// [`florence2_wasm::pipeline::DecodeBatch`] and the streamer of its text when the request streams
    /// and the answer can stream (greedy decoding of a text task).
    pub fn prepare_batch(
        &self,
        requests: &[Request<'_>],
    ) -> Vec<Result<(Prepared, Option<TextStream>)>> {
        let items: Vec<PrepareItem> = requests
            .iter()
            .map(|r| PrepareItem {
                image: r.image,
                prompt: r.prompt.clone(),
                options: TaskOptions {
                    max_new_tokens: r.limits.0,
                    num_beams: r.limits.1,
                    ..TaskOptions::default()
                },
            })
            .collect();
        let prepared = self.pipeline.prepare_batch(&items);
        prepared
            .into_iter()
            .zip(requests)
            .map(|(p, r)| Ok(with_streamer(p?, r.image, r.prompt, r.stream)))
            .collect()
    }
}

/// One request of [`Engine::prepare_batch`]: its encoded image, task, (max tokens, beams) and whether it
/// streams.
pub struct Request<'a> {
    pub image: &'a EncodedImage,
    pub prompt: &'a AnyTaskPrompt,
    pub limits: (Option<usize>, Option<usize>),
    pub stream: bool,
}

/// The task and the streamer of its text when `stream` asks for one and the answer can stream (greedy
/// decoding of a text task).
fn with_streamer(
    prepared: Prepared,
    image: &EncodedImage,
    prompt: &AnyTaskPrompt,
    stream: bool,
) -> (Prepared, Option<TextStream>) {
    let greedy = prepared.generation().num_beams == 1;
    let text_task = prompt.answer_task().answer_type() == AnswerType::PureText;
    let streamer = (stream && greedy && text_task).then(|| TextStream {
        task: prompt.clone(),
        image_size: image.image_size(),
        raw: String::new(),
        emitted: String::new(),
    });
    (prepared, streamer)
}

impl Answer {
    /// The answer to a request from its task output, the seconds its image took to encode (its share
    /// of a batch) and what its stream delivered.
    pub fn new(out: TaskOutput, image_s: f64, streamed: String) -> Answer {
        let t = &out.timings;
        Answer {
            encode_s: image_s + (t.preprocess_ms + t.encoder_ms) / 1e3,
            generate_s: t.decode_ms / 1e3,
            streamed,
            out,
            tiles: None,
        }
    }
}

/// Streams a text answer as it is generated, exactly: after each token the partial generation is
/// post-processed and rendered like the final answer, and only what extends what was already sent is
/// sent. For text answers (special tokens removed, whitespace stripped, control characters escaped) the
/// rendering of a prefix is a prefix of the final rendering, so the deltas concatenate to the final
/// content; anything that would break that is held back and sent with the final chunk instead.
pub struct TextStream {
    task: AnyTaskPrompt,
    image_size: (u32, u32),
    raw: String,
    emitted: String,
}

impl TextStream {
    /// Add a token's text; returns what extends the text already sent, if anything.
    pub fn push(&mut self, piece: &str) -> Option<String> {
        self.raw.push_str(piece);
        let result =
            post_process_generation(&self.raw, self.task.answer_task(), self.image_size).ok()?;
        let text = render(&result);
        if text.len() > self.emitted.len() && text.starts_with(self.emitted.as_str()) {
            let delta = text[self.emitted.len()..].to_string();
            self.emitted = text;
            Some(delta)
        } else {
            None
        }
    }

    /// Everything sent so far.
    pub fn emitted(self) -> String {
        self.emitted
    }
}
