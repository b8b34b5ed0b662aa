//! The assembled Florence-2: DaViT -> projector -> [image features ++ embedded prompt] -> BART encoder ->
//! decoder with greedy decoding.
//!
//! GPU work is recorded per stage: one submit for vision + projector, one for the prompt embedding +
//! encoder + the cross-attention K/V of every decoder layer, then one per decode step.

use std::sync::Arc;

use crate::config::Florence2Config;
use crate::error::{Error, Result};
use crate::gpu::{DType, Device, Recorder, Tensor};
use crate::model::bart::{CrossKv, Decoder, Encoder};
use crate::model::davit::{DaVit, PixelSource, VisionOut};
use crate::model::generate::{self, GenerateOptions, Observer};
use crate::model::projector::Projector;
use crate::ops;
use crate::weights::{Weights, FINAL_LOGITS_BIAS};

/// Canonical names of the tied embedding and LM head.
pub use crate::weights::expected::{LM_HEAD, SHARED};

/// The model on the GPU.
pub struct Florence2 {
    pub config: Florence2Config,
    gpu: Arc<Device>,
    pub vision: DaVit,
    pub projector: Projector,
    pub encoder: Encoder,
    pub decoder: Decoder,
    /// The shared token embedding (V, D).
    pub shared: Tensor,
}

/// One image + prompt, encoded: everything generation needs, resident on the GPU.
#[derive(Clone, Debug)]
pub struct EncoderOutput {
    /// (1, S, D) the encoder input ([image features ++ embedded prompt]).
    pub inputs_embeds: Tensor,
    /// (1, S, D) the encoder output.
    pub hidden: Tensor,
    /// Cross-attention K/V of every decoder layer, projected once.
    pub cross: CrossKv,
    /// Image feature tokens at the front of the sequence (577 for a 768x768 base model).
    pub image_tokens: usize,
}

impl Florence2 {
    /// Assemble the model from loaded weights (canonical HF-native names).
    pub fn new(gpu: &Arc<Device>, config: Florence2Config, weights: &Weights) -> Result<Self> {
        let t = &config.text;
        let (v, d) = (t.vocab_size, t.d_model);
        let shared = weights.get(SHARED, &[v, d])?;
        let lm_head = if weights.has(LM_HEAD) {
            weights.get(LM_HEAD, &[v, d])?
        } else {
            shared.clone()
        };
        let flb = if weights.has(FINAL_LOGITS_BIAS) {
            Some(weights.get_any(FINAL_LOGITS_BIAS)?)
        } else {
            None
        };
        let lm = weights.pp("model").pp("language_model");
        let mut vision = DaVit::new(&config.vision, weights.pp("model").pp("vision_tower"))?;
        // Convolution weights in their kernels' layouts, once (the checkpoint-layout tensors go with
        // `weights`).
        let mut rec = Recorder::new(gpu);
        vision.prepare(&mut rec)?;
        rec.submit()?;
        let projector = Projector::new(&config, weights.pp("model").pp("multi_modal_projector"))?;
        let encoder = Encoder::new(t, lm.pp("encoder"))?;
        let decoder = Decoder::new(t, lm.pp("decoder"), shared.clone(), lm_head, flb)?;
        Ok(Florence2 {
            config,
            gpu: gpu.clone(),
            vision,
            projector,
            encoder,
            decoder,
            shared,
        })
    }

    pub fn gpu(&self) -> &Arc<Device> {
        &self.gpu
    }

    /// Vision tower + projector on `pixels` (1, 3, H, W), one submit: the projected image features
    /// (1, N, D) that [`Florence2::encode_prompt`] puts in front of (or in place of) the prompt. They
    /// depend on the image only, so one result serves any number of prompts.
    pub fn encode_image(&self, pixels: &Tensor) -> Result<Tensor> {
        let mut rec = Recorder::new(&self.gpu);
        rec.set_phase("vision");
        let shape = [pixels.dim(0), pixels.dim(1), pixels.dim(2), pixels.dim(3)];
        let out = self
            .vision
            .forward_spare(&mut rec, PixelSource::Gpu(pixels), shape, None)?; // (1, N, C)
        self.project(rec, out)
    }

    /// [`Florence2::encode_image`] on the processor's pixel values (1, 3, H, W) NCHW on the CPU
    /// (`shape`): uploaded straight into the vision tower's activation arena
    /// ([`DaVit::forward_host`](crate::model::davit::DaVit::forward_host)), so the vision phase holds
    /// no pixel tensor (7.1 MB at 768 px) beside it. Same values as on a tensor of them.
    pub fn encode_pixels(&self, values: &[f32], shape: [usize; 4]) -> Result<Tensor> {
        let mut rec = Recorder::new(&self.gpu);
        rec.set_phase("vision");
        let out = self
            .vision
            .forward_spare(&mut rec, PixelSource::Host(values), shape, None)?; // (1, N, C)
        self.project(rec, out)
    }

    /// Whether [`Florence2::encode_pixels_batch`] can take `images` images of `height` x `width`: the
    /// tower's row chunks at that batch are exactly `images` times one image's
    /// ([`crate::model::davit_plan::TowerShape::batches_per_image`]).
    pub fn can_batch_images(&self, images: usize, height: usize, width: usize) -> bool {
        let max_binding = self.gpu.caps.max_storage_binding;
        self.vision
            .tower_shape()
            .and_then(|t| t.batches_per_image(max_binding, images, (height, width)))
            .unwrap_or(false)
    }

    /// [`Florence2::encode_pixels`] for B images at once: `values` (B, 3, H, W) NCHW on the CPU; returns
    /// the image features (B, 1+N, D), one submit. Each image's features equal, bit for bit, what
    /// [`Florence2::encode_pixels`] gives it alone: kernels are chosen per image
    /// ([`Recorder::set_images`]) and the tower's row chunks scale with the batch, which
    /// [`Florence2::can_batch_images`] must confirm (a named shape error otherwise).
    pub fn encode_pixels_batch(&self, values: &[f32], shape: [usize; 4]) -> Result<Tensor> {
        let [b, _, h, w] = shape;
        if !self.can_batch_images(b, h, w) {
            return Err(Error::shape(
                "encode_pixels_batch",
                format!("{b} images of {h}x{w} would split the vision tower unlike one image"),
            ));
        }
        let mut rec = Recorder::new(&self.gpu);
        rec.set_images(b);
        rec.set_phase("vision");
        let out = self
            .vision
            .forward_spare(&mut rec, PixelSource::Host(values), shape, None)?; // (B, N, C)
        self.project_batch(rec, out, shape[0])
    }

    /// The projector on the tower's output (its intermediates in the tower's arena buffers), then the
    /// one submit of the vision phase. The arena is released after the submit.
    fn project(&self, rec: Recorder, out: VisionOut) -> Result<Tensor> {
        self.project_batch(rec, out, 1)
    }

    fn project_batch(&self, mut rec: Recorder, out: VisionOut, batch: usize) -> Result<Tensor> {
        let d = self.config.text.d_model;
        // Scratch: the tower's two spare stream-sized buffers, then the one holding its output (dead
        // once the position embedding has read it, before the projector writes its third scratch).
        let mut scratch: Vec<Tensor> = out.spare.iter().take(2).cloned().collect();
        scratch.push(out.tokens.clone());
        let image =
            self.projector
                .forward_with_scratch(&mut rec, &out.tokens, out.grid, &scratch)?; // (1, 1+N, D)
        rec.submit()?;
        drop(out);
        if image.rank() != 3 || image.dim(0) != batch || image.dim(2) != d {
            return Err(Error::shape(
                "encode",
                format!(
                    "projector output {:?} is not ({batch}, N, {d})",
                    image.shape()
                ),
            ));
        }
        Ok(image)
    }

    /// [`Florence2::encode_image`] then [`Florence2::encode_prompt`].
    pub fn encode(&self, pixels: &Tensor, input_ids: &[u32]) -> Result<EncoderOutput> {
        let image = self.encode_image(pixels)?; // (1, N, D)
        self.encode_prompt(&image, input_ids)
    }

    /// Embed `input_ids`, combine them with the image features `image` (1, N, D) of
    /// [`Florence2::encode_image`], run the encoder and project every decoder layer's cross-attention
    /// K/V: one submit. `image` is only read.
    ///
    /// `input_ids` is the processor's prompt (`<s>` ... `</s>`). HF-native processors also put one
    /// `<image>` placeholder per image feature in it: then the features replace those placeholders (the
    /// reference's `masked_scatter`); without placeholders the features are prepended (the original
    /// model-card behaviour). Either way the encoder sees [image features ++ embedded prompt].
    pub fn encode_prompt(&self, image: &Tensor, input_ids: &[u32]) -> Result<EncoderOutput> {
        let mut rec = Recorder::new(&self.gpu);
        rec.set_phase("encoder");
        let inputs_embeds = self.prompt_embeds(&mut rec, image, input_ids)?; // (1, S, D)
        let hidden = self.encoder.forward(&mut rec, &inputs_embeds)?; // (1, S, D)
        let cross = self.decoder.cross_kv(&mut rec, &hidden)?; // per layer (1, S, D)
        rec.submit()?;
        Ok(EncoderOutput {
            inputs_embeds,
            hidden,
            cross,
            image_tokens: image.dim(1),
        })
    }

    /// The encoder's sequence length for `input_ids` with `image_tokens` image features (see
    /// [`Florence2::encode_prompt`]); prompts of one length can share an encoder batch
    /// ([`Florence2::encode_prompts`]).
    pub fn encoder_len(&self, image_tokens: usize, input_ids: &[u32]) -> usize {
        match self.config.image_token_id {
            Some(img) if input_ids.contains(&img) => input_ids.len(),
            _ => image_tokens + input_ids.len(),
        }
    }

    /// [`Florence2::encode_prompt`] for several (image features, prompt) pairs whose encoder sequences
    /// have one length ([`Florence2::encoder_len`]): the encoder runs them as one batch, each request's
    /// kernels chosen for its own rows, so each result equals its [`Florence2::encode_prompt`] bit for
    /// bit; one submit. Each request's hidden states and cross-attention K/V are its own buffers.
    pub fn encode_prompts(&self, items: &[(&Tensor, &[u32])]) -> Result<Vec<EncoderOutput>> {
        if let [(image, ids)] = items {
            return Ok(vec![self.encode_prompt(image, ids)?]);
        }
        let mut rec = Recorder::new(&self.gpu);
        rec.set_phase("encoder");
        let embeds = items
            .iter()
            .map(|(image, ids)| self.prompt_embeds(&mut rec, image, ids))
            .collect::<Result<Vec<_>>>()?; // B x (1, S, D)
        let hidden = self.encoder.forward_batch(&mut rec, &embeds)?; // (B, S, D)
        let crosses = self.decoder.cross_kv_batch(&mut rec, &hidden)?; // B x per layer (1, S, D)
        let (s, d) = (hidden.dim(1), hidden.dim(2));
        let bytes = (s * d * 4) as u64;
        let mut out = Vec::with_capacity(items.len());
        let each = embeds.into_iter().zip(items).zip(crosses);
        for (i, ((inputs_embeds, (image, _)), cross)) in each.enumerate() {
            let own = Tensor::zeros(&self.gpu, &[1, s, d], DType::F32, "encoder_out")?;
            rec.copy_range(&hidden, i as u64 * bytes, &own, 0, bytes)?;
            out.push(EncoderOutput {
                inputs_embeds,
                hidden: own,
                cross,
                image_tokens: image.dim(1),
            });
        }
        rec.submit()?;
        Ok(out)
    }

    /// Record the encoder input of one prompt: [image features ++ embedded prompt] (1, S, D).
    fn prompt_embeds(
        &self,
        rec: &mut Recorder,
        image: &Tensor,
        input_ids: &[u32],
    ) -> Result<Tensor> {
        let gpu = &self.gpu;
        let d = self.config.text.d_model;
        let (placeholders, seq) = self.prompt_layout(image, input_ids)?;
        let n_img = image.dim(1);
        let embeds = Tensor::zeros(gpu, &[seq, d], DType::F32, "inputs_embeds")?;
        let row = (d * 4) as u64;
        if !input_ids.is_empty() {
            let ids = Tensor::from_u32(gpu, &[input_ids.len()], input_ids, "input_ids")?;
            let text = Tensor::zeros(gpu, &[input_ids.len(), d], DType::F32, "prompt_embeds")?;
            ops::embedding::embedding(rec, &ids, &self.shared, &text)?; // (T, D)
            if self.config.text.scale_embedding {
                ops::elementwise::scale(rec, &text, (d as f32).sqrt(), &text)?;
                // (T, D)
            }
            let at = if placeholders.is_empty() { n_img } else { 0 };
            rec.copy_range(
                &text,
                0,
                &embeds,
                at as u64 * row,
                input_ids.len() as u64 * row,
            )?;
        }
        Self::place_image(rec, image, &embeds, &placeholders, row)?;
        embeds.reshape(&[1, seq, d])
    }

    /// Checks a prompt against the image features (1, N, D): the positions of its `<image>` placeholder
    /// tokens (none: the features go first) and the encoder sequence's length.
    fn prompt_layout(&self, image: &Tensor, input_ids: &[u32]) -> Result<(Vec<usize>, usize)> {
        let (v, d) = (self.config.text.vocab_size, self.config.text.d_model);
        if let Some(bad) = input_ids.iter().find(|&&i| i as usize >= v) {
            return Err(Error::InvalidInput(format!(
                "token id {bad} is outside the vocabulary of {v}"
            )));
        }
        if image.rank() != 3 || image.dim(0) != 1 || image.dim(2) != d {
            return Err(Error::shape(
                "encode",
                format!("image features {:?} are not (1, N, {d})", image.shape()),
            ));
        }
        let n_img = image.dim(1);
        let placeholders: Vec<usize> = match self.config.image_token_id {
            Some(img) => input_ids
                .iter()
                .enumerate()
                .filter(|(_, &t)| t == img)
                .map(|(i, _)| i)
                .collect(),
            None => Vec::new(),
        };
        let seq = if placeholders.is_empty() {
            n_img + input_ids.len()
        } else if placeholders.len() == n_img {
            input_ids.len()
        } else {
            return Err(Error::InvalidInput(format!(
                "{} <image> tokens in the prompt for {n_img} image features",
                placeholders.len()
            )));
        };
        if seq > self.encoder.max_len() {
            return Err(Error::InvalidInput(format!(
                "{seq} encoder tokens exceed max_position_embeddings {}",
                self.encoder.max_len()
            )));
        }
        Ok((placeholders, seq))
    }

    /// Copy the image feature rows into `embeds`: at the front, or onto the placeholder positions, one
    /// copy per contiguous run.
    fn place_image(
        rec: &mut Recorder,
        image: &Tensor,
        embeds: &Tensor,
        placeholders: &[usize],
        row: u64,
    ) -> Result<()> {
        let n_img = image.dim(1);
        if placeholders.is_empty() {
            rec.copy_range(image, 0, embeds, 0, n_img as u64 * row)?;
        } else {
            // Scatter feature rows onto the placeholder positions, one copy per contiguous run.
            let mut k = 0;
            while k < placeholders.len() {
                let mut run = 1;
                while k + run < placeholders.len() && placeholders[k + run] == placeholders[k] + run
                {
                    run += 1;
                }
                rec.copy_range(
                    image,
                    k as u64 * row,
                    embeds,
                    placeholders[k] as u64 * row,
                    run as u64 * row,
                )?;
                k += run;
            }
        }
        Ok(())
    }

    /// Default generation settings of this model (its config) with `max_new_tokens`.
    pub fn generate_options(&self, max_new_tokens: usize) -> GenerateOptions {
        GenerateOptions::from_config(&self.config, max_new_tokens)
    }

    /// The one generation entry: greedy (`num_beams` 1) or beam search as `opts` says, from the
    /// encoder's cross-attention K/V alone (all the decoder reads: a caller can release the encoder's
    /// input and output before decoding), observed by `obs` (cancellation, tokens). Async because every
    /// decode step awaits a few bytes of readback; natively, `pollster::block_on` it. Returns the ids
    /// with the decoder start token first.
    pub async fn generate(
        &self,
        cross: &CrossKv,
        opts: &GenerateOptions,
        obs: Observer<'_>,
    ) -> Result<Vec<u32>> {
        generate::generate(&self.decoder, &self.gpu, cross, opts, obs).await
    }
}
