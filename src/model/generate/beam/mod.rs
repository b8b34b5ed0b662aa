//! Beam search exactly as transformers 5.24's `GenerationMixin._beam_search` (batch size 1):
//!
//! - `running_beam_scores` start at `[0, -1e9, -1e9, ...]` so the first step only expands beam 0;
//! - each step, every beam's log-softmax row goes through the logits processors (no-repeat-n-gram bans =
//!   -inf, forced BOS / EOS = 0 for the forced token, -inf elsewhere), is added to the beam's running score
//!   (f32), and the best `beams_to_keep = max(2, 1 + n_eos) * num_beams` (beam, token) pairs over the
//!   flattened (beam, vocab) scores are the candidates;
//! - a candidate "hits the stopping criteria" when its token is an EOS id or its length reaches
//!   `max_length`; the next running beams are the best `num_beams` candidates after adding -1e9 to those
//!   that hit (so finished ones only run on when nothing else is left);
//! - candidates among the first `num_beams` that hit are offered to the finished list with score
//!   `sum_logprobs / generated_len ** length_penalty`, `generated_len` counting the new token and not the
//!   decoder start token; the list keeps the best `num_beams` of (previous ++ offered), -1e9 placeholders;
//! - the early-stop heuristic (`_check_early_stop_heuristic`): the best running score divided by
//!   `(cur_len - 1) ** length_penalty` (`early_stopping = "never"` with a positive penalty: by
//!   `(max_length - 1) ** length_penalty`) must beat the worst finished score in some slot, unfinished
//!   slots counting as -1e9; once unsatisfied it stays so;
//! - the loop ends when improvement is impossible, or (`early_stopping = true`) every finished slot is
//!   filled, or every candidate hit the stopping criteria; the answer is the best finished hypothesis.
//!
//! Exact score ties: `torch.topk` does not specify an order (observed: not by index); here ties go to the
//! lower flat index (beam, then token), like the GPU top-k. The reference fixtures keep every candidate
//! gap >= 1e-4, so ties never decide their results.
//!
//! The bookkeeping is pure Rust ([`BeamSearch`]) driven through a [`StepSource`], so it can be tested on
//! scripted log-probs; [`GpuSource`] runs the decoder for all beams in one submit per step (cache reorder
//! by beam index recorded in the same submit), log-softmax + top-16 on the GPU, and reads back (B, 16) ids
//! and values; only when a beam's bans plus `2 * num_beams` exceed 16 does a step read the full log-prob
//! rows.

mod job;
mod search;
mod source;
#[cfg(test)]
mod tests;

use crate::error::{Error, Result};

pub use job::BeamJob;
pub use search::{BeamConfig, BeamSearch, StepInputs, StepPlan};
pub use source::{BeamPicked, GpuSource};

/// One decoder step for every running beam, as the bookkeeping sees it.
#[allow(async_fn_in_trait)] // used generically, never boxed; Send is not needed (single-threaded wasm)
pub trait StepSource {
    /// Reorder the per-beam decoder state so that new row `b` = old row `s.src[b]` (identity on the
    /// first step), feed `s.tokens[b]` at decoder position `s.pos` (0 = the decoder start token) and
    /// return, for every beam `b` with `s.want[b] > 0`, at least its `s.want[b]` best
    /// `(token, log_softmax)` pairs (any order; more, up to the whole row, is fine); beams with
    /// `s.want[b] == 0` get an empty list.
    async fn step(&mut self, s: &StepInputs) -> Result<Vec<Vec<(u32, f32)>>>;
}

/// Run beam search to the end against `source`. `cancel` is polled before every step.
pub async fn run<S: StepSource>(
    cfg: BeamConfig,
    source: &mut S,
    cancel: &dyn Fn() -> bool,
) -> Result<Vec<u32>> {
    let mut bs = BeamSearch::new(cfg);
    while !bs.is_done() {
        if cancel() {
            return Err(Error::Cancelled);
        }
        let plan = bs.plan();
        let rows = match &plan.run {
            None => vec![Vec::new(); plan.rules.len()],
            Some(s) => source.step(s).await?,
        };
        bs.advance(&plan.rules, &rows)?;
    }
    Ok(bs.best())
}
