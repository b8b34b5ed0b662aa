//! What a model's files say about its checkpoint without reading a weight: which files the loader
//! would fetch and their sizes, and the tensors the weights files hold (from the safetensors headers,
//! read by ranged reads, planned by the loader's own [`Planner`]). PyTorch checkpoints (`.bin`) have no
//! header to read cheaply: their tensors are taken as the config's, in the canonical layout.

use crate::config::Florence2Config;
use crate::error::{Error, Result};
use crate::estimate::resident::{canonical_plan, canonical_plans};
use crate::weights::expected::{IMAGE_PROJECTION, LM_HEAD};
use crate::weights::header::StDtype;
use crate::weights::load::{
    read_header, CheckpointIndex, CONFIG_FILE, INDEX_FILE, MAX_JSON_BYTES, SINGLE_FILE, TORCH_FILE,
    TORCH_INDEX_FILE,
};
use crate::weights::names::{canonical_name, detect_layout, Layout, FINAL_LOGITS_BIAS};
use crate::weights::plan::{Fixup, Planner, TensorPlan};
use crate::weights::source::{ByteSource, ModelFiles};

/// The small files the loader reads besides `config.json` (absent ones are skipped).
pub const SMALL_FILES: [&str; 4] = [
    "tokenizer.json",
    "preprocessor_config.json",
    "generation_config.json",
    "processor_config.json",
];

/// A checkpoint as its files describe it.
#[derive(Clone, Debug)]
pub struct CheckpointFacts {
    /// Every file a load fetches (name, bytes), in the loader's order.
    pub files: Vec<(String, u64)>,
    /// The tensors the model uses, as the loader plans them.
    pub plans: Vec<TensorPlan>,
    /// The plans come from the files' headers (false: a PyTorch checkpoint, taken as the config's
    /// tensors in the canonical layout).
    pub from_headers: bool,
    /// How the weights files store the matrices: "f32", "f16", "bf16", "q8", "q4" (the format of the
    /// most bytes among the planned tensors), or "unknown" without headers.
    pub stored: String,
}

impl CheckpointFacts {
    /// Bytes of every file a load fetches.
    pub fn download_bytes(&self) -> u64 {
        self.files.iter().map(|(_, n)| n).sum()
    }
}

async fn size_of<F: ModelFiles>(files: &F, name: &str) -> Result<Option<u64>> {
    match files.open(name).await? {
        Some(mut src) => Ok(Some(src.len().await?)),
        None => Ok(None),
    }
}

/// The weights files a load fetches, as the loader finds them.
struct WeightsFiles<S> {
    /// The files, in the loader's order.
    names: Vec<String>,
    /// The tensor names of the index, if there is one.
    index_names: Vec<String>,
    /// The single weights file, opened once (its size asked once).
    single: Option<S>,
}

/// Read the sizes of a model's files and the headers of its weights files (`cfg` is its config.json).
pub async fn read_checkpoint<F: ModelFiles>(
    files: &F,
    cfg: &Florence2Config,
) -> Result<CheckpointFacts> {
    let mut listed = Vec::new();
    for name in std::iter::once(CONFIG_FILE).chain(SMALL_FILES) {
        if let Some(n) = size_of(files, name).await? {
            listed.push((name.to_owned(), n));
        }
    }
    let mut planner = Planner::new(cfg);
    let mut weights = find_weights(files, &mut planner, &mut listed).await?;
    let mut plans = Vec::new();
    let mut stored: Vec<(String, u64)> = Vec::new();
    let mut from_headers = true;
    for name in &weights.names {
        let opened = match weights.single.take() {
            Some(src) => Some(src),
            None => files.open(name).await?,
        };
        let Some(mut src) = opened else {
            return Err(Error::CheckpointIndex {
                file: name.clone(),
                msg: format!("shard '{name}' does not exist"),
            });
        };
        let len = src.len().await?;
        listed.push((name.clone(), len));
        if crate::weights::torch_load::is_torch_file(name) {
            from_headers = false;
            continue;
        }
        let (header, _) = read_header(&mut src).await?;
        for plan in planner.plan_header(name, &header)?.into_iter().flatten() {
            count_stored(&mut stored, &plan);
            plans.push(plan);
        }
    }
    if !from_headers {
        plans = torch_plans(cfg, planner.layout(), &weights.index_names);
    }
    let stored = match from_headers {
        true => stored
            .into_iter()
            .max_by_key(|(_, n)| *n)
            .map_or_else(|| "unknown".to_owned(), |(k, _)| k),
        false => "unknown".to_owned(),
    };
    Ok(CheckpointFacts {
        files: listed,
        plans,
        from_headers,
        stored,
    })
}

/// Find the weights files in the loader's order: a safetensors index, the single file, a PyTorch
/// index, the single .bin. An index found is appended to `listed` and sets `planner`'s layout.
async fn find_weights<F: ModelFiles>(
    files: &F,
    planner: &mut Planner,
    listed: &mut Vec<(String, u64)>,
) -> Result<WeightsFiles<F::Source>> {
    for index in [INDEX_FILE, TORCH_INDEX_FILE] {
        let single = if index == INDEX_FILE {
            SINGLE_FILE
        } else {
            TORCH_FILE
        };
        if let Some(bytes) = files.read_small(index, MAX_JSON_BYTES).await? {
            let idx = CheckpointIndex::parse_file(&bytes, index)?;
            planner.set_layout(detect_layout(idx.weight_map.keys().map(String::as_str)));
            let index_names = idx.weight_map.keys().cloned().collect();
            listed.push((index.to_owned(), bytes.len() as u64));
            if idx.shards.is_empty() {
                break;
            }
            return Ok(WeightsFiles {
                names: idx.shards,
                index_names,
                single: None,
            });
        }
        if let Some(src) = files.open(single).await? {
            return Ok(WeightsFiles {
                names: vec![single.to_owned()],
                index_names: Vec::new(),
                single: Some(src),
            });
        }
    }
    Err(Error::FileRead {
        file: SINGLE_FILE.into(),
        msg: format!(
            "none of {SINGLE_FILE}, {INDEX_FILE}, {TORCH_FILE}, {TORCH_INDEX_FILE} exists"
        ),
    })
}

/// Add `plan`'s stored bytes to its storage format's count in `stored`.
fn count_stored(stored: &mut Vec<(String, u64)>, plan: &TensorPlan) {
    let kind = match plan.quant {
        Some(q) => q.name().to_owned(),
        None => stored_name(plan.src.dtype),
    };
    match stored.iter_mut().find(|(k, _)| *k == kind) {
        Some((_, n)) => *n += plan.src.byte_len(),
        None => stored.push((kind, plan.src.byte_len())),
    }
}

/// The tensors of a PyTorch checkpoint, whose pickle is not read here: the config's, in the canonical
/// layout when an index's names say HF-native; otherwise (original names, or no index to tell) with what
/// the original layout adds, as an upper bound: the transposed `image_projection` (permuted, so kept
/// f32), a `final_logits_bias` (kept when non-zero) and the LM head stored apart from the shared
/// embedding (as Microsoft's checkpoints store it). With an index, the LM head counts when it names one.
fn torch_plans(cfg: &Florence2Config, layout: Option<Layout>, names: &[String]) -> Vec<TensorPlan> {
    let mut plans = canonical_plans(cfg);
    let (v, d) = (cfg.text.vocab_size, cfg.text.d_model);
    let lm_head = match layout {
        Some(l) => names
            .iter()
            .any(|n| canonical_name(l, n).as_deref() == Some(LM_HEAD)),
        None => true,
    };
    let mut extra = Vec::new();
    if lm_head {
        extra.push((LM_HEAD, vec![v, d]));
    }
    if layout != Some(Layout::HfNative) {
        extra.push((FINAL_LOGITS_BIAS, vec![1, v]));
        for p in &mut plans {
            if p.canonical == IMAGE_PROJECTION {
                p.fixup = Fixup::Permute(vec![1, 0]);
                p.src.shape.reverse();
            }
        }
    }
    for (name, shape) in extra {
        plans.push(canonical_plan(name, shape));
    }
    plans
}

fn stored_name(d: StDtype) -> String {
    d.as_str().to_ascii_lowercase()
}
