//! The GPU step source: the decoder for all beams in one submit, the cache reorder by beam index,
//! log-softmax + top-k on the GPU, and the readback of the picked rows.

use std::sync::Arc;

use super::{StepInputs, StepSource};
use crate::error::{Error, Result};
use crate::gpu::{staging_buffer, DType, Device, Pending, Plan, Recorder, Staging, Tensor};
use crate::model::bart::{CrossKv, Decoder, DecoderState};
use crate::model::generate::TOPK_MAX;
use crate::ops;

/// The GPU step source: one decoder step for all beams per submit, log-softmax + top-k on the GPU.
pub struct GpuSource<'a> {
    decoder: &'a Decoder,
    gpu: Arc<Device>,
    state: DecoderState,
    logp: Tensor,
    tk_vals: Tensor,
    tk_ids: Tensor,
    st_vals: Staging,
    st_ids: Staging,
    st_full: Option<Staging>,
    /// log-softmax + top-k, and log-softmax alone, recorded once (see `Recorder::replay_cached`).
    plan_topk: Option<Plan>,
    plan_full: Option<Plan>,
    k: usize,
    /// Steps that read the full log-prob rows (statistics / tests).
    pub full_reads: usize,
    /// Always read full rows instead of the top-k (tests: both paths must agree).
    pub force_full_rows: bool,
}

impl<'a> GpuSource<'a> {
    /// Allocate everything for `beams` rows and `max_length` (decoder positions 0..max_length-1).
    pub fn new(
        decoder: &'a Decoder,
        gpu: &Arc<Device>,
        cross: &CrossKv,
        beams: usize,
        max_length: usize,
    ) -> Result<Self> {
        let state = decoder.new_state(gpu, cross, beams, max_length.saturating_sub(1).max(1))?;
        let v = decoder.vocab_size();
        let k = TOPK_MAX.min(v);
        let tk_vals = Tensor::zeros(gpu, &[beams, k], DType::F32, "beam.topk.vals")?;
        let tk_ids = Tensor::zeros(gpu, &[beams, k], DType::U32, "beam.topk.ids")?;
        Ok(GpuSource {
            decoder,
            gpu: gpu.clone(),
            logp: Tensor::zeros(gpu, &[beams, v], DType::F32, "beam.logp")?,
            st_vals: staging_buffer(gpu, tk_vals.byte_size()),
            st_ids: staging_buffer(gpu, tk_ids.byte_size()),
            st_full: None,
            plan_topk: None,
            plan_full: None,
            tk_vals,
            tk_ids,
            state,
            k,
            full_reads: 0,
            force_full_rows: false,
        })
    }
}

/// What a step recorded for the search: nothing to read (every beam forced), the top-k ids and
/// log-probs, or whole log-prob rows.
pub enum BeamPicked {
    Nothing,
    TopK(Pending, Pending),
    Full(Pending),
}

impl GpuSource<'_> {
    /// Before the decoder step: check and write the tokens and position, and record the cache reorder
    /// into `rec` (positions 0..pos hold the previous tokens' K/V).
    pub fn begin(&mut self, rec: &mut Recorder, s: &StepInputs) -> Result<()> {
        let v = self.decoder.vocab_size();
        if let Some(bad) = s.tokens.iter().find(|&&t| t as usize >= v) {
            return Err(Error::shape(
                "beam search",
                format!("token {bad} >= vocab {v}"),
            ));
        }
        self.state.write_tokens(&s.tokens)?;
        self.state.write_step(s.pos as u32)?;
        self.state.reorder(rec, &s.src, s.pos)
    }

    pub fn state(&self) -> &DecoderState {
        &self.state
    }

    pub fn state_mut(&mut self) -> &mut DecoderState {
        &mut self.state
    }

    /// After the decoder step (its logits in the state): record log-softmax and top-k (or whole rows)
    /// and their readback, as `want` needs.
    pub fn record_pick(&mut self, rec: &mut Recorder, want: &[usize]) -> Result<BeamPicked> {
        let need = want.iter().copied().max().unwrap_or(0);
        let logits = self.state.logits().clone();
        if need == 0 {
            return Ok(BeamPicked::Nothing);
        }
        if need <= self.k && !self.force_full_rows {
            let (lp, k, tv, ti) = (&self.logp, self.k, &self.tk_vals, &self.tk_ids);
            rec.replay_cached(&mut self.plan_topk, |rec| {
                ops::softmax::log_softmax_rows(rec, &logits, lp)?; // (B, V)
                ops::reduce::topk_rows(rec, lp, k, tv, ti) // (B, k)
            })?;
            let pv = rec.read_back_into(&self.tk_vals, &self.st_vals)?;
            let pi = rec.read_back_into(&self.tk_ids, &self.st_ids)?;
            Ok(BeamPicked::TopK(pv, pi))
        } else {
            self.full_reads += 1;
            let lp = &self.logp;
            rec.replay_cached(&mut self.plan_full, |rec| {
                ops::softmax::log_softmax_rows(rec, &logits, lp) // (B, V)
            })?;
            let bytes = self.logp.byte_size();
            let st = self
                .st_full
                .get_or_insert_with(|| staging_buffer(&self.gpu, bytes));
            Ok(BeamPicked::Full(rec.read_back_into(&self.logp, st)?))
        }
    }

    /// After the submit: every beam's candidates (see [`StepSource::step`]).
    pub async fn resolve(
        &self,
        picked: BeamPicked,
        want: &[usize],
    ) -> Result<Vec<Vec<(u32, f32)>>> {
        let b = self.state.batch();
        let wanted = |r: usize| want.get(r).copied().unwrap_or(0) > 0;
        match picked {
            BeamPicked::Nothing => Ok(vec![Vec::new(); b]),
            BeamPicked::TopK(pv, pi) => {
                let vals = pv.f32s(&self.gpu).await?;
                let ids = pi.u32s(&self.gpu).await?;
                let k = self.k;
                Ok((0..b)
                    .map(|r| {
                        if !wanted(r) {
                            return Vec::new();
                        }
                        let lo = r * k;
                        ids.get(lo..lo + k)
                            .unwrap_or(&[])
                            .iter()
                            .copied()
                            .zip(vals.get(lo..lo + k).unwrap_or(&[]).iter().copied())
                            .collect()
                    })
                    .collect())
            }
            BeamPicked::Full(p) => {
                let v = self.decoder.vocab_size();
                let all = p.f32s(&self.gpu).await?;
                Ok((0..b)
                    .map(|r| {
                        if !wanted(r) {
                            return Vec::new();
                        }
                        all.get(r * v..(r + 1) * v)
                            .unwrap_or(&[])
                            .iter()
                            .enumerate()
                            .map(|(i, &x)| (i as u32, x))
                            .collect()
                    })
                    .collect())
            }
        }
    }
}

impl StepSource for GpuSource<'_> {
    async fn step(&mut self, inputs: &StepInputs) -> Result<Vec<Vec<(u32, f32)>>> {
        let (pos, want) = (inputs.pos, &inputs.want);
        let mut rec = Recorder::new(&self.gpu);
        rec.set_phase("decode");
        self.begin(&mut rec, inputs)?;
        self.decoder
            .step_planned(&mut rec, pos as u32, &mut self.state)?; // (B, V)
        let picked = self.record_pick(&mut rec, want)?;
        rec.submit()?;
        self.resolve(picked, want).await
    }
}
