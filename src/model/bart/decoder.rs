//! BART decoder, one token per batch row per step, with GPU-resident caches.
//!
//! Per layer: x = LN1(x + self_attn(x) over the cache rows 0..=pos); x = LN2(x + cross_attn(x, encoder
//! K/V)); x = LN3(x + fc2(gelu(fc1(x)))). The LM head is the tied shared embedding (V, D) plus the
//! optional `final_logits_bias`.
//!
//! Caches: each layer's self-attention K and V are (B, max_len, D) tensors allocated once by
//! [`Decoder::new_state`]; a step writes row `pos` of every batch row (a buffer copy per row) and attends
//! over rows 0..=pos. The cross-attention K/V ([`CrossKv`]) are projected once per image, (1, S, D) per
//! layer, and shared by every batch row (beam). [`DecoderState::reorder`] permutes the cache rows by beam
//! index on the GPU (buffer copies of the filled rows only) for beam search.
//!
//! Cache precision ([`Decoder::kv_dtype`]): with fp32 weights the caches and cross K/V are f32 (the
//! reference's numerics); with fp16/q8/q4 weights they are f16, packed two per u32 like the f16 weights
//! (half the bytes: at Florence-2-base, 3 beams and 1023 positions, 56.6 MB instead of 113.1 MB of
//! self-attention caches), written by rounding the f32 projections (`pack2x16float`) and widened back to
//! f32 by the attention kernels' `KV_F16` variant. Everything else in the step stays f32.
//!
//! Recorded once: [`Decoder::step_planned`] records the step once per request (per [`DecoderState`]) as a
//! [`Plan`] whose kernels read the position from the state's step buffer (U32 [kv_len, q_offset,
//! position-table row, cache row], [`DecoderState::write_step`]): the position embedding is added by
//! `decode_step::pos_add`, the cache rows are written by `decode_step::kv_write` and self-attention runs
//! the `DYN_LEN` variant of the same kernel. Each step then writes that 16-byte buffer and encodes the
//! plan: no launcher, params or bind group per step.

use std::sync::Arc;

use crate::config::TextConfig;
use crate::error::{Error, Result};
use crate::gpu::{DType, Device, Plan, Recorder, Tensor};
use crate::model::bart::{ffn_act, layers, position_embeddings, Attention, Ffn, POS_OFFSET};
use crate::model::layers::{Embedding, LayerNorm, Linear};
use crate::ops;
use crate::ops::matmul::Act;
use crate::weights::WeightsView;

mod batch;

pub use batch::BatchScratch;

#[derive(Clone, Debug)]
struct DecoderLayer {
    self_attn: Attention,
    self_attn_layer_norm: LayerNorm,
    encoder_attn: Attention,
    encoder_attn_layer_norm: LayerNorm,
    ffn: Ffn,
}

/// The BART decoder and the tied LM head.
#[derive(Clone, Debug)]
pub struct Decoder {
    d: usize,
    heads: usize,
    ffn: usize,
    vocab: usize,
    act: Act,
    embed_scale: f32,
    /// (V, D), shared with the encoder side and the LM head.
    embed_tokens: Embedding,
    /// (max_position_embeddings + 2, D)
    embed_positions: Embedding,
    layernorm_embedding: LayerNorm,
    layers: Vec<DecoderLayer>,
    /// `lm_head.weight` (V, D), with `final_logits_bias` (V) as its bias when the checkpoint has one.
    lm_head: Linear,
    /// Element type of the self-attention caches and cross-attention K/V: F32 or F16.
    kv_dtype: DType,
}

/// Cross-attention K and V of one image for every decoder layer, each (1, S, D), in the decoder's
/// [`Decoder::kv_dtype`] at projection time.
#[derive(Clone, Debug)]
pub struct CrossKv {
    pub k: Vec<Tensor>,
    pub v: Vec<Tensor>,
    pub len: usize,
}

/// Cache positions per chunk of a beam reorder: the spare buffer is (B, 64, D) instead of a whole cache
/// (B, max_len, D), 1/16 of it at max_len 1023 (Florence-2-base, 3 beams: 0.6 MB instead of 9.4 MB),
/// for a copy per moved beam per 64 filled positions.
pub const REORDER_CHUNK_ROWS: usize = 64;

/// Everything one generation needs on the GPU, allocated once: the self-attention caches, the
/// cross-attention K/V, the per-step scratch buffers and the logits.
pub struct DecoderState {
    gpu: Arc<Device>,
    /// Unique for the process's lifetime: what a recorded batched step ([`DecodeBatch`]) is keyed by.
    ///
    /// [`DecodeBatch`]: crate::pipeline::DecodeBatch
    id: u64,
    batch: usize,
    max_len: usize,
    cross: CrossKv,
    /// Per layer (B, max_len, D), f32 or f16 ([`Decoder::kv_dtype`]).
    self_k: Vec<Tensor>,
    self_v: Vec<Tensor>,
    /// One (B, chunk, D) buffer reused by [`DecoderState::reorder`] for every cache and position
    /// chunk in turn (allocated on the first reorder).
    spare: Option<Tensor>,
    /// Cache positions a reorder moves per chunk through `spare` ([`REORDER_CHUNK_ROWS`]).
    reorder_chunk: usize,
    /// U32 (B): the tokens fed to the next step.
    tokens: Tensor,
    x: Tensor,
    q: Tensor,
    kn: Tensor,
    vn: Tensor,
    a: Tensor,
    t: Tensor,
    f: Tensor,
    logits: Tensor,
    /// U32 (4): the position of the next planned step, as its kernels read it: [kv_len = pos + 1,
    /// q_offset = pos, position-table row = pos + POS_OFFSET, cache row = pos].
    step: Tensor,
    /// The recorded step ([`Decoder::step_planned`]), built on its first use.
    plan: Option<Plan>,
}

/// `out` = `lin(x)` in `out`'s element type: f32 directly, f16 through the f32 `scratch` of x's shape.
fn project_kv(
    rec: &mut Recorder,
    lin: &Linear,
    x: &Tensor,
    scratch: Option<&Tensor>,
    out: &Tensor,
) -> Result<()> {
    match scratch {
        Some(f) => {
            lin.forward(rec, x, Act::None, f)?; // (N, D) f32
            ops::cast::f32_to_f16(rec, f, out) // (N, D) f16
        }
        None => lin.forward(rec, x, Act::None, out), // (N, D)
    }
}

/// The next [`DecoderState::id`].
static NEXT_STATE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Indices into [`DecoderState`]'s step buffer.
/// [kv_len, q_offset] at 0 and 1: what `ops::attention::attention` reads through `AttnOpts::dyn_len`.
const STEP_KV_LEN: usize = 0;
const STEP_Q_OFFSET: usize = 1;
const STEP_POS_ROW: usize = 2;
const STEP_CACHE_ROW: usize = 3;

impl Decoder {
    /// `w` is the decoder's view (`model.language_model.decoder`); `embed_tokens` the shared embedding
    /// (V, D); `lm_head` (V, D) (the same tensor when tied); `final_logits_bias` (1, V) or (V) when the
    /// checkpoint has one.
    pub fn new(
        cfg: &TextConfig,
        w: WeightsView,
        embed_tokens: Tensor,
        lm_head: Tensor,
        final_logits_bias: Option<Tensor>,
    ) -> Result<Self> {
        let d = cfg.d_model;
        let f = cfg.decoder_ffn_dim;
        let v = cfg.vocab_size;
        if cfg.decoder_attention_heads == 0 || !d.is_multiple_of(cfg.decoder_attention_heads) {
            return Err(Error::Config(format!(
                "d_model {d} is not divisible by {} decoder heads",
                cfg.decoder_attention_heads
            )));
        }
        let embed_tokens = Embedding::from_tensor("shared embedding", embed_tokens, v, d)?;
        let kv_dtype = default_kv_dtype(lm_head.dtype(), d);
        let final_logits_bias = match final_logits_bias {
            None => None,
            Some(b) if b.numel() == v => Some(b.reshape(&[v])?),
            Some(b) => {
                return Err(Error::TensorShape {
                    name: "final_logits_bias".into(),
                    expected: vec![1, v],
                    got: b.shape().to_vec(),
                })
            }
        };
        let layers = layers(&w, cfg.decoder_layers, |l| {
            Ok(DecoderLayer {
                self_attn: Attention::new(&l.pp("self_attn"), d)?,
                self_attn_layer_norm: LayerNorm::new(&l.pp("self_attn_layer_norm"), d)?,
                encoder_attn: Attention::new(&l.pp("encoder_attn"), d)?,
                encoder_attn_layer_norm: LayerNorm::new(&l.pp("encoder_attn_layer_norm"), d)?,
                ffn: Ffn::new(l, d, f)?,
            })
        })?;
        let (embed_positions, layernorm_embedding) = position_embeddings(&w, cfg)?;
        Ok(Decoder {
            d,
            heads: cfg.decoder_attention_heads,
            ffn: f,
            vocab: v,
            act: ffn_act(&cfg.activation_function)?,
            embed_scale: if cfg.scale_embedding {
                (d as f32).sqrt()
            } else {
                1.0
            },
            embed_tokens,
            embed_positions,
            layernorm_embedding,
            layers,
            lm_head: Linear::from_tensors("lm_head", lm_head, final_logits_bias, d, v)?,
            kv_dtype,
        })
    }

    /// Element type of the KV caches and cross K/V: F32 when the weights are f32 (LM head in f32), F16
    /// for the fp16/q8/q4 resident formats (d_model even; an odd one keeps F32).
    pub fn kv_dtype(&self) -> DType {
        self.kv_dtype
    }

    /// Choose the KV element type (F32 or F16; F16 needs an even d_model) for the cross K/V and states
    /// made from now on (tests and benchmarks compare both on the same weights).
    pub fn set_kv_dtype(&mut self, dtype: DType) -> Result<()> {
        match dtype {
            DType::F32 => {}
            DType::F16 if self.d.is_multiple_of(2) => {}
            _ => {
                return Err(Error::shape(
                    "decoder KV dtype",
                    format!(
                        "{dtype:?} caches for d_model {}: need F32, or F16 with an even d_model",
                        self.d
                    ),
                ))
            }
        }
        self.kv_dtype = dtype;
        Ok(())
    }

    /// Number of decoder positions the position table allows (= max_position_embeddings).
    pub fn max_positions(&self) -> usize {
        self.embed_positions.num_embeddings() - POS_OFFSET
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    pub fn layers(&self) -> usize {
        self.layers.len()
    }

    /// Record the projection of the encoder output (1, S, D) to every layer's cross-attention K/V.
    pub fn cross_kv(&self, rec: &mut Recorder, encoder_out: &Tensor) -> Result<CrossKv> {
        let d = self.d;
        if encoder_out.rank() != 3 || encoder_out.dim(0) != 1 || encoder_out.dim(2) != d {
            return Err(Error::shape(
                "cross_kv",
                format!(
                    "encoder output {:?} must be (1, S, {d})",
                    encoder_out.shape()
                ),
            ));
        }
        let s = encoder_out.dim(1);
        let gpu = rec.gpu().clone();
        let x = encoder_out.reshape(&[s, d])?;
        let kvd = self.kv_dtype;
        // f16: each projection goes through one f32 (S, D) scratch and is packed into its tensor.
        let scratch = match kvd {
            DType::F16 => Some(Tensor::zeros(&gpu, &[s, d], DType::F32, "cross.f32")?),
            _ => None,
        };
        let project = |rec: &mut Recorder, lin: &Linear, label: String| -> Result<Tensor> {
            let t = Tensor::zeros(&gpu, &[s, d], kvd, &label)?;
            project_kv(rec, lin, &x, scratch.as_ref(), &t)?; // (S, D)
            t.reshape(&[1, s, d])
        };
        let mut k = Vec::with_capacity(self.layers.len());
        let mut v = Vec::with_capacity(self.layers.len());
        for (i, l) in self.layers.iter().enumerate() {
            k.push(project(rec, &l.encoder_attn.k_proj, format!("cross.k{i}"))?);
            v.push(project(rec, &l.encoder_attn.v_proj, format!("cross.v{i}"))?);
        }
        Ok(CrossKv { k, v, len: s })
    }

    /// [`Decoder::cross_kv`] of each of the B encoder outputs in `hidden` (B, S, D), projected as one
    /// batch of B x S rows with the kernels chosen for one output's S rows ([`Recorder::set_images`]),
    /// so each request's K/V equal, bit for bit, those of its own call; then copied into each request's
    /// own (1, S, D) tensors.
    pub fn cross_kv_batch(&self, rec: &mut Recorder, hidden: &Tensor) -> Result<Vec<CrossKv>> {
        let d = self.d;
        if hidden.rank() != 3 || hidden.dim(2) != d {
            return Err(Error::shape(
                "cross_kv_batch",
                format!("encoder outputs {:?} must be (B, S, {d})", hidden.shape()),
            ));
        }
        let (b, s) = (hidden.dim(0), hidden.dim(1));
        let gpu = rec.gpu().clone();
        let x = hidden.reshape(&[b * s, d])?;
        let kvd = self.kv_dtype;
        let all = Tensor::zeros(&gpu, &[b * s, d], kvd, "cross.batch")?; // (B*S, D)
        let scratch = match kvd {
            DType::F16 => Some(Tensor::zeros(&gpu, &[b * s, d], DType::F32, "cross.f32")?),
            _ => None,
        };
        let mut out: Vec<CrossKv> = (0..b)
            .map(|_| CrossKv {
                k: Vec::with_capacity(self.layers.len()),
                v: Vec::with_capacity(self.layers.len()),
                len: s,
            })
            .collect();
        let bytes = kvd.buffer_bytes(&[s, d])?;
        let images = rec.images();
        rec.set_images(b);
        let project = |rec: &mut Recorder, lin: &Linear, label: &str| -> Result<Vec<Tensor>> {
            project_kv(rec, lin, &x, scratch.as_ref(), &all)?; // (B*S, D)
            (0..b)
                .map(|i| {
                    let t = Tensor::zeros(&gpu, &[1, s, d], kvd, label)?;
                    rec.copy_range(&all, i as u64 * bytes, &t, 0, bytes)?;
                    Ok(t)
                })
                .collect()
        };
        let done = (|| -> Result<()> {
            for (i, l) in self.layers.iter().enumerate() {
                let ks = project(rec, &l.encoder_attn.k_proj, &format!("cross.k{i}"))?;
                let vs = project(rec, &l.encoder_attn.v_proj, &format!("cross.v{i}"))?;
                for (o, (k, v)) in out.iter_mut().zip(ks.into_iter().zip(vs)) {
                    o.k.push(k);
                    o.v.push(v);
                }
            }
            Ok(())
        })();
        rec.set_images(images);
        done.map(|()| out)
    }

    /// GPU bytes of what [`Decoder::new_state`] allocates for a decoder of `cfg`'s shapes, `batch` rows,
    /// `max_len` positions and caches of `kv_dtype` (the self-attention caches, the per-step scratch,
    /// the logits and the step buffer; the cross K/V are the caller's), plus the reorder spare
    /// [`DecoderState::reorder`] adds on its first use when `reorders` (beam search). Each buffer is
    /// counted as allocated ([`DType::buffer_bytes`]).
    pub fn state_bytes(
        cfg: &TextConfig,
        batch: usize,
        max_len: usize,
        kv_dtype: DType,
        reorders: bool,
    ) -> Result<u64> {
        let (b, d) = (batch, cfg.d_model);
        let caches = 2 * cfg.decoder_layers as u64 * kv_dtype.buffer_bytes(&[b, max_len, d])?;
        let scratch = 6 * DType::F32.buffer_bytes(&[b, d])?
            + DType::F32.buffer_bytes(&[b, cfg.decoder_ffn_dim])?
            + DType::F32.buffer_bytes(&[b, cfg.vocab_size])?
            + DType::U32.buffer_bytes(&[b])?
            + DType::U32.buffer_bytes(&[4])?;
        let spare = if reorders {
            kv_dtype.buffer_bytes(&[b, REORDER_CHUNK_ROWS.clamp(1, max_len), d])?
        } else {
            0
        };
        Ok(caches + scratch + spare)
    }

    /// Allocate the caches and scratch buffers for `batch` rows (beams) and at most `max_len` decoder
    /// positions (<= max_position_embeddings).
    pub fn new_state(
        &self,
        gpu: &Arc<Device>,
        cross: &CrossKv,
        batch: usize,
        max_len: usize,
    ) -> Result<DecoderState> {
        const OP: &str = "decoder state";
        if batch == 0 || max_len == 0 || max_len > self.max_positions() {
            return Err(Error::shape(
                OP,
                format!(
                    "batch {batch}, max_len {max_len}: need batch >= 1 and 1 <= max_len <= {}",
                    self.max_positions()
                ),
            ));
        }
        if cross.k.len() != self.layers.len() || cross.v.len() != self.layers.len() {
            return Err(Error::shape(
                OP,
                "cross K/V do not match the decoder layers",
            ));
        }
        let (d, b) = (self.d, batch);
        let z = |shape: &[usize], label: &str| Tensor::zeros(gpu, shape, DType::F32, label);
        let kvd = self.kv_dtype;
        let zkv = |shape: &[usize], label: &str| Tensor::zeros(gpu, shape, kvd, label);
        let mut self_k = Vec::with_capacity(self.layers.len());
        let mut self_v = Vec::with_capacity(self.layers.len());
        for i in 0..self.layers.len() {
            self_k.push(zkv(&[b, max_len, d], &format!("cache.k{i}"))?);
            self_v.push(zkv(&[b, max_len, d], &format!("cache.v{i}"))?);
        }
        Ok(DecoderState {
            gpu: gpu.clone(),
            id: NEXT_STATE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            batch: b,
            max_len,
            cross: cross.clone(),
            self_k,
            self_v,
            spare: None,
            reorder_chunk: REORDER_CHUNK_ROWS,
            tokens: Tensor::zeros(gpu, &[b], DType::U32, "dec.tokens")?,
            x: z(&[b, d], "dec.x")?,
            q: z(&[b, d], "dec.q")?,
            kn: z(&[b, d], "dec.k")?,
            vn: z(&[b, d], "dec.v")?,
            a: z(&[b, d], "dec.attn")?,
            t: z(&[b, d], "dec.tmp")?,
            f: z(&[b, self.ffn], "dec.ffn")?,
            logits: z(&[b, self.vocab], "dec.logits")?,
            step: Tensor::zeros(gpu, &[4], DType::U32, "dec.step")?,
            plan: None,
        })
    }

    /// One decoder step: the tokens in `state` ([`DecoderState::write_tokens`], U32 (B)) sit at position
    /// `pos` (0 = the decoder start token); their K/V are written to cache row `pos`, attention covers
    /// rows 0..=pos. Returns the logits (B, V) (a buffer owned by `state`, overwritten by the next step).
    /// The step is recorded once per state: the first call records it as a [`Plan`] (kernels, bind groups,
    /// params, workgroup counts, with the registry's kernel choices of that moment); every call writes the
    /// position to the state's step buffer (one 16-byte `queue.write_buffer`, ordered before `rec`'s
    /// submit) and encodes the plan into `rec`. One planned step per submit: a second step recorded into
    /// the same recorder would overwrite the first one's position before either runs.
    pub fn step_planned(
        &self,
        rec: &mut Recorder,
        pos: u32,
        state: &mut DecoderState,
    ) -> Result<Tensor> {
        if pos as usize >= state.max_len {
            return Err(Error::shape(
                "decoder step",
                format!("position {pos} is past the cache of {} rows", state.max_len),
            ));
        }
        if !rec.gpu().backend().records_plans() {
            // The CPU backend runs the step as it is recorded: nothing to keep.
            state.write_step(pos)?;
            self.record_step(rec, state)?;
            return Ok(state.logits.clone());
        }
        if state.plan.is_none() {
            let mut cap = Recorder::capture(rec.gpu());
            self.record_step(&mut cap, state)?;
            state.plan = Some(cap.into_plan()?);
        }
        state.write_step(pos)?;
        if let Some(plan) = &state.plan {
            rec.replay(plan)?;
        }
        Ok(state.logits.clone())
    }

    /// Record a step whose kernels read the position from the state's step buffer.
    fn record_step(&self, rec: &mut Recorder, state: &DecoderState) -> Result<()> {
        let (b, d) = (state.batch, self.d);
        let s = state;

        // Embedding, position, layernorm_embedding.
        self.embed_tokens.forward(rec, &s.tokens, &s.x)?; // (B, D)
        if self.embed_scale != 1.0 {
            ops::elementwise::scale(rec, &s.x, self.embed_scale, &s.x)?; // (B, D)
        }
        let w = &self.embed_positions.weight;
        ops::decode_step::pos_add(rec, &s.x, w, &s.step, STEP_POS_ROW)?; // (B, D)
        self.layernorm_embedding.forward(rec, &s.x, &s.x)?; // (B, D)

        let scale = ((d / self.heads) as f32).powf(-0.5);
        let q3 = s.q.reshape(&[b, 1, d])?;
        let a3 = s.a.reshape(&[b, 1, d])?;
        // kv_len / q_offset come from the step buffer.
        let self_opts = self.self_opts(scale, &s.step);
        let cross_opts = self.cross_opts(scale);
        for (i, l) in self.layers.iter().enumerate() {
            let (ck, cv) = (&s.self_k[i], &s.self_v[i]);
            // Self-attention with the cache.
            let sa = &l.self_attn;
            sa.q_proj.forward_rows(rec, &s.x, Act::None, None, &s.q)?; // (B, D)
            sa.k_proj.forward_rows(rec, &s.x, Act::None, None, &s.kn)?; // (B, D)
            sa.v_proj.forward_rows(rec, &s.x, Act::None, None, &s.vn)?; // (B, D)
            ops::decode_step::kv_write(rec, &s.kn, &s.vn, ck, cv, &s.step, STEP_CACHE_ROW)?;
            ops::attention::attention(rec, &q3, ck, cv, &self_opts, &a3)?; // (B, 1, D)
            sa.out_proj
                .forward_rows(rec, &s.a, Act::None, Some(&s.x), &s.t)?; // (B, D) = x + out_proj(a)
            l.self_attn_layer_norm.forward(rec, &s.t, &s.x)?; // (B, D)

            // Cross-attention to the image + prompt (K/V shared by all rows: Bk = 1).
            let ea = &l.encoder_attn;
            ea.q_proj.forward_rows(rec, &s.x, Act::None, None, &s.q)?; // (B, D)
            let (xk, xv) = (&s.cross.k[i], &s.cross.v[i]);
            ops::attention::attention(rec, &q3, xk, xv, &cross_opts, &a3)?; // (B, 1, D)
            ea.out_proj
                .forward_rows(rec, &s.a, Act::None, Some(&s.x), &s.t)?; // (B, D) = x + out_proj(a)
            l.encoder_attn_layer_norm.forward(rec, &s.t, &s.x)?; // (B, D)

            // Feed-forward.
            l.ffn.fc1.forward_rows(rec, &s.x, self.act, None, &s.f)?; // (B, F)
            l.ffn
                .fc2
                .forward_rows(rec, &s.f, Act::None, Some(&s.x), &s.t)?; // (B, D) = x + fc2(f)
            l.ffn.final_layer_norm.forward(rec, &s.t, &s.x)?; // (B, D)
        }
        self.lm_head
            .forward_rows(rec, &s.x, Act::None, None, &s.logits)?; // (B, V)
        Ok(())
    }
}

impl DecoderState {
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// This state's identity (never shared by two states of one process).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Cache positions per reorder chunk (default [`REORDER_CHUNK_ROWS`]; tests use small values to
    /// exercise the chunking on short caches).
    pub fn set_reorder_chunk_rows(&mut self, rows: usize) {
        self.reorder_chunk = rows.max(1);
    }

    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Element type of the self-attention caches (F32 or F16, [`Decoder::kv_dtype`] when made).
    pub fn kv_dtype(&self) -> DType {
        self.self_k.first().map(|t| t.dtype()).unwrap_or(DType::F32)
    }

    pub fn cross(&self) -> &CrossKv {
        &self.cross
    }

    /// Upload the position of the next [`Decoder::step_planned`] to the step buffer (it does this itself;
    /// `pos` < max_len, checked).
    pub fn write_step(&self, pos: u32) -> Result<()> {
        if pos as usize >= self.max_len {
            return Err(Error::shape(
                "write_step",
                format!("position {pos} is past the cache of {} rows", self.max_len),
            ));
        }
        let mut v = [0u32; 4];
        v[STEP_KV_LEN] = pos + 1;
        v[STEP_Q_OFFSET] = pos;
        v[STEP_POS_ROW] = pos + POS_OFFSET as u32;
        v[STEP_CACHE_ROW] = pos;
        self.step
            .write_bytes(&self.gpu, 0, bytemuck::cast_slice(&v))
    }

    /// The logits (B, V) the last step wrote ([`Decoder::step_planned`] returns the same buffer).
    pub fn logits(&self) -> &Tensor {
        &self.logits
    }

    /// The recorded step, once [`Decoder::step_planned`] has built it.
    pub fn plan(&self) -> Option<&Plan> {
        self.plan.as_ref()
    }

    /// Upload the next step's input tokens (one per batch row). Queue writes are ordered before the
    /// next submit, so this may be called right before recording the step.
    pub fn write_tokens(&self, ids: &[u32]) -> Result<()> {
        if ids.len() != self.batch {
            return Err(Error::shape(
                "write_tokens",
                format!("{} ids for a batch of {}", ids.len(), self.batch),
            ));
        }
        self.tokens
            .write_bytes(&self.gpu, 0, bytemuck::cast_slice(ids))
    }

    /// Record a reorder of every self-attention cache by beam index: new row b = old row `src[b]`,
    /// rows 0..`fill` (the positions written so far). GPU buffer copies only: rows that stay in place
    /// are not copied; the others go, [`REORDER_CHUNK_ROWS`] positions at a time, through one small
    /// spare buffer (allocated on first use). Positions are independent, so chunking by position is
    /// exact (a buffer cannot be copied into itself, hence the spare).
    pub fn reorder(&mut self, rec: &mut Recorder, src: &[usize], fill: usize) -> Result<()> {
        const OP: &str = "reorder caches";
        if src.len() != self.batch || src.iter().any(|&s| s >= self.batch) || fill > self.max_len {
            return Err(Error::shape(
                OP,
                format!(
                    "indices {src:?} for a batch of {}, fill {fill} of {}",
                    self.batch, self.max_len
                ),
            ));
        }
        if fill == 0 || src.iter().enumerate().all(|(b, &s)| b == s) {
            return Ok(());
        }
        let Some(first) = self.self_k.first() else {
            return Ok(());
        };
        let (d, dtype) = (first.dim(2), first.dtype());
        // Bytes of one cache row in the caches' dtype (f16: D is even, so rows stay 4-byte aligned).
        let row_bytes = (d * dtype.size()) as u64;
        let beam_bytes = self.max_len as u64 * row_bytes;
        let chunk = self.reorder_chunk.clamp(1, self.max_len);
        if self.spare.as_ref().map(|t| (t.dim(1), t.dtype())) != Some((chunk, dtype)) {
            self.spare = Some(Tensor::zeros(
                &self.gpu,
                &[self.batch, chunk, d],
                dtype,
                "cache.spare",
            )?);
        }
        let Some(spare) = self.spare.as_ref() else {
            return Ok(());
        };
        let spare_beam = chunk as u64 * row_bytes;
        for cache in self.self_k.iter().chain(self.self_v.iter()) {
            let mut p0 = 0;
            while p0 < fill {
                let n = chunk.min(fill - p0);
                let (off, span) = (p0 as u64 * row_bytes, n as u64 * row_bytes);
                // Gather the moved rows of these positions into the spare, then copy them back.
                for (b, &s) in src.iter().enumerate() {
                    if b != s {
                        rec.copy_range(
                            cache,
                            s as u64 * beam_bytes + off,
                            spare,
                            b as u64 * spare_beam,
                            span,
                        )?;
                    }
                }
                for (b, &s) in src.iter().enumerate() {
                    if b != s {
                        rec.copy_range(
                            spare,
                            b as u64 * spare_beam,
                            cache,
                            b as u64 * beam_bytes + off,
                            span,
                        )?;
                    }
                }
                p0 += n;
            }
        }
        Ok(())
    }
}

/// The KV element type for weights whose LM head is `weights` and rows of `d` channels: f32 with f32
/// weights, f16 otherwise (a row of f16 must fill whole u32 words for the byte copies: d even).
pub fn default_kv_dtype(weights: DType, d: usize) -> DType {
    if weights == DType::F32 || !d.is_multiple_of(2) {
        DType::F32
    } else {
        DType::F16
    }
}
