//! Greedy decoding with the reference's logits processors, one submit and a few bytes of readback per
//! step.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gpu::{staging_buffer, DType, Gpu, Plan, Recorder, Staging, Tensor};
use crate::model::bart::{CrossKv, Decoder};
use crate::model::generate::processors::{argmax_allowed, pick, NextToken};
use crate::model::generate::{GenerateOptions, TOPK_MAX};
use crate::ops;

/// Greedy decoding from `opts.decoder_start_token_id` against one image's cross-attention K/V. Returns
/// the sequence with the start token first (as the reference's `generate` does), ending at an EOS id or
/// at `max_length`. `cancel` is polled before every step.
pub async fn greedy(
    decoder: &Decoder,
    gpu: &Arc<Gpu>,
    cross: &CrossKv,
    opts: &GenerateOptions,
    cancel: &dyn Fn() -> bool,
) -> Result<Vec<u32>> {
    greedy_observed(decoder, gpu, cross, opts, cancel, &|_| {}).await
}

/// [`greedy`], calling `on_token` with each token as it is appended (the start token excluded).
pub async fn greedy_observed(
    decoder: &Decoder,
    gpu: &Arc<Gpu>,
    cross: &CrossKv,
    opts: &GenerateOptions,
    cancel: &dyn Fn() -> bool,
    on_token: &dyn Fn(u32),
) -> Result<Vec<u32>> {
    let max_length = opts.max_length(decoder.max_positions());
    let procs = opts.processors(decoder.max_positions());
    let mut seq = vec![opts.decoder_start_token_id];
    if max_length <= 1 {
        return Ok(seq);
    }
    let vocab = decoder.vocab_size();
    opts.check_fed_ids(vocab)?;
    // Positions fed to the decoder: 0 ..= max_length - 2 (the last token is never fed back).
    let mut state = decoder.new_state(gpu, cross, 1, max_length - 1)?;
    let mut picker = Picker::new(gpu, vocab)?;
    while seq.len() < max_length {
        if cancel() {
            return Err(Error::Cancelled);
        }
        let rule = procs.rule(&seq);
        let last = *seq.last().unwrap_or(&opts.decoder_start_token_id);
        if let NextToken::Forced(t) = rule {
            // The final token needs no decoder run at all.
            if seq.len() + 1 == max_length || opts.eos_token_ids.contains(&t) {
                seq.push(t);
                on_token(t);
                break;
            }
        }
        state.write_tokens(&[last])?;
        let pos = (seq.len() - 1) as u32;
        let mut rec = Recorder::new(gpu);
        rec.set_phase("decode");
        let logits = decoder.step_planned(&mut rec, pos, &mut state)?; // (1, V)
        let next = picker.next(rec, &logits, &rule).await?;
        seq.push(next);
        on_token(next);
        if opts.eos_token_ids.contains(&next) {
            break;
        }
    }
    Ok(seq)
}

/// The next greedy token from a step's logits under the processors' rule, with the device buffers,
/// readback staging and recorded plans allocated once: nothing is allocated on the GPU per token.
struct Picker {
    gpu: Arc<Gpu>,
    vocab: usize,
    ids: Tensor,     // (1)
    tk_vals: Tensor, // (1, TOPK_MAX)
    tk_ids: Tensor,  // (1, TOPK_MAX)
    st_ids: Staging,
    st_topk: Staging,
    st_logits: Option<Staging>,
    // The argmax / top-k after the step are recorded once and replayed every step.
    plan_argmax: Option<Plan>,
    plan_topk: Option<Plan>,
}

impl Picker {
    fn new(gpu: &Arc<Gpu>, vocab: usize) -> Result<Self> {
        let ids = Tensor::zeros(gpu, &[1], DType::U32, "greedy.argmax")?;
        let tk_vals = Tensor::zeros(gpu, &[1, TOPK_MAX], DType::F32, "greedy.topk.vals")?;
        let tk_ids = Tensor::zeros(gpu, &[1, TOPK_MAX], DType::U32, "greedy.topk.ids")?;
        Ok(Picker {
            gpu: gpu.clone(),
            vocab,
            st_ids: staging_buffer(gpu, ids.byte_size()),
            st_topk: staging_buffer(gpu, tk_ids.byte_size()),
            st_logits: None,
            ids,
            tk_vals,
            tk_ids,
            plan_argmax: None,
            plan_topk: None,
        })
    }

    /// Finish `rec` (holding the step that wrote `logits`, (1, V)) with what `rule` needs, submit it
    /// and return the chosen token.
    async fn next(&mut self, mut rec: Recorder, logits: &Tensor, rule: &NextToken) -> Result<u32> {
        let gpu = &self.gpu;
        match rule {
            NextToken::Forced(t) => {
                rec.submit()?;
                Ok(*t)
            }
            NextToken::Banned(b) if b.is_empty() => {
                let ids = &self.ids;
                rec.replay_cached(&mut self.plan_argmax, |rec| {
                    ops::reduce::argmax_rows(rec, logits, ids) // (1)
                })?;
                let p = rec.read_back_into(&self.ids, &self.st_ids)?;
                rec.submit()?;
                let got = p.u32s(gpu).await?;
                got.first()
                    .copied()
                    .ok_or_else(|| Error::Readback("empty argmax".into()))
            }
            NextToken::Banned(b) if b.len() < TOPK_MAX && self.vocab >= TOPK_MAX => {
                // The best allowed token is among the top bans + 1; a fixed k keeps one kernel.
                let (vals, ids) = (&self.tk_vals, &self.tk_ids);
                rec.replay_cached(&mut self.plan_topk, |rec| {
                    ops::reduce::topk_rows(rec, logits, TOPK_MAX, vals, ids) // (1, 16)
                })?;
                let p = rec.read_back_into(&self.tk_ids, &self.st_topk)?;
                rec.submit()?;
                let got = p.u32s(gpu).await?;
                let cands: Vec<(u32, f32)> = got.iter().map(|&i| (i, 0.0)).collect();
                pick(&cands, rule)
                    .ok_or_else(|| Error::Readback("top-k returned only banned tokens".into()))
            }
            NextToken::Banned(_) => {
                let st = self
                    .st_logits
                    .get_or_insert_with(|| staging_buffer(gpu, logits.byte_size()));
                let p = rec.read_back_into(logits, st)?;
                rec.submit()?;
                let row = p.f32s(gpu).await?;
                argmax_allowed(row.get(..self.vocab).unwrap_or(&row), rule).ok_or_else(|| {
                    Error::shape("generate", "every token is banned by no_repeat_ngram_size")
                })
            }
        }
    }
}
