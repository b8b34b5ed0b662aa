//! BART encoder: x = LN_emb(inputs_embeds + pos[2..2+S]); then per layer
//! x = LN1(x + out_proj(attn(q(x), k(x), v(x)))); x = LN2(x + fc2(gelu(fc1(x)))).

use crate::error::{Error, Result};
use crate::gpu::{DType, Recorder, Tensor};
use crate::model::bart::{ffn_act, LayerNorm, Linear};
use crate::model::config::TextConfig;
use crate::ops;
use crate::ops::attention::AttnOpts;
use crate::ops::matmul::Act;
use crate::weights::WeightsView;

/// BART's learned-position offset: position p uses table row p + 2.
pub(crate) const POS_OFFSET: usize = 2;

#[derive(Clone, Debug)]
struct EncoderLayer {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ln_attn: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    ln_ffn: LayerNorm,
}

/// The BART encoder over precomputed `inputs_embeds` (image features ++ embedded prompt).
#[derive(Clone, Debug)]
pub struct Encoder {
    d: usize,
    heads: usize,
    ffn: usize,
    act: Act,
    /// (max_position_embeddings + 2, D)
    positions: Tensor,
    ln_emb: LayerNorm,
    layers: Vec<EncoderLayer>,
}

impl Encoder {
    /// `w` is the encoder's view (`model.language_model.encoder`).
    pub fn new(cfg: &TextConfig, w: WeightsView) -> Result<Self> {
        let d = cfg.d_model;
        let f = cfg.encoder_ffn_dim;
        let layers = (0..cfg.encoder_layers)
            .map(|i| {
                let l = w.pp("layers").pp(&i.to_string());
                let a = l.pp("self_attn");
                Ok(EncoderLayer {
                    q: Linear::load(&a, "q_proj", d, d)?,
                    k: Linear::load(&a, "k_proj", d, d)?,
                    v: Linear::load(&a, "v_proj", d, d)?,
                    o: Linear::load(&a, "out_proj", d, d)?,
                    ln_attn: LayerNorm::load(&l, "self_attn_layer_norm", d)?,
                    fc1: Linear::load(&l, "fc1", f, d)?,
                    fc2: Linear::load(&l, "fc2", d, f)?,
                    ln_ffn: LayerNorm::load(&l, "final_layer_norm", d)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if cfg.encoder_attention_heads == 0 || !d.is_multiple_of(cfg.encoder_attention_heads) {
            return Err(Error::Config(format!(
                "d_model {d} is not divisible by {} encoder heads",
                cfg.encoder_attention_heads
            )));
        }
        Ok(Encoder {
            d,
            heads: cfg.encoder_attention_heads,
            ffn: f,
            act: ffn_act(&cfg.activation_function)?,
            positions: w.get(
                "embed_positions.weight",
                &[cfg.max_position_embeddings + POS_OFFSET, d],
            )?,
            ln_emb: LayerNorm::load(&w, "layernorm_embedding", d)?,
            layers,
        })
    }

    /// Longest sequence the position table allows.
    pub fn max_len(&self) -> usize {
        self.positions.dim(0) - POS_OFFSET
    }

    /// Record the encoder over `inputs_embeds` (1, S, D); returns the hidden states (1, S, D).
    pub fn forward(&self, rec: &mut Recorder, inputs_embeds: &Tensor) -> Result<Tensor> {
        const OP: &str = "bart encoder";
        let d = self.d;
        if inputs_embeds.rank() != 3 || inputs_embeds.dim(0) != 1 || inputs_embeds.dim(2) != d {
            return Err(Error::shape(
                OP,
                format!(
                    "inputs_embeds {:?} must be (1, S, {d})",
                    inputs_embeds.shape()
                ),
            ));
        }
        let s = inputs_embeds.dim(1);
        if s == 0 || s > self.max_len() {
            return Err(Error::shape(
                OP,
                format!(
                    "sequence of {s} tokens: must be 1..={} (max_position_embeddings)",
                    self.max_len()
                ),
            ));
        }
        let gpu = rec.gpu().clone();
        let buf = |shape: &[usize], label: &str| Tensor::zeros(&gpu, shape, DType::F32, label);
        let x = buf(&[s, d], "enc.x")?;
        let q = buf(&[s, d], "enc.q")?;
        let k = buf(&[s, d], "enc.k")?;
        let v = buf(&[s, d], "enc.v")?;
        let a = buf(&[s, d], "enc.attn")?;
        let t = buf(&[s, d], "enc.tmp")?;
        let f = buf(&[s, self.ffn], "enc.ffn")?;
        let q3 = q.reshape(&[1, s, d])?;
        let k3 = k.reshape(&[1, s, d])?;
        let v3 = v.reshape(&[1, s, d])?;
        let a3 = a.reshape(&[1, s, d])?;
        let opts = AttnOpts {
            heads: self.heads,
            scale: ((d / self.heads) as f32).powf(-0.5),
            ..Default::default()
        };

        let emb = inputs_embeds.reshape(&[s, d])?;
        ops::elementwise::add_rows_at(rec, &emb, &self.positions, POS_OFFSET as u32, &x)?; // (S, D)
        self.ln_emb.forward(rec, &x, &x)?; // (S, D)
        for l in &self.layers {
            l.q.forward(rec, &x, Act::None, &q)?; // (S, D)
            l.k.forward(rec, &x, Act::None, &k)?; // (S, D)
            l.v.forward(rec, &x, Act::None, &v)?; // (S, D)
            ops::attention::attention(rec, &q3, &k3, &v3, &opts, &a3)?; // (1, S, D)
            l.o.forward(rec, &a, Act::None, &t)?; // (S, D)
            ops::elementwise::add(rec, &x, &t, &t)?; // (S, D) residual
            l.ln_attn.forward(rec, &t, &x)?; // (S, D)
            l.fc1.forward(rec, &x, self.act, &f)?; // (S, F)
            l.fc2.forward(rec, &f, Act::None, &t)?; // (S, D)
            ops::elementwise::add(rec, &x, &t, &t)?; // (S, D) residual
            l.ln_ffn.forward(rec, &t, &x)?; // (S, D)
        }
        x.reshape(&[1, s, d])
    }
}
