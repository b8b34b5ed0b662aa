//! The one sequence: image -> pixels -> DaViT + projector ([`Pipeline::encode_image`]), then prompt ->
//! ids -> encoder -> decoder -> ids -> text -> answer ([`Pipeline::run_task`]).

use crate::error::{Error, Result};
#[cfg(not(target_arch = "wasm32"))]
use crate::gpu::{Recorder, Tensor};
use crate::model::bart::CrossKv;
use crate::model::florence2::EncoderOutput;
use crate::model::generate::{GenerateOptions, Observer};
use crate::pipeline::cancel::Cancel;
use crate::pipeline::clock::Stopwatch;
use crate::pipeline::image::{EncodedImage, Image, TaskInput};
use crate::pipeline::observe::{Callbacks, Stage, TokenStreamer};
use crate::pipeline::options::TaskOptions;
use crate::pipeline::output::{finish, TaskOutput, Timings, Usage};
use crate::pipeline::Pipeline;
use crate::processor::custom_tasks::AnyTaskPrompt;

impl Pipeline {
    /// Encode an image once: pixels, then DaViT + projector, the projected features kept on the GPU.
    /// Every task run on the result skips those stages and gives exactly the answer it gives on the
    /// image itself.
    /// Natively the work is waited for; in the browser use [`Pipeline::encode_image_async`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn encode_image(&self, image: Image<'_>) -> Result<EncodedImage> {
        pollster::block_on(self.encode_image_async(image))
    }

    /// [`Pipeline::encode_image`] for several images: the vision tower and projector run on them as
    /// one batch when the tower runs whole at that batch
    /// ([`crate::model::florence2::Florence2::can_batch_images`]), else one by
    /// one. Each encoding equals, bit for bit, [`Pipeline::encode_image`] of its image (kernels are
    /// chosen per image). An image that cannot be read fails alone. Its preprocess and vision times are
    /// its share of the batch's.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn encode_images(&self, images: &[Image<'_>]) -> Vec<Result<EncodedImage>> {
        let pre = &self.processor;
        let t = Stopwatch::start();
        let pixels: Vec<_> = images.iter().map(|i| i.pixels(pre, &self.limits)).collect();
        let ok: Vec<usize> = (0..pixels.len()).filter(|&i| pixels[i].is_ok()).collect();
        let preprocess_ms = t.ms() / images.len().max(1) as f64;
        let (h, w) = (pre.height, pre.width);
        let b = ok.len();
        let batched = if b >= 2 && self.model.can_batch_images(b, h, w) {
            let values: Vec<f32> = ok
                .iter()
                .filter_map(|&i| pixels[i].as_ref().ok())
                .flat_map(|p| p.values.iter().copied())
                .collect();
            let t = Stopwatch::start();
            let features = self.split_features(&values, [b, 3, h, w]);
            let vision_ms =
                pollster::block_on(t.ms_after_gpu(self.model.gpu())).map(|ms| ms / b as f64);
            Some(features.and_then(|f| vision_ms.map(|ms| (f, ms))))
        } else {
            None
        };
        let mut batched = match batched {
            None => None,
            Some(Ok((f, ms))) => Some((f.into_iter(), ms)),
            Some(Err(e)) => {
                let msg = e.to_string();
                return pixels
                    .into_iter()
                    .map(|p| p.and_then(|_| Err(crate::Error::Gpu(msg.clone()))))
                    .collect();
            }
        };
        pixels
            .into_iter()
            .map(|px| {
                let px = px?;
                let (features, vision_ms) = match &mut batched {
                    Some((features, vision_ms)) => {
                        let f = features.next().ok_or_else(|| {
                            crate::Error::shape("encode_images", "a missing image")
                        })?;
                        (f, *vision_ms)
                    }
                    None => {
                        // One by one, on the pixels made above.
                        let t = Stopwatch::start();
                        let f = self.model.encode_pixels(&px.values, [1, 3, h, w])?; // (1, N, D)
                        (f, pollster::block_on(t.ms_after_gpu(self.model.gpu()))?)
                    }
                };
                Ok(EncodedImage {
                    features,
                    image_size: px.size,
                    owner: self.id,
                    preprocess_ms,
                    vision_ms,
                })
            })
            .collect()
    }

    /// The tower + projector on B images' pixels (B, 3, H, W), split into B (1, 1+N, D) features.
    #[cfg(not(target_arch = "wasm32"))]
    fn split_features(&self, values: &[f32], shape: [usize; 4]) -> Result<Vec<Tensor>> {
        let all = self.model.encode_pixels_batch(values, shape)?; // (B, 1+N, D)
        let (b, n, d) = (all.dim(0), all.dim(1), all.dim(2));
        let gpu = self.model.gpu();
        let mut rec = Recorder::new(gpu);
        let dtype = all.dtype();
        let bytes = dtype.buffer_bytes(&[n, d])?;
        let out = (0..b)
            .map(|i| {
                let t = Tensor::zeros(gpu, &[1, n, d], dtype, "image features")?;
                rec.copy_range(&all, i as u64 * bytes, &t, 0, bytes)?;
                Ok(t)
            })
            .collect::<Result<Vec<_>>>()?;
        rec.submit()?;
        Ok(out)
    }

    /// [`Pipeline::encode_image`], awaiting the GPU (the browser's event loop keeps running).
    pub async fn encode_image_async(&self, image: Image<'_>) -> Result<EncodedImage> {
        self.encode_image_with(image, &|| false, &Callbacks::default())
            .await
    }

    async fn encode_image_with(
        &self,
        image: Image<'_>,
        cancel: &dyn Cancel,
        cb: &Callbacks<'_>,
    ) -> Result<EncodedImage> {
        let gpu = self.model.gpu();
        gpu.check()?;
        cb.stage(Stage::Preprocess);
        let t = Stopwatch::start();
        let pre = &self.processor;
        let px = image.pixels(pre, &self.limits)?;
        let preprocess_ms = t.ms();
        check(cancel)?;

        cb.stage(Stage::Vision);
        let t = Stopwatch::start();
        // The pixels go from the CPU straight into the vision tower's arena: no pixel tensor is held
        // beside it.
        let features = self
            .model
            .encode_pixels(&px.values, [1, 3, pre.height, pre.width])?; // (1, N, D)
        drop(px.values);
        let vision_ms = t.ms_after_gpu(gpu).await?;
        Ok(EncodedImage {
            features,
            image_size: px.size,
            owner: self.id,
            preprocess_ms,
            vision_ms,
        })
    }

    /// Run one task (`prompt`: a task marker plus its input, e.g. `<OD>` or
    /// `<CAPTION_TO_PHRASE_GROUNDING>two cats`) on an image or an [`EncodedImage`]. `options` override
    /// the pipeline's generation defaults; `cancel` is asked before each GPU stage and before every decode
    /// step (a cancelled task fails with [`Error::Cancelled`] and leaves the pipeline usable);
    /// `callbacks` report stages and tokens. Async because each decode step awaits its readback;
    /// natively [`Pipeline::run_task_blocking`] waits for it.
    pub async fn run_task(
        &self,
        input: TaskInput<'_>,
        prompt: &str,
        options: &TaskOptions,
        cancel: &dyn Cancel,
        callbacks: &Callbacks<'_>,
    ) -> Result<TaskOutput> {
        // A built-in task, or one of the model's own markers (see `Settings::tasks`).
        let tp = self.tasks.parse(prompt)?;
        self.run_prompt(input, tp, options, cancel, callbacks).await
    }

    /// [`Pipeline::run_task`] for a prompt parsed before (a front end that validates requests before
    /// they reach the model).
    pub async fn run_prompt(
        &self,
        input: TaskInput<'_>,
        tp: AnyTaskPrompt,
        options: &TaskOptions,
        cancel: &dyn Cancel,
        callbacks: &Callbacks<'_>,
    ) -> Result<TaskOutput> {
        let Prepared { meta, cross } = self.prepare(input, tp, options, cancel, callbacks).await?;
        callbacks.stage(Stage::Decode);
        let t = Stopwatch::start();
        let token_ids = self.decode(cross, &meta.gen, cancel, callbacks).await?;
        let decode_ms = t.ms_after_gpu(self.model.gpu()).await?;
        self.finish_task(meta, token_ids, decode_ms, callbacks)
    }

    /// Everything of a task before decoding: the prompt tokenized, the image encoded (unless it was),
    /// the encoder run and its cross-attention K/V projected. Decode the result alone
    /// ([`Pipeline::run_prompt`] does) or beside other tasks ([`crate::pipeline::DecodeBatch`]).
    pub async fn prepare(
        &self,
        input: TaskInput<'_>,
        tp: AnyTaskPrompt,
        options: &TaskOptions,
        cancel: &dyn Cancel,
        callbacks: &Callbacks<'_>,
    ) -> Result<Prepared> {
        // Everything that can be refused without the GPU, first.
        let gen = options.resolve(&self.generation)?;
        check(cancel)?;

        let t = Stopwatch::start();
        let ids = self.tokenizer.encode_prompt(&tp.encoder_text())?;
        let tokenize_ms = t.ms();
        let mut fresh = None;
        let (image, reused) = match input {
            TaskInput::Image(img) => (
                &*fresh.insert(self.encode_image_with(img, cancel, callbacks).await?),
                false,
            ),
            TaskInput::Encoded(e) => (self.owned(e)?, true),
        };
        let (image_size, image_preprocess_ms, image_vision_ms) =
            (image.image_size, image.preprocess_ms, image.vision_ms);
        let image_tokens = image.tokens();
        check(cancel)?;
        let gpu = self.model.gpu();
        gpu.check()?;

        callbacks.stage(Stage::Encoder);
        let t = Stopwatch::start();
        let enc = self.model.encode_prompt(&image.features, &ids)?; // (1, S, D) + cross K/V
        let encoder_ms = t.ms_after_gpu(gpu).await?;
        // Image features encoded for this task only are dead once the encoder has read them; the
        // decoder reads only the cross-attention K/V, so the encoder's input and output (2 x (1, S, D))
        // are released before any KV cache is allocated.
        drop(fresh);
        let EncoderOutput { cross, .. } = enc;
        let (preprocess_ms, vision_ms) = if reused {
            (tokenize_ms, 0.0)
        } else {
            (image_preprocess_ms + tokenize_ms, image_vision_ms)
        };
        Ok(Prepared {
            meta: TaskMeta {
                tp,
                ids,
                gen,
                image_size,
                image_tokens,
                reused,
                preprocess_ms,
                vision_ms,
                encoder_ms,
            },
            cross,
        })
    }

    /// The task's answer from its generated ids (start token first): decoded, post-processed, with the
    /// stage timings (`decode_ms` measured by the caller).
    pub(crate) fn finish_task(
        &self,
        meta: TaskMeta,
        token_ids: Vec<u32>,
        decode_ms: f64,
        callbacks: &Callbacks<'_>,
    ) -> Result<TaskOutput> {
        callbacks.stage(Stage::Postprocess);
        let t = Stopwatch::start();
        let generated_text = self.tokenizer.decode(&token_ids, false)?;
        let (task, marker) = (meta.tp.answer_task(), meta.tp.marker().to_owned());
        let (result, text) = finish(task, &generated_text, meta.image_size)?;
        let postprocess_ms = t.ms();
        let usage = Usage::of(
            &meta.ids,
            meta.image_tokens,
            &token_ids,
            &meta.gen.eos_token_ids,
        );
        Ok(TaskOutput {
            task,
            marker,
            prompt: meta.tp,
            result,
            text,
            generated_text,
            token_ids,
            usage,
            image_size: meta.image_size,
            reused_image: meta.reused,
            timings: Timings {
                preprocess_ms: meta.preprocess_ms,
                vision_ms: meta.vision_ms,
                encoder_ms: meta.encoder_ms,
                decode_ms,
                postprocess_ms,
            },
            memory: self.model.gpu().memory(),
        })
    }

    /// `e`, when this pipeline made it.
    pub(crate) fn owned<'e>(&self, e: &'e EncodedImage) -> Result<&'e EncodedImage> {
        if e.owner != self.id {
            return Err(Error::InvalidInput(
                "this EncodedImage was made by another model".into(),
            ));
        }
        Ok(e)
    }

    /// The decode stage: token ids from the cross-attention K/V, streamed through
    /// `callbacks.on_token`, `cancel` asked before every step.
    async fn decode(
        &self,
        cross: CrossKv,
        gen: &GenerateOptions,
        cancel: &dyn Cancel,
        callbacks: &Callbacks<'_>,
    ) -> Result<Vec<u32>> {
        let streamer = TokenStreamer::new(&self.tokenizer, callbacks.on_token);
        let stop = || cancel.is_cancelled();
        let push = |id| streamer.push(id);
        let obs = Observer {
            cancel: &stop,
            on_token: &push,
        };
        let token_ids = self.model.generate(&cross, gen, obs).await?;
        drop(cross);
        Ok(token_ids)
    }

    /// [`Pipeline::run_task`], blocking the calling thread until it is done (native; from an async
    /// server, call it inside `spawn_blocking`).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn run_task_blocking(
        &self,
        input: TaskInput<'_>,
        prompt: &str,
        options: &TaskOptions,
        cancel: &dyn Cancel,
        callbacks: &Callbacks<'_>,
    ) -> Result<TaskOutput> {
        pollster::block_on(self.run_task(input, prompt, options, cancel, callbacks))
    }
}

fn check(cancel: &dyn Cancel) -> Result<()> {
    if cancel.is_cancelled() {
        Err(Error::Cancelled)
    } else {
        Ok(())
    }
}

/// A task ready to decode ([`Pipeline::prepare`]): its cross-attention K/V on the GPU and what its answer
/// needs afterwards.
pub struct Prepared {
    pub(crate) meta: TaskMeta,
    pub(crate) cross: CrossKv,
}

impl Prepared {
    /// The generation settings the task resolved (its beams, its token limit).
    pub fn generation(&self) -> &GenerateOptions {
        &self.meta.gen
    }

    /// The cross-attention K/V the decoder reads.
    pub fn cross(&self) -> &CrossKv {
        &self.cross
    }
}

/// What a task's answer needs besides its ids.
pub(crate) struct TaskMeta {
    tp: AnyTaskPrompt,
    ids: Vec<u32>,
    pub(crate) gen: GenerateOptions,
    image_size: (u32, u32),
    image_tokens: usize,
    reused: bool,
    preprocess_ms: f64,
    vision_ms: f64,
    encoder_ms: f64,
}

impl TaskMeta {
    /// A task on an image encoded before (no image stages of its own); `encoder_ms` is set later.
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn encoded(
        tp: AnyTaskPrompt,
        ids: Vec<u32>,
        gen: GenerateOptions,
        image: &EncodedImage,
        tokenize_ms: f64,
    ) -> TaskMeta {
        TaskMeta {
            tp,
            ids,
            gen,
            image_size: image.image_size,
            image_tokens: image.tokens(),
            reused: true,
            preprocess_ms: tokenize_ms,
            vision_ms: 0.0,
            encoder_ms: 0.0,
        }
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn ids(&self) -> &[u32] {
        &self.ids
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn with_encoder_ms(self, encoder_ms: f64) -> TaskMeta {
        TaskMeta { encoder_ms, ..self }
    }
}
