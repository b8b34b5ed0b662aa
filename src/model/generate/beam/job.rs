//! Beam search as steps a driver runs, and the one-image entry point.

use std::sync::Arc;

use super::{BeamConfig, BeamPicked, BeamSearch, GpuSource, StepPlan};
use crate::error::{Error, Result};
use crate::gpu::{Device, Recorder};
use crate::model::bart::{CrossKv, Decoder, DecoderState};
use crate::model::generate::GenerateOptions;

/// One beam search as steps a driver runs ([`crate::model::generate::DecodeJob`]): the bookkeeping
/// ([`BeamSearch`]) over a [`GpuSource`] whose decoder step the driver records.
pub struct BeamJob<'a> {
    bs: BeamSearch,
    source: GpuSource<'a>,
    plan: Option<StepPlan>,
    pending: Option<BeamPicked>,
}

impl<'a> BeamJob<'a> {
    pub fn new(
        decoder: &'a Decoder,
        gpu: &Arc<Device>,
        cross: &CrossKv,
        opts: &GenerateOptions,
    ) -> Result<Self> {
        let cfg = BeamConfig::new(opts, decoder.max_positions());
        opts.check_fed_ids(decoder.vocab_size())?;
        let source = GpuSource::new(decoder, gpu, cross, cfg.num_beams, cfg.max_length)?;
        Ok(BeamJob {
            bs: BeamSearch::new(cfg),
            source,
            plan: None,
            pending: None,
        })
    }

    pub fn is_done(&self) -> bool {
        self.bs.is_done()
    }

    pub fn state(&self) -> &DecoderState {
        self.source.state()
    }

    pub fn state_mut(&mut self) -> &mut DecoderState {
        self.source.state_mut()
    }

    /// Plan the next step; with a decoder run, write its inputs and record the reorder into `rec`.
    /// A step without one (forced final tokens) is taken at once.
    pub fn begin(&mut self, rec: &mut Recorder) -> Result<Option<usize>> {
        let plan = self.bs.plan();
        let pos = match &plan.run {
            None => {
                let rows = vec![Vec::new(); plan.rules.len()];
                self.bs.advance(&plan.rules, &rows)?;
                return Ok(None);
            }
            Some(s) => {
                self.source.begin(rec, s)?;
                s.pos
            }
        };
        self.plan = Some(plan);
        Ok(Some(pos))
    }

    pub fn record_pick(&mut self, rec: &mut Recorder) -> Result<()> {
        let want = self.want()?.to_vec();
        self.pending = Some(self.source.record_pick(rec, &want)?);
        Ok(())
    }

    pub async fn resolve(&mut self) -> Result<()> {
        let (Some(plan), Some(p)) = (self.plan.take(), self.pending.take()) else {
            return Err(out_of_order());
        };
        let want = plan
            .run
            .as_ref()
            .map(|s| s.want.clone())
            .unwrap_or_default();
        let rows = self.source.resolve(p, &want).await?;
        self.bs.advance(&plan.rules, &rows)
    }

    fn want(&self) -> Result<&[usize]> {
        self.plan
            .as_ref()
            .and_then(|p| p.run.as_ref())
            .map(|s| s.want.as_slice())
            .ok_or_else(out_of_order)
    }

    /// The best hypothesis, the start token first.
    pub fn best(&self) -> Vec<u32> {
        self.bs.best()
    }
}

fn out_of_order() -> Error {
    Error::shape("beam search", "a step out of order")
}
