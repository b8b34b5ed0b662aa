//! BART encoder-decoder of Florence-2 (post-norm: x = LN(x + sublayer(x))), on the GPU ops.
//!
//! - [`Encoder`]: learned positions (row = position + 2), `layernorm_embedding`, bidirectional layers over
//!   `inputs_embeds` = [image features ++ embedded prompt].
//! - [`Decoder`]: one token per batch row (beam) per [`Decoder::step_planned`], a self-attention KV cache
//!   preallocated once to the maximum length, cross-attention K/V projected once per image
//!   ([`CrossKv`], shared by every beam: the attention kernel broadcasts Bk = 1), tied LM head.

mod decoder;
mod encoder;

pub use decoder::{
    default_kv_dtype, BatchScratch, CrossKv, Decoder, DecoderState, REORDER_CHUNK_ROWS,
};
pub use encoder::Encoder;

use crate::error::{Error, Result};
use crate::model::layers::Linear;
use crate::ops::matmul::Act;
use crate::weights::WeightsView;

/// BART attention projections (`self_attn`, `encoder_attn`): four `nn.Linear(d, d)` with bias.
#[derive(Clone, Debug)]
pub(crate) struct Attention {
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub out_proj: Linear,
}

impl Attention {
    pub fn new(w: &WeightsView, d: usize) -> Result<Self> {
        Ok(Attention {
            q_proj: Linear::new(&w.pp("q_proj"), d, d, true)?,
            k_proj: Linear::new(&w.pp("k_proj"), d, d, true)?,
            v_proj: Linear::new(&w.pp("v_proj"), d, d, true)?,
            out_proj: Linear::new(&w.pp("out_proj"), d, d, true)?,
        })
    }
}

/// The FFN activation: BART's `activation_function`; only exact GELU is implemented.
pub(crate) fn ffn_act(name: &str) -> Result<Act> {
    match name {
        "gelu" => Ok(Act::Gelu),
        other => Err(Error::Config(format!(
            "text_config.activation_function '{other}' is not supported (only 'gelu')"
        ))),
    }
}
