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

use crate::config::TextConfig;
use crate::error::{Error, Result};
use crate::model::layers::{Embedding, LayerNorm, Linear};
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

/// A BART layer's feed-forward half (checkpoint names `fc1`, `fc2`, `final_layer_norm` beside the
/// attention): x = final_layer_norm(x + fc2(act(fc1(x)))), D -> F -> D.
#[derive(Clone, Debug)]
pub(crate) struct Ffn {
    pub fc1: Linear,
    pub fc2: Linear,
    pub final_layer_norm: LayerNorm,
}

impl Ffn {
    /// `l` is the layer's view (`....layers.{i}`), D = `d`, F = `f`.
    pub fn new(l: &WeightsView, d: usize, f: usize) -> Result<Self> {
        Ok(Ffn {
            fc1: Linear::new(&l.pp("fc1"), d, f, true)?,
            fc2: Linear::new(&l.pp("fc2"), f, d, true)?,
            final_layer_norm: LayerNorm::new(&l.pp("final_layer_norm"), d)?,
        })
    }
}

/// BART's learned-position offset: position p uses table row p + 2.
pub(crate) const POS_OFFSET: usize = 2;

/// A BART stack's learned positions (`embed_positions`, offset by [`POS_OFFSET`]) and the layer norm
/// after the embeddings (`layernorm_embedding`), both under `w`.
pub(crate) fn position_embeddings(
    w: &WeightsView,
    cfg: &TextConfig,
) -> Result<(Embedding, LayerNorm)> {
    let d = cfg.d_model;
    let rows = cfg.max_position_embeddings + POS_OFFSET;
    Ok((
        Embedding::new(&w.pp("embed_positions"), rows, d)?,
        LayerNorm::new(&w.pp("layernorm_embedding"), d)?,
    ))
}

/// The `n` layers under `w.layers.{i}`, each built by `layer` from its view.
pub(crate) fn layers<T>(
    w: &WeightsView,
    n: usize,
    layer: impl Fn(&WeightsView) -> Result<T>,
) -> Result<Vec<T>> {
    (0..n)
        .map(|i| layer(&w.pp("layers").pp(&i.to_string())))
        .collect()
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
