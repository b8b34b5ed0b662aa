//! How much a model needs in each weight format, before anything is downloaded: the resident weight
//! bytes, a request's peak GPU bytes, the largest single buffer and the download, from `config.json`,
//! `generation_config.json`, `preprocessor_config.json` and the sizes (and safetensors headers) of the
//! files; and the choice of the best-quality format that fits a device ([`choose`]).
//!
//! Every figure comes from the engine's own sizing rules, so the estimate follows what is allocated:
//! the loader's per-tensor plans and resident layouts ([`resident`]), the vision tower's arena plan and
//! the decoder state's buffers ([`phases`]), each buffer padded as [`crate::gpu::DType::buffer_bytes`]
//! pads it.
//!
//! - [`checkpoint`]: the files a load fetches and the tensors their headers list.
//! - [`resident`]: resident weight bytes per format.
//! - [`phases`]: a request's activation bytes per phase.
//! - [`choose`]: device classes, their budgets, and the `auto` weight format.
//! - [`auto`]: `dtype: "auto"` at load (the device's limits, the model's files, the choice).

pub mod auto;
pub mod checkpoint;
pub mod choose;
pub mod phases;
pub mod report;
pub mod resident;

use crate::config::Florence2Config;
use crate::error::Result;
use crate::gpu::DType;
use crate::model::bart::default_kv_dtype;
use crate::model::davit_plan::TowerShape;
use crate::model::generate::GenerateOptions;
use crate::model::generate::DEFAULT_MAX_NEW_TOKENS;
use crate::processor::image::ImageProcessorConfig;
use crate::weights::load::{load_config, MAX_JSON_BYTES};
use crate::weights::plan::TensorPlan;
use crate::weights::source::ModelFiles;
use crate::weights::{DTypePlan, WeightDType};
pub use auto::{device_limits, resolve_dtype, resolve_dtype_for, DTypeRequest};
pub use checkpoint::CheckpointFacts;
pub use choose::{choose_dtype, fits, Choice, DeviceClass, DeviceLimits};
use phases::{phase_bytes, Request};
pub use report::{DeviceReport, EstimateReport};
pub use resident::PartBytes;

/// The WebGPU default `maxStorageBufferBindingSize` (128 MiB), which the estimate assumes unless told
/// the device's: it sets how the vision tower chunks its MLP and im2col.
pub const DEFAULT_MAX_BINDING: u64 = 128 << 20;

/// Prompt tokens the estimate allows for: every built-in task prompt is shorter (`<s>`, the task's
/// sentence, `</s>`), and a free-text input of a few words fits too.
pub const DEFAULT_PROMPT_TOKENS: usize = 32;

/// What a request looks like to the estimate.
#[derive(Clone, Copy, Debug)]
pub struct EstimateOptions {
    /// New tokens (default [`DEFAULT_MAX_NEW_TOKENS`]; the caches are capped by the position table).
    pub max_new_tokens: Option<usize>,
    /// Beams (default: the model's generation config).
    pub num_beams: Option<usize>,
    pub prompt_tokens: usize,
    /// The device's storage-binding limit.
    pub max_binding: u64,
    /// The CPU backend (no convolution weight padded, `host` memory instead of GPU buffers).
    pub host: bool,
}

impl Default for EstimateOptions {
    fn default() -> Self {
        EstimateOptions {
            max_new_tokens: None,
            num_beams: None,
            prompt_tokens: DEFAULT_PROMPT_TOKENS,
            max_binding: DEFAULT_MAX_BINDING,
            host: false,
        }
    }
}

/// A model as its small files and file sizes describe it.
#[derive(Clone, Debug)]
pub struct ModelFacts {
    pub config: Florence2Config,
    /// The generation settings a request starts from (config.json, then generation_config.json).
    pub generation: GenerateOptions,
    /// The processor's (height, width).
    pub image: (usize, usize),
    pub checkpoint: CheckpointFacts,
}

/// The estimate for one weight format (or one per part).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Estimate {
    pub dtype: DTypePlan,
    /// Bytes of the files a load fetches (the checkpoint as stored, whatever `dtype` is).
    pub download_bytes: u64,
    /// Resident weight bytes once loaded.
    pub weights_bytes: u64,
    /// `weights_bytes` per part of the model.
    pub part_bytes: PartBytes,
    /// Weights plus the largest phase of one request.
    pub peak_bytes: u64,
    /// The largest single buffer (weight or activation).
    pub largest_buffer_bytes: u64,
    /// Activation bytes of the vision, encoder and decode phases.
    pub vision_bytes: u64,
    pub encoder_bytes: u64,
    pub decode_bytes: u64,
    /// How the checkpoint stores its matrices ("f32", "f16", "bf16", "q8", "q4", "unknown").
    pub stored: String,
    /// Whether `weights_bytes` is exact: the tensors come from the safetensors headers and any
    /// `final_logits_bias` (kept only when non-zero, which only its values tell) is absent.
    pub exact: bool,
    /// What the download is (e.g. an f32 checkpoint converted to q4 while it streams).
    pub note: String,
}

impl ModelFacts {
    /// Read a model's facts: config.json, generation_config.json and preprocessor_config.json whole,
    /// the sizes of every file a load fetches and the headers of its safetensors files.
    pub async fn read<F: ModelFiles>(files: &F) -> Result<ModelFacts> {
        let config = load_config(files).await?;
        let gen = files
            .read_small("generation_config.json", MAX_JSON_BYTES)
            .await?;
        let pre = files
            .read_small("preprocessor_config.json", MAX_JSON_BYTES)
            .await?;
        let checkpoint = checkpoint::read_checkpoint(files, &config).await?;
        Self::new(config, pre.as_deref(), gen.as_deref(), checkpoint)
    }

    /// Facts from the files' contents (`preprocessor` and `generation` when present).
    pub fn new(
        config: Florence2Config,
        preprocessor: Option<&[u8]>,
        generation: Option<&[u8]>,
        checkpoint: CheckpointFacts,
    ) -> Result<ModelFacts> {
        let pre = match preprocessor {
            Some(b) => ImageProcessorConfig::from_json_bytes(b)?,
            None => ImageProcessorConfig::default(),
        };
        let mut gen = GenerateOptions::from_config(&config, DEFAULT_MAX_NEW_TOKENS);
        if let Some(b) = generation {
            gen = gen.with_generation_config(b)?;
        }
        Ok(ModelFacts {
            config,
            generation: gen,
            image: (pre.height, pre.width),
            checkpoint,
        })
    }

    /// Facts from a config alone: the processor's default image size, the config's generation
    /// settings and a checkpoint in the canonical layout (no files, no download).
    pub fn from_config(config: Florence2Config) -> Result<ModelFacts> {
        let plans = resident::canonical_plans(&config);
        Self::new(
            config,
            None,
            None,
            CheckpointFacts {
                files: Vec::new(),
                plans,
                from_headers: true,
                stored: "unknown".into(),
            },
        )
    }

    /// The estimate for `dtype` (one format, or a [`DTypePlan`]).
    pub fn estimate(
        &self,
        dtype: impl Into<DTypePlan>,
        opts: &EstimateOptions,
    ) -> Result<Estimate> {
        let dtype: DTypePlan = dtype.into();
        let cfg = &self.config;
        let plans = &self.checkpoint.plans;
        let weights = resident::weight_bytes(cfg, plans, dtype, opts.host)?;
        let resident = |name: &str, shape: &[usize]| resident_dtype(plans, dtype, name, shape);
        let tower = tower_shape(cfg, &resident, opts.host)?;
        let req = self.request(opts, &resident);
        let phases = phase_bytes(cfg, &tower, &req)?;
        let has_bias = plans
            .iter()
            .any(|p| p.canonical == crate::weights::FINAL_LOGITS_BIAS);
        let download = self.checkpoint.download_bytes();
        Ok(Estimate {
            dtype,
            download_bytes: download,
            weights_bytes: weights.total,
            part_bytes: weights.parts,
            peak_bytes: weights.total + phases.peak(),
            largest_buffer_bytes: weights.largest.max(phases.largest),
            vision_bytes: phases.vision,
            encoder_bytes: phases.encoder,
            decode_bytes: phases.decode,
            stored: self.checkpoint.stored.clone(),
            exact: self.checkpoint.from_headers && !has_bias,
            note: download_note(&self.checkpoint.stored, dtype, download),
        })
    }

    /// The request `opts` describe on this model; `resident` gives a tensor's resident element type.
    fn request(
        &self,
        opts: &EstimateOptions,
        resident: &impl Fn(&str, &[usize]) -> DType,
    ) -> Request {
        let t = &self.config.text;
        let lm_head = resident(
            crate::weights::expected::LM_HEAD,
            &[t.vocab_size, t.d_model],
        );
        let mut gen = self.generation.clone();
        if let Some(n) = opts.max_new_tokens {
            gen.max_new_tokens = n;
        }
        let beams = opts.num_beams.unwrap_or(gen.num_beams).max(1);
        Request {
            image: self.image,
            prompt_tokens: opts.prompt_tokens,
            beams,
            cache_len: gen
                .max_length(t.max_position_embeddings)
                .saturating_sub(1)
                .max(1),
            kv_dtype: default_kv_dtype(lm_head, t.d_model),
            max_binding: opts.max_binding,
            host: opts.host,
        }
    }

    /// Estimates for every uniform format (fp32 first), then for the mixes `auto` considers
    /// ([`choose::AUTO_MIXES`]).
    pub fn estimate_all(&self, opts: &EstimateOptions) -> Result<Vec<Estimate>> {
        WeightDType::ALL
            .iter()
            .map(|&d| DTypePlan::uniform(d))
            .chain(choose::AUTO_MIXES)
            .map(|d| self.estimate(d, opts))
            .collect()
    }

    /// [`ModelFacts::estimate_all`], plus `extra` when it is not among them (a mix asked for).
    pub fn estimate_with(
        &self,
        extra: Option<DTypePlan>,
        opts: &EstimateOptions,
    ) -> Result<Vec<Estimate>> {
        let mut all = self.estimate_all(opts)?;
        if let Some(d) = extra.filter(|d| all.iter().all(|e| e.dtype != *d)) {
            all.push(self.estimate(d, opts)?);
        }
        Ok(all)
    }
}

/// Bits per matrix weight of a stored or resident format (q8/q4 with their f16 block scales).
fn bits(format: &str) -> Option<f64> {
    match format {
        "f32" | "fp32" => Some(32.0),
        "f16" | "bf16" | "fp16" => Some(16.0),
        "q8" => Some(8.5),
        "q4" => Some(4.5),
        _ => None,
    }
}

/// What the download is, for `dtype` resident weights from a checkpoint stored as `stored`.
fn download_note(stored: &str, dtype: DTypePlan, bytes: u64) -> String {
    let mb = bytes as f64 / 1e6;
    let Some(dtype) = dtype.as_uniform() else {
        return match bits(stored) {
            Some(_) => format!(
                "downloads the {stored} checkpoint as stored ({mb:.1} MB) and converts each part to \
                 its format ({dtype}) while it streams"
            ),
            None => format!("downloads {mb:.1} MB"),
        };
    };
    match (bits(stored), bits(dtype.as_str())) {
        (Some(s), Some(d)) if s > d => format!(
            "downloads the {stored} checkpoint as stored ({mb:.1} MB) and converts it to {dtype} while \
             it streams; a checkpoint stored as {dtype} (`florence2 convert --dtype {dtype}`) downloads less"
        ),
        (Some(s), Some(d)) if s < d => format!(
            "downloads the {stored} checkpoint as stored ({mb:.1} MB) and widens it to {dtype} while it \
             streams"
        ),
        (Some(_), Some(_)) => format!("downloads the {stored} checkpoint ({mb:.1} MB), loaded as stored"),
        _ => format!("downloads {mb:.1} MB"),
    }
}

/// The resident element type of tensor `name` (shape `shape`) under `dtype`: as planned when the
/// checkpoint holds it, otherwise as the canonical tensor would be.
fn resident_dtype(plans: &[TensorPlan], dtype: DTypePlan, name: &str, shape: &[usize]) -> DType {
    plans
        .iter()
        .find(|p| p.canonical == name)
        .map(|p| dtype.for_tensor(name).resident_layout(p).1)
        .unwrap_or_else(|| dtype.for_tensor(name).resident_dtype(name, shape))
}

/// The DaViT tower's shape, its patch convs' and channel attention's element types from `resident`.
fn tower_shape(
    cfg: &Florence2Config,
    resident: &impl Fn(&str, &[usize]) -> DType,
    host: bool,
) -> Result<TowerShape> {
    let v = &cfg.vision;
    TowerShape::from_config(
        v,
        |s| {
            let cin = if s == 0 {
                v.in_channels
            } else {
                v.embed_dim[s - 1]
            };
            let (c, k) = (v.embed_dim[s], v.patch_size[s]);
            resident(
                &format!("model.vision_tower.convs.{s}.conv.weight"),
                &[c, cin, k, k],
            )
        },
        |s| {
            let c = v.embed_dim[s];
            resident(
                &format!("model.vision_tower.blocks.{s}.0.channel_block.channel_attn.qkv.weight"),
                &[3 * c, c],
            )
        },
        host,
    )
}

#[cfg(test)]
mod tests;
