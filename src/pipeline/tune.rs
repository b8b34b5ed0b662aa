//! Kernel tuning for a loaded pipeline: every front end (CLI `run` and `tune`, the server, the JS
//! facade) calls [`Pipeline::tune`], which has one failure policy: a failed run costs only speed, so
//! the choice table is cleared (the launchers' static choices run), the device is checked, and the
//! failure is in the returned report ([`TuneReport::failed`] and a warning). A front end decides only
//! what to show; `florence2 tune`, whose whole job is tuning, also exits non-zero.

use crate::gpu::tune::{tune_cases, CacheLocation, TuneCase, TuneOptions, TuneReport, Tuning};
use crate::model::workloads::model_workload;
use crate::weights::{DTypePlan, WeightDType};

use super::Pipeline;

/// The request sizes tuned for: images of `height` x `width` and decode steps of 1 and `beams` rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TuneSizes {
    pub height: usize,
    pub width: usize,
    pub beams: usize,
}

impl Pipeline {
    /// The sizes a load tunes for: the processor's image size and the model's beam count.
    pub fn tune_sizes(&self) -> TuneSizes {
        TuneSizes {
            height: self.processor.height,
            width: self.processor.width,
            beams: self.generation.num_beams,
        }
    }

    /// Tune the kernels for the calls this model makes at `sizes` (its linear layers, in the resident
    /// weight format, and its attention calls), as `opts` says, cached at `cache`. Never fails: on a
    /// failure the static choices stay and the report says why (see the module docs).
    pub async fn tune(
        &self,
        sizes: TuneSizes,
        opts: &TuneOptions,
        cache: &CacheLocation,
    ) -> TuneReport {
        if !self.gpu().backend().has_kernel_choices() {
            // The CPU backend has one kernel per op: nothing to choose.
            return TuneReport::default();
        }
        let model = &self.model;
        let beams = sizes.beams.max(1);
        let (h, w) = (sizes.height, sizes.width);
        // A uniform load is timed in the format of its token embedding, a mix with each linear in its
        // part's format.
        let plan = match self.weight_dtype().as_uniform() {
            Some(_) => DTypePlan::uniform(WeightDType::of_matrix_dtype(model.shared.dtype())),
            None => self.weight_dtype(),
        };
        let work = model_workload(&model.config, h, w, beams, plan);
        let cases: Vec<(&dyn TuneCase, f64)> = work.iter().map(|(c, w)| (c.as_ref(), *w)).collect();
        match tune_cases(self.gpu(), &cases, opts, cache).await {
            Ok(report) => report,
            Err(e) => {
                self.gpu().choices.clear();
                let _ = self.gpu().check();
                let warning =
                    format!("kernel tuning failed ({e}); using the static kernel choices");
                log::warn!("{warning}");
                TuneReport {
                    budget_ms: opts.budget_ms.filter(|_| opts.mode == Tuning::Auto),
                    warnings: vec![warning],
                    failed: Some(e.to_string()),
                    ..TuneReport::default()
                }
            }
        }
    }
}
