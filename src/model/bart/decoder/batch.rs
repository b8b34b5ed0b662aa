//! One decoder step for several requests at once (continuous batching): the rows of every request's
//! [`DecoderState`] go through the shared-weight work (embedding, LayerNorms, every Linear and the LM
//! head) as one (R, ·) batch, and through the per-request work (position, cache write, self- and
//! cross-attention) in their own states.
//!
//! Bit-identity with [`Decoder::step_planned`]: the batch's Linears run per row
//! ([`crate::ops::matmul::LinearArgs::per_row`], as the single step's do), LayerNorm, embedding and the
//! scale are row by row, and the per-request kernels see the very inputs they see alone; rows move between
//! the batch and the states by buffer copies. So each request's logits equal, bit for bit, those of its
//! own step, whichever requests share the batch.

use std::sync::Arc;

use super::{Decoder, DecoderState, STEP_CACHE_ROW, STEP_POS_ROW};
use crate::error::{Error, Result};
use crate::gpu::{DType, Device, Recorder, Tensor};
use crate::ops;
use crate::ops::attention::AttnOpts;
use crate::ops::matmul::Act;

/// The batch side of a batched step, for up to `rows` rows in all: U32 (R) tokens, (R, D) activations,
/// (R, F) and (R, V) logits. Allocated once per batch capacity.
pub struct BatchScratch {
    rows: usize,
    tokens: Tensor,
    x: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    t: Tensor,
    f: Tensor,
    logits: Tensor,
}

impl BatchScratch {
    /// Rows the scratch holds.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// GPU bytes of a scratch of `rows` rows for this decoder's shapes.
    pub fn bytes(decoder: &Decoder, rows: usize) -> Result<u64> {
        let (d, f, v) = (decoder.d, decoder.ffn, decoder.vocab);
        Ok(DType::U32.buffer_bytes(&[rows])?
            + 6 * DType::F32.buffer_bytes(&[rows, d])?
            + DType::F32.buffer_bytes(&[rows, f])?
            + DType::F32.buffer_bytes(&[rows, v])?)
    }

    /// The same buffers viewed as their first `r` rows (one step's batch).
    fn rows_of(&self, r: usize, d: usize) -> Result<BatchScratch> {
        let f = self.f.dim(1);
        let v = self.logits.dim(1);
        let m = |t: &Tensor, c: usize| t.view(&[r, c], DType::F32);
        Ok(BatchScratch {
            rows: r,
            tokens: self.tokens.view(&[r], DType::U32)?,
            x: m(&self.x, d)?,
            q: m(&self.q, d)?,
            k: m(&self.k, d)?,
            v: m(&self.v, d)?,
            a: m(&self.a, d)?,
            t: m(&self.t, d)?,
            f: m(&self.f, f)?,
            logits: m(&self.logits, v)?,
        })
    }
}

/// Copy `rows` rows of `width` f32 (or u32) from `src` at row `s0` to `dst` at row `d0`.
fn copy_rows(
    rec: &mut Recorder,
    (src, s0): (&Tensor, usize),
    (dst, d0): (&Tensor, usize),
    rows: usize,
    width: usize,
) -> Result<()> {
    let row = (width * 4) as u64;
    rec.copy_range(
        src,
        s0 as u64 * row,
        dst,
        d0 as u64 * row,
        rows as u64 * row,
    )
}

/// The states of one batched step and where each one's rows start in the batch buffers `b`.
struct Rows<'a> {
    states: &'a [&'a DecoderState],
    starts: Vec<usize>,
    b: &'a BatchScratch,
}

impl<'a> Rows<'a> {
    fn new(states: &'a [&'a DecoderState], b: &'a BatchScratch) -> Self {
        let starts = states
            .iter()
            .scan(0, |acc, s| {
                let r0 = *acc;
                *acc += s.batch;
                Some(r0)
            })
            .collect();
        Rows { states, starts, b }
    }

    /// `f(rec, state, first row)` for each state in order.
    fn each(
        &self,
        rec: &mut Recorder,
        f: &mut dyn FnMut(&mut Recorder, &DecoderState, usize) -> Result<()>,
    ) -> Result<()> {
        for (s, &r0) in self.states.iter().zip(&self.starts) {
            f(rec, s, r0)?;
        }
        Ok(())
    }
}

impl Decoder {
    /// Scratch for batched steps of up to `rows` rows in all.
    pub fn batch_scratch(&self, gpu: &Arc<Device>, rows: usize) -> Result<BatchScratch> {
        let rows = rows.max(1);
        let (d, f, v) = (self.d, self.ffn, self.vocab);
        let z = |shape: &[usize], label: &str| Tensor::zeros(gpu, shape, DType::F32, label);
        Ok(BatchScratch {
            rows,
            tokens: Tensor::zeros(gpu, &[rows], DType::U32, "batch.tokens")?,
            x: z(&[rows, d], "batch.x")?,
            q: z(&[rows, d], "batch.q")?,
            k: z(&[rows, d], "batch.k")?,
            v: z(&[rows, d], "batch.v")?,
            a: z(&[rows, d], "batch.attn")?,
            t: z(&[rows, d], "batch.tmp")?,
            f: z(&[rows, f], "batch.ffn")?,
            logits: z(&[rows, v], "batch.logits")?,
        })
    }

    /// Record one decoder step for every state in `states` (their rows concatenated, in order) into
    /// `rec`. Each state must hold its tokens ([`DecoderState::write_tokens`]) and its position
    /// ([`DecoderState::write_step`]); afterwards each state's logits buffer holds its rows' logits, as
    /// [`Decoder::step_planned`] leaves them, bit for bit (see the module doc). Reorders a state needs
    /// (beam search) are recorded into `rec` before this.
    pub fn step_batch(
        &self,
        rec: &mut Recorder,
        states: &[&DecoderState],
        scratch: &BatchScratch,
    ) -> Result<()> {
        let total: usize = states.iter().map(|s| s.batch).sum();
        if total == 0 {
            return Ok(());
        }
        if total > scratch.rows {
            return Err(Error::shape(
                "batched decoder step",
                format!("{total} rows for a scratch of {}", scratch.rows),
            ));
        }
        let b = scratch.rows_of(total, self.d)?;
        let rows = Rows::new(states, &b);
        self.embed_batch(rec, &rows)?;
        let scale = ((self.d / self.heads) as f32).powf(-0.5);
        for i in 0..self.layers.len() {
            self.layer_batch(rec, &rows, i, scale)?;
        }
        let v = self.vocab;
        self.lm_head
            .forward_rows(rec, &b.x, Act::None, None, &b.logits)?; // (R, V)
        rows.each(rec, &mut |rec, s, r0| {
            copy_rows(rec, (&b.logits, r0), (&s.logits, 0), s.batch, v)
        })
    }

    /// Embedding (batch), position (each state's own), layernorm_embedding (batch).
    fn embed_batch(&self, rec: &mut Recorder, rows: &Rows) -> Result<()> {
        let (b, d) = (rows.b, self.d);
        rows.each(rec, &mut |rec, s, r0| {
            copy_rows(rec, (&s.tokens, 0), (&b.tokens, r0), s.batch, 1)
        })?;
        self.embed_tokens.forward(rec, &b.tokens, &b.x)?; // (R, D)
        if self.embed_scale != 1.0 {
            ops::elementwise::scale(rec, &b.x, self.embed_scale, &b.x)?; // (R, D)
        }
        let w = &self.embed_positions.weight;
        rows.each(rec, &mut |rec, s, r0| {
            copy_rows(rec, (&b.x, r0), (&s.x, 0), s.batch, d)?;
            ops::decode_step::pos_add(rec, &s.x, w, &s.step, STEP_POS_ROW)?; // (B, D)
            copy_rows(rec, (&s.x, 0), (&b.x, r0), s.batch, d)
        })?;
        self.layernorm_embedding.forward(rec, &b.x, &b.x) // (R, D)
    }

    /// Decoder layer `i` over the batch: projections and feed-forward for all rows at once, the caches
    /// and attention per state.
    fn layer_batch(&self, rec: &mut Recorder, rows: &Rows, i: usize, scale: f32) -> Result<()> {
        let (b, d, l) = (rows.b, self.d, &self.layers[i]);
        // Self-attention: projections for the batch, cache and attention per state.
        let sa = &l.self_attn;
        sa.q_proj.forward_rows(rec, &b.x, Act::None, None, &b.q)?; // (R, D)
        sa.k_proj.forward_rows(rec, &b.x, Act::None, None, &b.k)?; // (R, D)
        sa.v_proj.forward_rows(rec, &b.x, Act::None, None, &b.v)?; // (R, D)
        rows.each(rec, &mut |rec, s, r0| {
            let n = s.batch;
            copy_rows(rec, (&b.q, r0), (&s.q, 0), n, d)?;
            copy_rows(rec, (&b.k, r0), (&s.kn, 0), n, d)?;
            copy_rows(rec, (&b.v, r0), (&s.vn, 0), n, d)?;
            let (ck, cv) = (&s.self_k[i], &s.self_v[i]);
            ops::decode_step::kv_write(rec, &s.kn, &s.vn, ck, cv, &s.step, STEP_CACHE_ROW)?;
            let opts = self.self_opts(scale, &s.step);
            let (q3, a3) = (s.q.reshape(&[n, 1, d])?, s.a.reshape(&[n, 1, d])?);
            ops::attention::attention(rec, &q3, ck, cv, &opts, &a3)?; // (B, 1, D)
            copy_rows(rec, (&s.a, 0), (&b.a, r0), n, d)
        })?;
        sa.out_proj
            .forward_rows(rec, &b.a, Act::None, Some(&b.x), &b.t)?; // (R, D)
        l.self_attn_layer_norm.forward(rec, &b.t, &b.x)?; // (R, D)

        // Cross-attention: each state's own image + prompt K/V.
        let ea = &l.encoder_attn;
        ea.q_proj.forward_rows(rec, &b.x, Act::None, None, &b.q)?; // (R, D)
        rows.each(rec, &mut |rec, s, r0| {
            let n = s.batch;
            copy_rows(rec, (&b.q, r0), (&s.q, 0), n, d)?;
            let opts = self.cross_opts(scale);
            let (q3, a3) = (s.q.reshape(&[n, 1, d])?, s.a.reshape(&[n, 1, d])?);
            let (xk, xv) = (&s.cross.k[i], &s.cross.v[i]);
            ops::attention::attention(rec, &q3, xk, xv, &opts, &a3)?; // (B, 1, D)
            copy_rows(rec, (&s.a, 0), (&b.a, r0), n, d)
        })?;
        ea.out_proj
            .forward_rows(rec, &b.a, Act::None, Some(&b.x), &b.t)?; // (R, D)
        l.encoder_attn_layer_norm.forward(rec, &b.t, &b.x)?; // (R, D)

        // Feed-forward.
        l.ffn.fc1.forward_rows(rec, &b.x, self.act, None, &b.f)?; // (R, F)
        l.ffn
            .fc2
            .forward_rows(rec, &b.f, Act::None, Some(&b.x), &b.t)?; // (R, D)
        l.ffn.final_layer_norm.forward(rec, &b.t, &b.x) // (R, D)
    }

    /// Self-attention options of a step: kv_len and q_offset from the state's step buffer.
    pub(super) fn self_opts<'t>(&self, scale: f32, step: &'t Tensor) -> AttnOpts<'t> {
        AttnOpts {
            heads: self.heads,
            scale,
            causal: false,
            kv_len: None,
            q_offset: 0,
            mask: None,
            dyn_len: Some(step),
            variant: None,
        }
    }

    /// Cross-attention options: every encoder position.
    pub(super) fn cross_opts(&self, scale: f32) -> AttnOpts<'static> {
        AttnOpts {
            heads: self.heads,
            scale,
            ..Default::default()
        }
    }
}
