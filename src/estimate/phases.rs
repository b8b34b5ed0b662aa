//! Activation bytes of one request, phase by phase, from the shapes alone: the vision phase (the DaViT
//! arena of [`TowerShape::arena_plan`] and the image features), the encoder phase (prompt embedding,
//! encoder scratch, cross-attention K/V) and the decode phase (cross K/V, [`Decoder::state_bytes`] and
//! the generation's own buffers). The request's peak is the weights plus the largest phase.

use crate::config::Florence2Config;
use crate::error::Result;
use crate::gpu::DType;
use crate::model::bart::Decoder;
use crate::model::davit_plan::TowerShape;
use crate::model::generate::TOPK_MAX;
use crate::model::projector::image_tokens;
use crate::ops::channel_attn::logits_scratch_bytes;

/// What one request runs: the processor's image size, the prompt's token count, the beams, the
/// decoder positions and the cache precision.
#[derive(Clone, Copy, Debug)]
pub struct Request {
    /// (height, width) of the processor's pixels.
    pub image: (usize, usize),
    /// Prompt tokens (the task marker and its text, `<s>` and `</s>`).
    pub prompt_tokens: usize,
    pub beams: usize,
    /// Decoder positions the caches hold (`max_length - 1`, at least 1).
    pub cache_len: usize,
    /// Element type of the KV caches and cross K/V.
    pub kv_dtype: DType,
    /// The device's storage-binding limit (chunks the arena's MLP and im2col).
    pub max_binding: u64,
    /// The CPU backend.
    pub host: bool,
}

/// Activation bytes per phase, and the largest single activation buffer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseBytes {
    pub vision: u64,
    pub encoder: u64,
    pub decode: u64,
    pub largest: u64,
}

impl PhaseBytes {
    /// The largest phase.
    pub fn peak(&self) -> u64 {
        self.vision.max(self.encoder).max(self.decode)
    }
}

/// Buffers counted as allocated.
#[derive(Default)]
struct Tally {
    total: u64,
    largest: u64,
}

impl Tally {
    fn add(&mut self, dtype: DType, shape: &[usize]) -> Result<()> {
        let b = dtype.buffer_bytes(shape)?;
        self.total += b;
        self.largest = self.largest.max(b);
        Ok(())
    }
}

/// The phases of `req` on a model of `cfg` whose tower is `tower`.
pub fn phase_bytes(cfg: &Florence2Config, tower: &TowerShape, req: &Request) -> Result<PhaseBytes> {
    let t = &cfg.text;
    let d = t.d_model;
    let grids = tower.stage_grids(req.image.0, req.image.1)?;
    let grid = grids.last().copied().unwrap_or((0, 0));
    let n_img = image_tokens(cfg, grid);
    let features = [1, n_img, d];

    let vision = vision_tally(tower, req, &features)?;

    // Cross-attention K/V of every decoder layer, (1, S, D) each.
    let s = n_img + req.prompt_tokens;
    let mut cross = Tally::default();
    for _ in 0..2 * t.decoder_layers {
        cross.add(req.kv_dtype, &[1, s, d])?;
    }

    let enc = encoder_tally(cfg, req, &features, s)?;
    let dec = decode_tally(cfg, req, &features)?;

    Ok(PhaseBytes {
        vision: vision.total,
        encoder: enc.total + cross.total,
        decode: dec.total + cross.total,
        largest: vision
            .largest
            .max(enc.largest)
            .max(dec.largest)
            .max(cross.largest),
    })
}

/// Vision: the arena's buffers (as `DaVit::forward_spare` allocates them) and the features `(1, N, D)`.
fn vision_tally(tower: &TowerShape, req: &Request, features: &[usize; 3]) -> Result<Tally> {
    let plan = tower.arena_plan(req.max_binding, 1, req.image)?;
    let mut vision = Tally::default();
    vision.add(DType::F32, &[plan.stream])?;
    vision.add(DType::F32, &[plan.stream])?;
    if plan.windows > 0 {
        vision.add(DType::F32, &[plan.windows])?;
    }
    vision.add(DType::F32, &[plan.big.max(1)])?;
    if plan.split > 0 {
        for _ in 0..3 {
            vision.add(DType::F32, &[plan.split])?;
        }
    }
    if plan.partials > 0 {
        vision.add(DType::F32, &[plan.partials])?;
    }
    // After the arena, the larger of what channel attention allocates while a block is recorded and
    // the projector's output (the features).
    let mut channel = 0;
    for st in &tower.stages {
        let d = st.embed_dim / st.groups.max(1);
        channel = channel.max(logits_scratch_bytes(1, st.groups, d, req.host)?);
    }
    let features_bytes = DType::F32.buffer_bytes(features)?;
    vision.total += channel.max(features_bytes);
    vision.largest = vision.largest.max(features_bytes);
    Ok(vision)
}

/// Encoder: the features, the prompt's ids and embedding, the encoder input `(S, D)` and scratch, and
/// the f32 staging of f16 cross K/V (the cross K/V itself is counted apart).
fn encoder_tally(
    cfg: &Florence2Config,
    req: &Request,
    features: &[usize; 3],
    s: usize,
) -> Result<Tally> {
    let t = &cfg.text;
    let d = t.d_model;
    let mut enc = Tally::default();
    enc.add(DType::F32, features)?;
    enc.add(DType::U32, &[req.prompt_tokens])?;
    enc.add(DType::F32, &[req.prompt_tokens, d])?;
    enc.add(DType::F32, &[s, d])?;
    for _ in 0..6 {
        enc.add(DType::F32, &[s, d])?;
    }
    enc.add(DType::F32, &[s, t.encoder_ffn_dim])?;
    if req.kv_dtype != DType::F32 {
        enc.add(DType::F32, &[s, d])?;
    }
    Ok(enc)
}

/// Decode: an encoded image's features (held when the image is reused), the decoder state, and the
/// generation's buffers (beam search: log-probs and top-k; greedy: top-k). The cross K/V is counted
/// apart.
fn decode_tally(cfg: &Florence2Config, req: &Request, features: &[usize; 3]) -> Result<Tally> {
    let t = &cfg.text;
    let d = t.d_model;
    let b = req.beams.max(1);
    let mut dec = Tally::default();
    dec.add(DType::F32, features)?;
    dec.total += Decoder::state_bytes(t, b, req.cache_len, req.kv_dtype, b > 1)?;
    // The state's largest buffers: one KV cache, the logits.
    dec.largest = dec
        .largest
        .max(req.kv_dtype.buffer_bytes(&[b, req.cache_len, d])?)
        .max(DType::F32.buffer_bytes(&[b, t.vocab_size])?);
    let k = TOPK_MAX.min(t.vocab_size);
    if b > 1 {
        dec.add(DType::F32, &[b, t.vocab_size])?;
        dec.add(DType::F32, &[b, k])?;
        dec.add(DType::U32, &[b, k])?;
    } else {
        dec.add(DType::U32, &[1])?;
        dec.add(DType::F32, &[1, TOPK_MAX])?;
        dec.add(DType::U32, &[1, TOPK_MAX])?;
    }
    Ok(dec)
}
