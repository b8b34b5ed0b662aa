//! Greedy decoding with the reference's logits processors, one submit and a few bytes of readback per
//! step. [`GreedyJob`] is the decoding as steps a driver runs ([`crate::model::generate::DecodeJob`]):
//! [`crate::model::generate::greedy`] drives one job alone, a batch driver drives many through one decoder
//! step.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gpu::{staging_buffer, DType, Device, Pending, Plan, Recorder, Staging, Tensor};
use crate::model::bart::{CrossKv, Decoder, DecoderState};
use crate::model::generate::processors::{argmax_allowed, pick, NextToken, Processors};
use crate::model::generate::{Begin, GenerateOptions, TOPK_MAX};
use crate::ops;

/// One greedy decoding as steps: [`GreedyJob::begin`] (before the decoder step), the step,
/// [`GreedyJob::record_pick`] (after it, in the same submit), [`GreedyJob::resolve`] (after the submit).
pub struct GreedyJob {
    seq: Vec<u32>,
    max_length: usize,
    procs: Processors,
    eos: Vec<u32>,
    state: Option<DecoderState>,
    picker: Option<Picker>,
    /// The rule of the step in flight.
    rule: Option<NextToken>,
    pending: Option<Picked>,
    done: bool,
}

impl GreedyJob {
    /// Allocate the caches for `opts` (nothing when `max_length` leaves no step).
    pub fn new(
        decoder: &Decoder,
        gpu: &Arc<Device>,
        cross: &CrossKv,
        opts: &GenerateOptions,
    ) -> Result<Self> {
        let max_length = opts.max_length(decoder.max_positions());
        let mut job = GreedyJob {
            seq: vec![opts.decoder_start_token_id],
            max_length,
            procs: opts.processors(decoder.max_positions()),
            eos: opts.eos_token_ids.clone(),
            state: None,
            picker: None,
            rule: None,
            pending: None,
            done: max_length <= 1,
        };
        if !job.done {
            opts.check_fed_ids(decoder.vocab_size())?;
            // Positions fed to the decoder: 0 ..= max_length - 2 (the last token is never fed back).
            job.state = Some(decoder.new_state(gpu, cross, 1, max_length - 1)?);
            job.picker = Some(Picker::new(gpu, decoder.vocab_size())?);
        }
        Ok(job)
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The sequence so far, the start token first.
    pub fn ids(&self) -> &[u32] {
        &self.seq
    }

    pub fn state(&self) -> Option<&DecoderState> {
        self.state.as_ref()
    }

    pub fn state_mut(&mut self) -> Option<&mut DecoderState> {
        self.state.as_mut()
    }

    /// Prepare the next step: a forced final token ends the search with no decoder run
    /// ([`Begin::Skipped`]); otherwise the token and position go to the state ([`Begin::Run`]).
    pub fn begin(&mut self, new: &mut Vec<u32>) -> Result<Begin> {
        if self.done || self.seq.len() >= self.max_length {
            self.done = true;
            return Ok(Begin::Done);
        }
        let rule = self.procs.rule(&self.seq);
        if let NextToken::Forced(t) = rule {
            // The final token needs no decoder run at all.
            if self.seq.len() + 1 == self.max_length || self.eos.contains(&t) {
                self.push(t, new);
                return Ok(Begin::Skipped);
            }
        }
        let last = *self.seq.last().unwrap_or(&0);
        let pos = (self.seq.len() - 1) as u32;
        let state = self.state.as_ref().ok_or_else(no_state)?;
        state.write_tokens(&[last])?;
        state.write_step(pos)?;
        self.rule = Some(rule);
        Ok(Begin::Run(pos))
    }

    /// Record what the step's rule needs from its logits (argmax, top-k or the row) and its readback.
    pub fn record_pick(&mut self, rec: &mut Recorder) -> Result<()> {
        let (Some(state), Some(picker), Some(rule)) = (&self.state, &mut self.picker, &self.rule)
        else {
            return Err(no_state());
        };
        self.pending = Some(picker.record(rec, state.logits(), rule)?);
        Ok(())
    }

    /// After the submit: the chosen token, appended (and pushed to `new`).
    pub async fn resolve(&mut self, new: &mut Vec<u32>) -> Result<()> {
        let (Some(p), Some(picker), Some(rule)) =
            (self.pending.take(), &self.picker, self.rule.take())
        else {
            return Err(no_state());
        };
        let t = picker.resolve(p, &rule).await?;
        self.push(t, new);
        Ok(())
    }

    fn push(&mut self, t: u32, new: &mut Vec<u32>) {
        self.seq.push(t);
        new.push(t);
        if self.eos.contains(&t) || self.seq.len() >= self.max_length {
            self.done = true;
        }
    }

    pub fn into_ids(self) -> Vec<u32> {
        self.seq
    }
}

fn no_state() -> Error {
    Error::shape("greedy decoding", "a step out of order")
}

/// What a step recorded for its pick: nothing to read (a forced token), or a readback.
enum Picked {
    Forced(u32),
    Argmax(Pending),
    TopK(Pending),
    Row(Pending),
}

/// The next greedy token from a step's logits under the processors' rule, with the device buffers,
/// readback staging and recorded plans allocated once: nothing is allocated on the GPU per token.
struct Picker {
    gpu: Arc<Device>,
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
    fn new(gpu: &Arc<Device>, vocab: usize) -> Result<Self> {
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

    /// Record into `rec` (after the step that wrote `logits`, (1, V)) what `rule` needs.
    fn record(&mut self, rec: &mut Recorder, logits: &Tensor, rule: &NextToken) -> Result<Picked> {
        match rule {
            NextToken::Forced(t) => Ok(Picked::Forced(*t)),
            NextToken::Banned(b) if b.is_empty() => {
                let ids = &self.ids;
                rec.replay_cached(&mut self.plan_argmax, |rec| {
                    ops::reduce::argmax_rows(rec, logits, ids) // (1)
                })?;
                Ok(Picked::Argmax(rec.read_back_into(&self.ids, &self.st_ids)?))
            }
            NextToken::Banned(b) if b.len() < TOPK_MAX && self.vocab >= TOPK_MAX => {
                // The best allowed token is among the top bans + 1; a fixed k keeps one kernel.
                let (vals, ids) = (&self.tk_vals, &self.tk_ids);
                rec.replay_cached(&mut self.plan_topk, |rec| {
                    ops::reduce::topk_rows(rec, logits, TOPK_MAX, vals, ids) // (1, 16)
                })?;
                Ok(Picked::TopK(
                    rec.read_back_into(&self.tk_ids, &self.st_topk)?,
                ))
            }
            NextToken::Banned(_) => {
                let gpu = &self.gpu;
                let st = self
                    .st_logits
                    .get_or_insert_with(|| staging_buffer(gpu, logits.byte_size()));
                Ok(Picked::Row(rec.read_back_into(logits, st)?))
            }
        }
    }

    /// The chosen token, once the submit holding [`Picker::record`]'s work is done.
    async fn resolve(&self, picked: Picked, rule: &NextToken) -> Result<u32> {
        let gpu = &self.gpu;
        match picked {
            Picked::Forced(t) => Ok(t),
            Picked::Argmax(p) => {
                let got = p.u32s(gpu).await?;
                got.first()
                    .copied()
                    .ok_or_else(|| Error::Readback("empty argmax".into()))
            }
            Picked::TopK(p) => {
                let got = p.u32s(gpu).await?;
                let cands: Vec<(u32, f32)> = got.iter().map(|&i| (i, 0.0)).collect();
                pick(&cands, rule)
                    .ok_or_else(|| Error::Readback("top-k returned only banned tokens".into()))
            }
            Picked::Row(p) => {
                let row = p.f32s(gpu).await?;
                argmax_allowed(row.get(..self.vocab).unwrap_or(&row), rule).ok_or_else(|| {
                    Error::shape("generate", "every token is banned by no_repeat_ngram_size")
                })
            }
        }
    }
}
