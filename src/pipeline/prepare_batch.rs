//! Several tasks prepared together on encoded images: prompts of one encoder length run the BART
//! encoder as one batch ([`Pipeline::prepare_batch`]).

use std::collections::BTreeMap;

use crate::error::Result;
use crate::gpu::Tensor;
use crate::model::bart::CrossKv;
use crate::pipeline::clock::Stopwatch;
use crate::pipeline::image::{EncodedImage, TaskInput};
use crate::pipeline::observe::Callbacks;
use crate::pipeline::options::TaskOptions;
use crate::pipeline::run::{Prepared, TaskMeta};
use crate::pipeline::{NeverCancel, Pipeline};
use crate::processor::custom_tasks::AnyTaskPrompt;

/// One task of [`Pipeline::prepare_batch`]: its encoded image, prompt and options.
pub struct PrepareItem<'a> {
    pub image: &'a EncodedImage,
    pub prompt: AnyTaskPrompt,
    pub options: TaskOptions,
}

/// A task checked and tokenized, waiting for its encoder batch.
struct Staged<'a> {
    item: &'a PrepareItem<'a>,
    meta: TaskMeta,
    len: usize,
}

impl Pipeline {
    /// [`Pipeline::prepare`] for several tasks on encoded images. Tasks whose encoder sequences have one
    /// length ([`crate::model::florence2::Florence2::encoder_len`]) run the encoder and their
    /// cross-attention projections as one batch, each request's kernels chosen for its own rows, so each
    /// result equals its own [`Pipeline::prepare`] bit for bit; the others run alone. A task that cannot
    /// be prepared (options, prompt, an image of another model) fails alone; a batch the device refuses
    /// is retried one task at a time, so an error is always the task's own. `encoder_ms` is a task's
    /// share of its batch.
    pub fn prepare_batch(&self, items: &[PrepareItem<'_>]) -> Vec<Result<Prepared>> {
        let mut out: Vec<Option<Result<Prepared>>> = (0..items.len()).map(|_| None).collect();
        let mut groups: BTreeMap<usize, Vec<(usize, Staged)>> = BTreeMap::new();
        for (i, item) in items.iter().enumerate() {
            match self.stage(item) {
                Ok(s) => groups.entry(s.len).or_default().push((i, s)),
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        for group in groups.into_values() {
            let batched = (group.len() >= 2)
                .then(|| self.encode_group(&group).ok())
                .flatten();
            match batched {
                Some((crosses, ms)) => {
                    for ((i, s), cross) in group.into_iter().zip(crosses) {
                        let meta = s.meta.with_encoder_ms(ms);
                        out[i] = Some(Ok(Prepared { meta, cross }));
                    }
                }
                None => {
                    for (i, s) in group {
                        out[i] = Some(self.prepare_alone(s.item));
                    }
                }
            }
        }
        out.into_iter()
            .map(|p| {
                p.unwrap_or_else(|| Err(crate::Error::shape("prepare_batch", "a task left out")))
            })
            .collect()
    }

    /// Options resolved, prompt tokenized, image checked: everything before the GPU.
    fn stage<'a>(&self, item: &'a PrepareItem<'a>) -> Result<Staged<'a>> {
        let gen = item.options.resolve(&self.generation)?;
        let t = Stopwatch::start();
        let ids = self.tokenizer.encode_prompt(&item.prompt.encoder_text())?;
        let tokenize_ms = t.ms();
        let image = self.owned(item.image)?;
        let len = self.model.encoder_len(image.tokens(), &ids);
        let meta = TaskMeta::encoded(item.prompt.clone(), ids, gen, image, tokenize_ms);
        Ok(Staged { item, meta, len })
    }

    fn prepare_alone(&self, item: &PrepareItem<'_>) -> Result<Prepared> {
        pollster::block_on(self.prepare(
            TaskInput::Encoded(item.image),
            item.prompt.clone(),
            &item.options,
            &NeverCancel,
            &Callbacks::default(),
        ))
    }

    /// One encoder batch for tasks of one sequence length: each task's cross-attention K/V, and each
    /// task's share of the batch's time (ms).
    fn encode_group(&self, group: &[(usize, Staged<'_>)]) -> Result<(Vec<CrossKv>, f64)> {
        let gpu = self.model.gpu();
        gpu.check()?;
        let pairs: Vec<(&Tensor, &[u32])> = group
            .iter()
            .map(|(_, s)| (&s.item.image.features, s.meta.ids()))
            .collect();
        let t = Stopwatch::start();
        let encoded = self.model.encode_prompts(&pairs)?;
        let ms = pollster::block_on(t.ms_after_gpu(gpu))? / group.len() as f64;
        Ok((encoded.into_iter().map(|e| e.cross).collect(), ms))
    }
}
