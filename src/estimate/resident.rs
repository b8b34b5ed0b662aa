//! Resident weight bytes from the tensors a checkpoint holds, sized by the loader's own rules: each
//! planned tensor in [`WeightDType::resident_layout`] (what [`crate::weights::Assembler`] allocates),
//! the dense convolutions as [`crate::ops::conv::padded_conv2d_weight`] prepares them, the temporal
//! table synthesized when absent and the LM head aliased to the shared embedding when absent, each
//! buffer as [`DType::buffer_bytes`] counts it.

use std::collections::BTreeSet;

use crate::config::tensors::expected_tensors;
use crate::config::Florence2Config;
use crate::error::Result;
use crate::gpu::DType;
use crate::ops::conv::padded_conv2d_weight;
use crate::weights::expected::{is_dense_conv_weight, TEMPORAL_TABLE};
use crate::weights::header::{StDtype, TensorInfo};
use crate::weights::plan::{Fixup, TensorPlan};
use crate::weights::{part_of, DTypePlan, Part};

/// Total and largest buffer of the resident weights, and the bytes of each part.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WeightBytes {
    pub total: u64,
    pub largest: u64,
    pub parts: PartBytes,
}

/// Resident weight bytes per part of the model ([`Part`]); they add up to the total.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PartBytes {
    pub vision: u64,
    pub projector: u64,
    pub encoder: u64,
    pub decoder: u64,
    pub embed: u64,
}

impl PartBytes {
    fn add(&mut self, part: Part, bytes: u64) {
        *match part {
            Part::Vision => &mut self.vision,
            Part::Projector => &mut self.projector,
            Part::Encoder => &mut self.encoder,
            Part::Decoder => &mut self.decoder,
            Part::Embed => &mut self.embed,
        } += bytes;
    }

    pub fn sum(&self) -> u64 {
        self.vision + self.projector + self.encoder + self.decoder + self.embed
    }
}

/// The plan of an f32 tensor `name` stored in the canonical layout.
pub fn canonical_plan(name: &str, shape: Vec<usize>) -> TensorPlan {
    let bytes = 4 * shape.iter().product::<usize>() as u64;
    TensorPlan {
        canonical: name.to_owned(),
        src: TensorInfo {
            name: name.to_owned(),
            dtype: StDtype::F32,
            shape: shape.clone(),
            start: 0,
            end: bytes,
        },
        shape,
        fixup: Fixup::None,
        quant: None,
    }
}

/// The plans of a checkpoint in the canonical (HF-native) layout holding every expected tensor and
/// nothing else (tied LM head, no `final_logits_bias`): what a config alone implies.
pub fn canonical_plans(cfg: &Florence2Config) -> Vec<TensorPlan> {
    expected_tensors(cfg)
        .into_iter()
        .map(|(name, shape)| canonical_plan(&name, shape))
        .collect()
}

/// GPU bytes of the weights once a model of `cfg` is built from the tensors `plans` describe, loaded in
/// `dtype` (each tensor in its part's format; `host`: on the CPU backend, where no convolution weight
/// is padded).
pub fn weight_bytes(
    cfg: &Florence2Config,
    plans: &[TensorPlan],
    dtype: DTypePlan,
    host: bool,
) -> Result<WeightBytes> {
    let mut out = WeightBytes::default();
    let mut seen = BTreeSet::new();
    for plan in plans {
        if !seen.insert(plan.canonical.as_str()) {
            continue;
        }
        let (shape, dt) = dtype.for_tensor(&plan.canonical).resident_layout(plan);
        let prepared = match is_dense_conv_weight(&plan.canonical, shape) {
            true => padded_conv2d_weight(shape, dt, host),
            false => None,
        };
        let bytes = match prepared {
            Some((padded, pd)) => pd.buffer_bytes(&padded)?,
            None => dt.buffer_bytes(shape)?,
        };
        out.total += bytes;
        out.largest = out.largest.max(bytes);
        out.parts
            .add(part_of(&plan.canonical).unwrap_or(Part::Embed), bytes);
    }
    if !seen.contains(TEMPORAL_TABLE) {
        let v = &cfg.vision;
        let c_last = v.embed_dim.last().copied().unwrap_or(0);
        let bytes = DType::F32.buffer_bytes(&[v.max_temporal_embeddings, c_last])?;
        out.total += bytes;
        out.largest = out.largest.max(bytes);
        out.parts.add(Part::Projector, bytes);
    }
    Ok(out)
}
