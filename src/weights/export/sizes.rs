//! The size of a converted checkpoint per target dtype, from a config's shapes alone (an HF-native f32
//! source: every tensor the model needs, no tied LM head, no `final_logits_bias`), by the converter's
//! own per-tensor rule ([`super::encode::out_tensor`]).

use crate::config::tensors::expected_tensors;
use crate::config::Florence2Config;
use crate::error::Result;
use crate::weights::dtype_plan::DTypePlan;
use crate::weights::export::encode::out_tensor;
use crate::weights::header::{StDtype, TensorInfo};
use crate::weights::plan::{Fixup, TensorPlan};

/// Bytes of tensor data `florence2 convert --dtype D` writes for a model of this config.
pub fn converted_bytes(cfg: &Florence2Config, dtype: impl Into<DTypePlan>) -> Result<u64> {
    let dtype: DTypePlan = dtype.into();
    let mut total = 0;
    for (name, shape) in expected_tensors(cfg) {
        let numel: u64 = shape.iter().map(|&d| d as u64).product();
        let plan = TensorPlan {
            canonical: name.clone(),
            src: TensorInfo {
                name,
                dtype: StDtype::F32,
                shape: shape.clone(),
                start: 0,
                end: numel * 4,
            },
            shape,
            fixup: Fixup::None,
            quant: None,
        };
        total += out_tensor(&plan, dtype.for_tensor(&plan.canonical))?.byte_len();
    }
    Ok(total)
}
