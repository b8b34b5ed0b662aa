//! One generation as steps that a driver runs: [`DecodeJob`] (greedy or beam search). A step is
//! [`DecodeJob::begin`] (inputs written, a beam reorder recorded), the decoder step (the job's own
//! [`Decoder::step_planned`], or one [`Decoder::step_batch`] shared with other jobs), then
//! [`DecodeJob::record_pick`] in the same submit and [`DecodeJob::resolve`] after it. Driving one job
//! alone ([`DecodeJob::run_alone`]) is how [`crate::model::generate::generate`] decodes; a batch driver
//! ([`crate::pipeline::DecodeBatch`]) runs many with the same code, so a request's tokens do not depend
//! on its neighbours.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gpu::{Device, Recorder};
use crate::model::bart::{CrossKv, Decoder, DecoderState};
use crate::model::generate::beam::BeamJob;
use crate::model::generate::greedy::GreedyJob;
use crate::model::generate::{Begin, GenerateOptions};

/// A greedy or beam-search generation, stepped by a driver.
pub enum DecodeJob<'a> {
    Greedy(Box<GreedyJob>),
    Beam(Box<BeamJob<'a>>),
}

impl<'a> DecodeJob<'a> {
    /// A job for `opts` (greedy with one beam, else beam search); the caches are allocated here.
    pub fn new(
        decoder: &'a Decoder,
        gpu: &Arc<Device>,
        cross: &CrossKv,
        opts: &GenerateOptions,
    ) -> Result<Self> {
        opts.validate()?;
        if opts.num_beams <= 1 {
            let job = GreedyJob::new(decoder, gpu, cross, opts)?;
            Ok(DecodeJob::Greedy(Box::new(job)))
        } else {
            Ok(DecodeJob::Beam(Box::new(BeamJob::new(
                decoder, gpu, cross, opts,
            )?)))
        }
    }

    pub fn is_done(&self) -> bool {
        match self {
            DecodeJob::Greedy(j) => j.is_done(),
            DecodeJob::Beam(j) => j.is_done(),
        }
    }

    /// Decoder batch rows (beams) this job's steps run.
    pub fn rows(&self) -> usize {
        self.state().map_or(0, DecoderState::batch)
    }

    /// The decoder state a [`Begin::Run`] step runs on.
    pub fn state(&self) -> Option<&DecoderState> {
        match self {
            DecodeJob::Greedy(j) => j.state(),
            DecodeJob::Beam(j) => Some(j.state()),
        }
    }

    pub fn state_mut(&mut self) -> Option<&mut DecoderState> {
        match self {
            DecodeJob::Greedy(j) => j.state_mut(),
            DecodeJob::Beam(j) => Some(j.state_mut()),
        }
    }

    /// Prepare the next step (see [`Begin`]); tokens that became final go to `new`.
    pub fn begin(&mut self, rec: &mut Recorder, new: &mut Vec<u32>) -> Result<Begin> {
        if self.is_done() {
            return Ok(Begin::Done);
        }
        let b = match self {
            DecodeJob::Greedy(j) => j.begin(new)?,
            DecodeJob::Beam(j) => match j.begin(rec)? {
                Some(pos) => Begin::Run(pos as u32),
                None => Begin::Skipped,
            },
        };
        self.finished_tokens(new);
        Ok(b)
    }

    /// After the decoder step, in the same submit: what the pick reads back.
    pub fn record_pick(&mut self, rec: &mut Recorder) -> Result<()> {
        match self {
            DecodeJob::Greedy(j) => j.record_pick(rec),
            DecodeJob::Beam(j) => j.record_pick(rec),
        }
    }

    /// After the submit: take the step; tokens that became final go to `new` (greedy: each token;
    /// beam search: the whole answer once the search ends).
    pub async fn resolve(&mut self, new: &mut Vec<u32>) -> Result<()> {
        match self {
            DecodeJob::Greedy(j) => j.resolve(new).await?,
            DecodeJob::Beam(j) => j.resolve().await?,
        }
        self.finished_tokens(new);
        Ok(())
    }

    /// A beam search's answer, when it has just ended.
    fn finished_tokens(&self, new: &mut Vec<u32>) {
        if let DecodeJob::Beam(j) = self {
            if j.is_done() {
                new.extend(j.best().into_iter().skip(1));
            }
        }
    }

    /// The ids, the start token first.
    pub fn into_ids(self) -> Vec<u32> {
        match self {
            DecodeJob::Greedy(j) => j.into_ids(),
            DecodeJob::Beam(j) => j.best(),
        }
    }

    /// Drive this job alone to the end: one submit per step, its own recorded step
    /// ([`Decoder::step_planned`]); `cancel` is polled before every step, `on_token` gets final tokens.
    pub async fn run_alone(
        mut self,
        decoder: &Decoder,
        gpu: &Arc<Device>,
        cancel: &dyn Fn() -> bool,
        on_token: &dyn Fn(u32),
    ) -> Result<Vec<u32>> {
        let mut new = Vec::new();
        while !self.is_done() {
            if cancel() {
                return Err(Error::Cancelled);
            }
            let mut rec = Recorder::new(gpu);
            rec.set_phase("decode");
            let begin = self.begin(&mut rec, &mut new)?;
            if let Begin::Run(pos) = begin {
                let state = self.state_mut().ok_or_else(no_state)?;
                decoder.step_planned(&mut rec, pos, state)?;
                self.record_pick(&mut rec)?;
                rec.submit()?;
                self.resolve(&mut new).await?;
            }
            for t in new.drain(..) {
                on_token(t);
            }
        }
        Ok(self.into_ids())
    }
}

fn no_state() -> Error {
    Error::shape("generate", "a decoder step without a state")
}

/// Greedy decoding from `opts.decoder_start_token_id` against one image's cross-attention K/V: one job
/// driven alone. Returns the sequence with the start token first (as the reference's `generate` does),
/// ending at an EOS id or at `max_length`. `cancel` is polled before every step.
pub async fn greedy(
    decoder: &Decoder,
    gpu: &Arc<Device>,
    cross: &CrossKv,
    opts: &GenerateOptions,
    cancel: &dyn Fn() -> bool,
) -> Result<Vec<u32>> {
    let job = DecodeJob::Greedy(Box::new(GreedyJob::new(decoder, gpu, cross, opts)?));
    job.run_alone(decoder, gpu, cancel, &|_| {}).await
}
