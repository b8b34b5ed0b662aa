//! The pipeline: one place that owns a loaded model with its tokenizer, image-processor settings and
//! generation defaults, and runs the whole sequence of a task. The CLI (`src/bin/florence2/`), the JS
//! facade (`src/wasm.rs`) and any later front end (an HTTP server) are thin adapters over it.
//!
//! Data flow (each arrow is a stage in its own module; nothing points back up):
//!
//! ```text
//! image ──processor::image──▶ pixels (1,3,H,W) ──model::davit──▶ features (1,N,C)
//!       ──model::projector──▶ image features (1,1+N,D)            [EncodedImage keeps these]
//! prompt ──processor::prompt + tokenizer──▶ ids ─┐
//! image features ────────────────────────────────┴─model::florence2::encode_prompt─▶ inputs_embeds
//!       ──model::bart::encoder──▶ hidden (1,S,D) ──model::bart::decoder (cross K/V)──▶
//!       ──model::generate (greedy | beam)──▶ ids ──tokenizer──▶ text ──postprocess──▶ TaskResult
//!       ──render──▶ text
//! ```
//!
//! ```no_run
//! # #[cfg(not(target_arch = "wasm32"))]
//! # fn main() -> florence2_wasm::Result<()> {
//! use florence2_wasm::pipeline::{Callbacks, Image, NeverCancel, Pipeline, TaskOptions};
//! let gpu = pollster::block_on(florence2_wasm::gpu::Device::new(Default::default()))?;
//! let p = Pipeline::load_dir(&gpu, std::path::Path::new("Florence-2-base-ft"))?;
//! let bytes = std::fs::read("cat.jpg").unwrap();
//! let img = p.encode_image(Image::Encoded(&bytes))?; // DaViT + projector, once
//! for prompt in ["<CAPTION>", "<OD>", "<OCR>"] {
//!     let out = p.run_task_blocking((&img).into(), prompt, &TaskOptions::default(), &NeverCancel,
//!                                   &Callbacks::default())?;
//!     println!("{}", out.text);
//! }
//! # Ok(()) }
//! # #[cfg(target_arch = "wasm32")] fn main() {}
//! ```
//!
//! Threads: natively the pipeline is `Send + Sync` (wgpu's device, queue and buffers are), so a server
//! shares it in an `Arc` and runs tasks on worker threads; cancel them with a [`CancelToken`].

mod batch;
mod cancel;
mod clock;
mod device;
mod image;
mod load;
mod observe;
mod open;
mod options;
mod output;
#[cfg(not(target_arch = "wasm32"))]
mod prepare_batch;
mod run;
mod settings;
pub mod tiles;
mod tune;

use std::sync::atomic::{AtomicU64, Ordering};

pub use batch::{BatchEvent, DecodeBatch};
pub use cancel::{Cancel, CancelToken, NeverCancel};
pub use clock::Stopwatch;
pub use device::{
    cpu_device, decide_device, open_device, open_device_decided, AdapterProbe, Backend,
    DeviceChoice, DeviceDecision,
};
pub use image::{EncodedImage, Image, TaskInput};
pub use load::PipelineOptions;
pub use observe::{Callbacks, OnToken, Stage};
pub use open::{open, open_on, open_on_observed, OpenObserver, OpenOptions, Opened};
pub use options::{TaskOptions, DEFAULT_MAX_NEW_TOKENS};
pub use output::{StopReason, TaskOutput, Timings, Usage};
#[cfg(not(target_arch = "wasm32"))]
pub use prepare_batch::PrepareItem;
pub use run::Prepared;
pub use settings::Settings;
pub use tiles::{TiledOutput, Tiles};
pub use tune::TuneSizes;

use crate::gpu::Device;
use crate::gpu::MemReport;
use crate::model::florence2::Florence2;
use crate::model::generate::GenerateOptions;
use crate::processor::custom_tasks::CustomTasks;
use crate::processor::image::{ImageLimits, ImageProcessorConfig};
use crate::processor::tokenizer::Florence2Tokenizer;
use crate::weights::{DTypePlan, WeightDType};

/// A loaded model and everything needed to run tasks on it.
pub struct Pipeline {
    model: Florence2,
    tokenizer: Florence2Tokenizer,
    processor: ImageProcessorConfig,
    limits: ImageLimits,
    /// Generation defaults (`max_new_tokens` = [`DEFAULT_MAX_NEW_TOKENS`]).
    generation: GenerateOptions,
    /// The model's own task markers, besides the 15 built-in ones.
    tasks: CustomTasks,
    /// Tells this pipeline's [`EncodedImage`]s from another's.
    id: u64,
    /// The resident format of the matrix weights, per part.
    dtype: DTypePlan,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Pipeline {
    /// A pipeline over an assembled model and its settings.
    pub fn new(model: Florence2, settings: Settings) -> Self {
        Pipeline {
            model,
            tokenizer: settings.tokenizer,
            processor: settings.processor,
            limits: settings.limits,
            generation: settings.generation,
            tasks: settings.tasks,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            dtype: DTypePlan::uniform(WeightDType::Fp32),
        }
        .with_weight_dtype_of_model()
    }

    /// Record the resident dtype the weights were loaded with (the loaders do; [`Pipeline::new`] infers
    /// it from the token embedding's format).
    pub fn with_weight_dtype(mut self, dtype: impl Into<DTypePlan>) -> Self {
        self.dtype = dtype.into();
        self
    }

    fn with_weight_dtype_of_model(self) -> Self {
        let d = WeightDType::of_matrix_dtype(self.model.shared.dtype());
        self.with_weight_dtype(d)
    }

    /// The resident format of the matrix weights, per part (uniform unless loaded with a mix).
    pub fn weight_dtype(&self) -> DTypePlan {
        self.dtype
    }

    /// GPU bytes held by tensors on this pipeline's device: weights, activations, and the peak since
    /// the device opened or the last [`Device::reset_peak_memory`].
    pub fn memory(&self) -> MemReport {
        self.gpu().memory()
    }

    pub fn model(&self) -> &Florence2 {
        &self.model
    }

    pub fn gpu(&self) -> &std::sync::Arc<Device> {
        self.model.gpu()
    }

    pub fn tokenizer(&self) -> &Florence2Tokenizer {
        &self.tokenizer
    }

    pub fn processor(&self) -> &ImageProcessorConfig {
        &self.processor
    }

    pub fn limits(&self) -> &ImageLimits {
        &self.limits
    }

    /// The model's own task markers (fine-tunes).
    pub fn tasks(&self) -> &CustomTasks {
        &self.tasks
    }

    /// Generation defaults that [`TaskOptions`] override.
    pub fn generation(&self) -> &GenerateOptions {
        &self.generation
    }
}

#[cfg(not(target_arch = "wasm32"))]
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Pipeline>();
    send_sync::<EncodedImage>();
    send_sync::<CancelToken>();
};
