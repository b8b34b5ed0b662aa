//! BART encoder: x = LN_emb(inputs_embeds + pos[2..2+S]); then per layer
//! x = LN1(x + out_proj(attn(q(x), k(x), v(x)))); x = LN2(x + fc2(gelu(fc1(x)))).

use crate::config::TextConfig;
use crate::error::{Error, Result};
use crate::gpu::{DType, Recorder, Tensor};
use crate::model::bart::{ffn_act, layers, position_embeddings, Attention, Ffn, POS_OFFSET};
use crate::model::layers::{Embedding, LayerNorm};
use crate::ops;
use crate::ops::attention::AttnOpts;
use crate::ops::matmul::Act;
use crate::weights::WeightsView;

#[derive(Clone, Debug)]
struct EncoderLayer {
    self_attn: Attention,
    self_attn_layer_norm: LayerNorm,
    ffn: Ffn,
}

/// The BART encoder over precomputed `inputs_embeds` (image features ++ embedded prompt).
#[derive(Clone, Debug)]
pub struct Encoder {
    d: usize,
    heads: usize,
    ffn: usize,
    act: Act,
    /// (max_position_embeddings + 2, D)
    embed_positions: Embedding,
    layernorm_embedding: LayerNorm,
    layers: Vec<EncoderLayer>,
}

impl Encoder {
    /// `w` is the encoder's view (`model.language_model.encoder`).
    pub fn new(cfg: &TextConfig, w: WeightsView) -> Result<Self> {
        let d = cfg.d_model;
        let f = cfg.encoder_ffn_dim;
        let layers = layers(&w, cfg.encoder_layers, |l| {
            Ok(EncoderLayer {
                self_attn: Attention::new(&l.pp("self_attn"), d)?,
                self_attn_layer_norm: LayerNorm::new(&l.pp("self_attn_layer_norm"), d)?,
                ffn: Ffn::new(l, d, f)?,
            })
        })?;
        if cfg.encoder_attention_heads == 0 || !d.is_multiple_of(cfg.encoder_attention_heads) {
            return Err(Error::Config(format!(
                "d_model {d} is not divisible by {} encoder heads",
                cfg.encoder_attention_heads
            )));
        }
        let (embed_positions, layernorm_embedding) = position_embeddings(&w, cfg)?;
        Ok(Encoder {
            d,
            heads: cfg.encoder_attention_heads,
            ffn: f,
            act: ffn_act(&cfg.activation_function)?,
            embed_positions,
            layernorm_embedding,
            layers,
        })
    }

    /// Longest sequence the position table allows.
    pub fn max_len(&self) -> usize {
        self.embed_positions.num_embeddings() - POS_OFFSET
    }

    /// Record the encoder over `inputs_embeds` (1, S, D); returns the hidden states (1, S, D).
    pub fn forward(&self, rec: &mut Recorder, inputs_embeds: &Tensor) -> Result<Tensor> {
        self.forward_batch(rec, std::slice::from_ref(inputs_embeds))
    }

    /// Record the encoder over several requests' `inputs_embeds`, each (1, S, D) with the same S, as
    /// one batch; returns their hidden states (B, S, D), request b's at rows b*S..(b+1)*S. Kernels are
    /// chosen for one request's share of each call ([`Recorder::set_images`], restored after), so each
    /// request gets the bits it gets alone.
    pub fn forward_batch(&self, rec: &mut Recorder, inputs_embeds: &[Tensor]) -> Result<Tensor> {
        const OP: &str = "bart encoder";
        let d = self.d;
        let s = inputs_embeds.first().map_or(0, |e| e.dim(1));
        for e in inputs_embeds {
            if e.rank() != 3 || e.dim(0) != 1 || e.dim(1) != s || e.dim(2) != d {
                return Err(Error::shape(
                    OP,
                    format!("inputs_embeds {:?} must be (1, {s}, {d})", e.shape()),
                ));
            }
        }
        if s == 0 || s > self.max_len() {
            return Err(Error::shape(
                OP,
                format!(
                    "sequence of {s} tokens: must be 1..={} (max_position_embeddings)",
                    self.max_len()
                ),
            ));
        }
        let images = rec.images();
        rec.set_images(inputs_embeds.len());
        let out = self.record_layers(rec, inputs_embeds, s);
        rec.set_images(images);
        out
    }

    fn record_layers(
        &self,
        rec: &mut Recorder,
        inputs_embeds: &[Tensor],
        s: usize,
    ) -> Result<Tensor> {
        let (b, d) = (inputs_embeds.len(), self.d);
        let gpu = rec.gpu().clone();
        let buf = |shape: &[usize], label: &str| Tensor::zeros(&gpu, shape, DType::F32, label);
        let n = b * s;
        let x = buf(&[n, d], "enc.x")?;
        let q = buf(&[n, d], "enc.q")?;
        let k = buf(&[n, d], "enc.k")?;
        let v = buf(&[n, d], "enc.v")?;
        let a = buf(&[n, d], "enc.attn")?;
        let t = buf(&[n, d], "enc.tmp")?;
        let f = buf(&[n, self.ffn], "enc.ffn")?;
        let q3 = q.reshape(&[b, s, d])?;
        let k3 = k.reshape(&[b, s, d])?;
        let v3 = v.reshape(&[b, s, d])?;
        let a3 = a.reshape(&[b, s, d])?;
        let opts = AttnOpts {
            heads: self.heads,
            scale: ((d / self.heads) as f32).powf(-0.5),
            ..Default::default()
        };

        if let [one] = inputs_embeds {
            let emb = one.reshape(&[s, d])?;
            self.embed_positions
                .add_rows(rec, &emb, POS_OFFSET as u32, &x)?; // (S, D)
        } else {
            // Each request's positions restart at 0: added per request in `t`, then moved into its rows.
            let rows = (s * d * 4) as u64;
            let ts = t.view(&[s, d], DType::F32)?;
            for (i, e) in inputs_embeds.iter().enumerate() {
                self.embed_positions
                    .add_rows(rec, &e.reshape(&[s, d])?, POS_OFFSET as u32, &ts)?; // (S, D)
                rec.copy_range(&t, 0, &x, i as u64 * rows, rows)?;
            }
        }
        self.layernorm_embedding.forward(rec, &x, &x)?; // (B*S, D)
        for l in &self.layers {
            let at = &l.self_attn;
            at.q_proj.forward(rec, &x, Act::None, &q)?; // (B*S, D)
            at.k_proj.forward(rec, &x, Act::None, &k)?; // (B*S, D)
            at.v_proj.forward(rec, &x, Act::None, &v)?; // (B*S, D)
            ops::attention::attention(rec, &q3, &k3, &v3, &opts, &a3)?; // (B, S, D)
            at.out_proj.forward_residual(rec, &a, Act::None, &x, &t)?; // (B*S, D) = x + out_proj(a)
            l.self_attn_layer_norm.forward(rec, &t, &x)?; // (B*S, D)
            l.ffn.fc1.forward(rec, &x, self.act, &f)?; // (B*S, F)
            l.ffn.fc2.forward_residual(rec, &f, Act::None, &x, &t)?; // (B*S, D) = x + fc2(f)
            l.ffn.final_layer_norm.forward(rec, &t, &x)?; // (B*S, D)
        }
        x.reshape(&[b, s, d])
    }
}
