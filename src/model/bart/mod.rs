//! BART encoder-decoder of Florence-2 (post-norm: x = LN(x + sublayer(x))), on the GPU ops.
//!
//! - [`Encoder`]: learned positions (row = position + 2), `layernorm_embedding`, bidirectional layers over
//!   `inputs_embeds` = [image features ++ embedded prompt].
//! - [`Decoder`]: one token per batch row (beam) per [`Decoder::step`], a self-attention KV cache
//!   preallocated once to the maximum length, cross-attention K/V projected once per image
//!   ([`CrossKv`], shared by every beam: the attention kernel broadcasts Bk = 1), tied LM head.

mod decoder;
mod encoder;

pub use decoder::{CrossKv, Decoder, DecoderState};
pub use encoder::Encoder;

use crate::error::{Error, Result};
use crate::gpu::{Recorder, Tensor};
use crate::ops;
use crate::ops::matmul::Act;
use crate::weights::WeightsView;

/// PyTorch's `nn.LayerNorm` default, used by every BART norm.
pub(crate) const LN_EPS: f32 = 1e-5;

/// A PyTorch `nn.Linear` (weight (out, in), bias (out)).
#[derive(Clone, Debug)]
pub(crate) struct Linear {
    pub w: Tensor,
    pub b: Option<Tensor>,
}

impl Linear {
    pub fn load(w: &WeightsView, name: &str, out_f: usize, in_f: usize) -> Result<Self> {
        let v = w.pp(name);
        Ok(Linear {
            w: v.get("weight", &[out_f, in_f])?,
            b: Some(v.get("bias", &[out_f])?),
        })
    }

    /// out (M, out) = act(x (M, in) W^T + b).
    pub fn forward(&self, rec: &mut Recorder, x: &Tensor, act: Act, out: &Tensor) -> Result<()> {
        ops::matmul::linear(rec, x, &self.w, self.b.as_ref(), act, out)
    }
}

/// A PyTorch `nn.LayerNorm` over the last dim.
#[derive(Clone, Debug)]
pub(crate) struct LayerNorm {
    pub g: Tensor,
    pub b: Tensor,
}

impl LayerNorm {
    pub fn load(w: &WeightsView, name: &str, d: usize) -> Result<Self> {
        let v = w.pp(name);
        Ok(LayerNorm {
            g: v.get("weight", &[d])?,
            b: v.get("bias", &[d])?,
        })
    }

    pub fn forward(&self, rec: &mut Recorder, x: &Tensor, out: &Tensor) -> Result<()> {
        ops::norm::layer_norm(rec, x, &self.g, &self.b, LN_EPS, out)
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
