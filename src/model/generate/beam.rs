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

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gpu::{staging_buffer, DType, Gpu, Pending, Plan, Recorder, Staging, Tensor};
use crate::model::bart::{CrossKv, Decoder, DecoderState};
use crate::model::generate::job::DecodeJob;
use crate::model::generate::processors::{NextToken, Processors};
use crate::model::generate::{EarlyStopping, GenerateOptions, TOPK_MAX};
use crate::ops;

/// The reference's "-1e9" (an impossible score that stays finite).
const NEG: f32 = -1.0e9;

/// One decoder step for every running beam, as the bookkeeping sees it.
#[allow(async_fn_in_trait)] // used generically, never boxed; Send is not needed (single-threaded wasm)
pub trait StepSource {
    /// Reorder the per-beam decoder state so that new row `b` = old row `src[b]` (identity on the first
    /// step), feed `tokens[b]` at decoder position `pos` (0 = the decoder start token) and return, for
    /// every beam `b` with `want[b] > 0`, at least its `want[b]` best `(token, log_softmax)` pairs (any
    /// order; more, up to the whole row, is fine); beams with `want[b] == 0` get an empty list.
    async fn step(
        &mut self,
        src: &[usize],
        tokens: &[u32],
        pos: usize,
        want: &[usize],
    ) -> Result<Vec<Vec<(u32, f32)>>>;
}

/// Beam-search settings (from [`GenerateOptions`]).
#[derive(Clone, Debug, PartialEq)]
pub struct BeamConfig {
    pub num_beams: usize,
    pub length_penalty: f32,
    pub early_stopping: EarlyStopping,
    /// Decoder sequence length (start token included) at which generation stops.
    pub max_length: usize,
    pub eos_token_ids: Vec<u32>,
    pub decoder_start_token_id: u32,
    pub processors: Processors,
}

impl BeamConfig {
    pub fn new(opts: &GenerateOptions, max_positions: usize) -> Self {
        BeamConfig {
            num_beams: opts.num_beams.max(1),
            length_penalty: opts.length_penalty,
            early_stopping: opts.early_stopping,
            max_length: opts.max_length(max_positions),
            eos_token_ids: opts.eos_token_ids.clone(),
            decoder_start_token_id: opts.decoder_start_token_id,
            processors: opts.processors(max_positions),
        }
    }

    /// The candidate pool size: `max(2, 1 + n_eos) * num_beams`.
    pub fn beams_to_keep(&self) -> usize {
        2usize.max(1 + self.eos_token_ids.len()) * self.num_beams
    }
}

/// One scored candidate continuation.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Cand {
    beam: usize,
    token: u32,
    score: f32,
}

/// Descending by score, ties by (beam, token) ascending; NaN last.
/// e. next running beams: the best `nb` candidates after pushing finished ones down by 1e9; returns
/// (sequences, scores, the cache row each came from).
fn next_running(
    cands: &[Cand],
    hits: &[bool],
    seqs: &[Vec<u32>],
    nb: usize,
) -> (Vec<Vec<u32>>, Vec<f32>, Vec<usize>) {
    let run_scores: Vec<f32> = cands
        .iter()
        .zip(hits)
        .map(|(c, &h)| c.score + if h { NEG } else { 0.0 })
        .collect();
    let next = topk_idx(&run_scores, nb);
    let running = next.iter().map(|&i| seqs[i].clone()).collect();
    let scores = next.iter().map(|&i| run_scores[i]).collect();
    let src = next.iter().map(|&i| cands[i].beam).collect();
    (running, scores, src)
}

fn order(a: &Cand, b: &Cand) -> std::cmp::Ordering {
    let key = |c: &Cand| {
        if c.score.is_nan() {
            f32::NEG_INFINITY
        } else {
            c.score
        }
    };
    key(b)
        .total_cmp(&key(a))
        .then(a.beam.cmp(&b.beam))
        .then(a.token.cmp(&b.token))
}

/// Indices of the `k` largest of `scores`, descending, ties to the lower index.
fn topk_idx(scores: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    let key = |i: usize| {
        let s = scores.get(i).copied().unwrap_or(f32::NEG_INFINITY);
        if s.is_nan() {
            f32::NEG_INFINITY
        } else {
            s
        }
    };
    idx.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// `x ** p` for a positive length, as Python's `int ** float`.
fn len_pow(len: usize, p: f32) -> f32 {
    (len as f64).powf(p as f64) as f32
}

/// The beam-search bookkeeping: running beams, finished hypotheses, stopping.
#[derive(Clone, Debug)]
pub struct BeamSearch {
    cfg: BeamConfig,
    running: Vec<Vec<u32>>,
    running_scores: Vec<f32>,
    finished: Vec<Vec<u32>>,
    finished_scores: Vec<f32>,
    is_finished: Vec<bool>,
    heuristic_unsatisfied: bool,
    /// Source beam of every running beam for the next step's cache reorder.
    src: Vec<usize>,
    done: bool,
}

impl BeamSearch {
    pub fn new(cfg: BeamConfig) -> Self {
        let nb = cfg.num_beams.max(1);
        let start = vec![cfg.decoder_start_token_id];
        let mut running_scores = vec![NEG; nb];
        running_scores[0] = 0.0;
        let done = cfg.max_length <= 1;
        BeamSearch {
            running: vec![start.clone(); nb],
            running_scores,
            finished: vec![start; nb],
            finished_scores: vec![NEG; nb],
            is_finished: vec![false; nb],
            heuristic_unsatisfied: true,
            src: (0..nb).collect(),
            done,
            cfg,
        }
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The running sequences (decoder start token first), one per beam.
    pub fn running(&self) -> &[Vec<u32>] {
        &self.running
    }

    /// Current length of the running sequences (the reference's `cur_len`).
    pub fn cur_len(&self) -> usize {
        self.running.first().map_or(1, Vec::len)
    }

    /// The processors' rule for every running beam's next token.
    pub fn rules(&self) -> Vec<NextToken> {
        self.running
            .iter()
            .map(|s| self.cfg.processors.rule(s))
            .collect()
    }

    /// Cache reorder for the next decoder step: new row b = old row `src()[b]`.
    pub fn src(&self) -> &[usize] {
        &self.src
    }

    /// How many log-probs each beam needs from the step source under `rules` (0 for a forced token).
    pub fn want(&self, rules: &[NextToken]) -> Vec<usize> {
        let need = self.cfg.beams_to_keep();
        rules
            .iter()
            .map(|r| match r {
                NextToken::Forced(_) => 0,
                NextToken::Banned(b) => need + b.len(),
            })
            .collect()
    }

    /// Advance one step with the raw log-softmax candidates `logprobs[b]` of every beam (see
    /// [`StepSource::step`]), applying `rules` (from [`BeamSearch::rules`]).
    pub fn advance(&mut self, rules: &[NextToken], logprobs: &[Vec<(u32, f32)>]) -> Result<()> {
        let nb = self.cfg.num_beams;
        if rules.len() != nb || logprobs.len() != nb {
            return Err(Error::shape(
                "beam search",
                format!(
                    "{} rules, {} log-prob rows for {nb} beams",
                    rules.len(),
                    logprobs.len()
                ),
            ));
        }
        let cur_len = self.cur_len();
        let cands = self.candidates(rules, logprobs);
        let hits: Vec<bool> = cands
            .iter()
            .map(|c| {
                self.cfg.eos_token_ids.contains(&c.token) || cur_len + 1 >= self.cfg.max_length
            })
            .collect();
        let seqs: Vec<Vec<u32>> = cands
            .iter()
            .map(|c| {
                let mut s = self.running.get(c.beam).cloned().unwrap_or_default();
                s.push(c.token);
                s
            })
            .collect();
        let (running, running_scores, src) = next_running(&cands, &hits, &seqs, nb);
        self.merge_finished(&cands, &hits, &seqs, cur_len);
        self.running = running;
        self.running_scores = running_scores;
        self.src = src;
        self.update_done(&hits, cur_len + 1);
        Ok(())
    }

    /// The best `beams_to_keep` processed, accumulated candidates over every beam (the best
    /// 2 * num_beams allowed per beam suffice for the global best), padded with -inf fillers.
    fn candidates(&self, rules: &[NextToken], logprobs: &[Vec<(u32, f32)>]) -> Vec<Cand> {
        let k = self.cfg.beams_to_keep();
        let mut cands: Vec<Cand> = Vec::new();
        for (b, (rule, row)) in rules.iter().zip(logprobs).enumerate() {
            let base = self.running_scores.get(b).copied().unwrap_or(NEG);
            match rule {
                NextToken::Forced(t) => cands.push(Cand {
                    beam: b,
                    token: *t,
                    score: base + 0.0,
                }),
                NextToken::Banned(bans) => {
                    let mut own: Vec<Cand> = row
                        .iter()
                        .filter(|(t, _)| bans.binary_search(t).is_err())
                        .map(|&(t, lp)| Cand {
                            beam: b,
                            token: t,
                            score: base + lp,
                        })
                        .collect();
                    own.sort_by(order);
                    own.dedup_by(|a, b| a.token == b.token);
                    own.truncate(k);
                    cands.extend(own);
                }
            }
        }
        cands.sort_by(order);
        cands.truncate(k);
        // Fewer finite continuations than the pool (tiny vocabularies, forced steps): the reference's
        // top-k then picks -inf entries; they can never win anything.
        let filler = self.cfg.decoder_start_token_id;
        while cands.len() < k {
            cands.push(Cand {
                beam: 0,
                token: filler,
                score: f32::NEG_INFINITY,
            });
        }
        cands
    }

    /// f. finished hypotheses: the best `num_beams` of the kept ones and this step's finished
    /// candidates (length-normalised by the length before this step; pushed down by 1e9 when they
    /// cannot count).
    fn merge_finished(&mut self, cands: &[Cand], hits: &[bool], seqs: &[Vec<u32>], cur_len: usize) {
        let nb = self.cfg.num_beams;
        let all_full = self.is_finished.iter().all(|&f| f);
        let denom = len_pow(cur_len, self.cfg.length_penalty); // cur_len + 1 - decoder_prompt_len
        let mut m_scores = self.finished_scores.clone();
        let mut m_seqs = self.finished.clone();
        let mut m_fin = self.is_finished.clone();
        for (i, c) in cands.iter().enumerate() {
            let just = hits[i] && i < nb;
            let mut s = c.score / denom;
            if all_full && self.cfg.early_stopping == EarlyStopping::True {
                s += NEG;
            }
            if !self.heuristic_unsatisfied {
                s += NEG;
            }
            if !just {
                s += NEG;
            }
            m_scores.push(s);
            m_seqs.push(seqs[i].clone());
            m_fin.push(just);
        }
        let keep = topk_idx(&m_scores, nb);
        self.finished = keep.iter().map(|&i| m_seqs[i].clone()).collect();
        self.finished_scores = keep.iter().map(|&i| m_scores[i]).collect();
        self.is_finished = keep.iter().map(|&i| m_fin[i]).collect();
    }

    /// g. stopping, after the step that made the sequences `cur_len` long.
    fn update_done(&mut self, hits: &[bool], cur_len: usize) {
        let lp = self.cfg.length_penalty;
        let hyp_len = if self.cfg.early_stopping == EarlyStopping::Never && lp > 0.0 {
            self.cfg.max_length.saturating_sub(1)
        } else {
            cur_len - 1
        };
        let best_running =
            self.running_scores.first().copied().unwrap_or(NEG) / len_pow(hyp_len, lp);
        let min_fin = self
            .finished_scores
            .iter()
            .copied()
            .fold(f32::INFINITY, f32::min);
        let improvable = self
            .is_finished
            .iter()
            .any(|&f| best_running > if f { min_fin } else { NEG });
        self.heuristic_unsatisfied &= improvable;
        let all_finished = self.is_finished.iter().all(|&f| f);
        let open = !(all_finished && self.cfg.early_stopping == EarlyStopping::True);
        let valid = !hits.iter().all(|&h| h);
        self.done = !(self.heuristic_unsatisfied && open && valid);
    }

    /// The answer: the best finished hypothesis (decoder start token first; only the start token when
    /// nothing finished, as the reference).
    pub fn best(&self) -> Vec<u32> {
        self.finished
            .first()
            .cloned()
            .unwrap_or_else(|| vec![self.cfg.decoder_start_token_id])
    }

    /// Finished hypotheses with their scores, best first (placeholders score -1e9).
    pub fn finished(&self) -> Vec<(Vec<u32>, f32)> {
        self.finished
            .iter()
            .cloned()
            .zip(self.finished_scores.iter().copied())
            .collect()
    }
}

/// The inputs of one search step that runs the decoder (see [`StepSource::step`]).
#[derive(Clone, Debug, PartialEq)]
pub struct StepInputs {
    pub src: Vec<usize>,
    pub tokens: Vec<u32>,
    pub pos: usize,
    pub want: Vec<usize>,
}

/// The next step of a search: the processors' rule per beam, and the decoder inputs unless the step
/// needs no decoder run (every beam's final token is forced).
#[derive(Clone, Debug)]
pub struct StepPlan {
    pub rules: Vec<NextToken>,
    pub run: Option<StepInputs>,
}

impl BeamSearch {
    /// What the next step needs (call while not [`BeamSearch::is_done`]); then [`BeamSearch::advance`]
    /// with its rules and the step source's rows (empty rows when `run` is `None`).
    pub fn plan(&self) -> StepPlan {
        let rules = self.rules();
        let cur_len = self.cur_len();
        let all_forced = rules.iter().all(|r| matches!(r, NextToken::Forced(_)));
        let run = if all_forced && cur_len + 1 >= self.cfg.max_length {
            // The final forced token needs no decoder run.
            None
        } else {
            Some(StepInputs {
                tokens: self
                    .running()
                    .iter()
                    .map(|s| *s.last().unwrap_or(&self.cfg.decoder_start_token_id))
                    .collect(),
                want: self.want(&rules),
                src: self.src().to_vec(),
                pos: cur_len - 1,
            })
        };
        StepPlan { rules, run }
    }
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
            Some(s) => source.step(&s.src, &s.tokens, s.pos, &s.want).await?,
        };
        bs.advance(&plan.rules, &rows)?;
    }
    Ok(bs.best())
}

/// The GPU step source: one decoder step for all beams per submit, log-softmax + top-k on the GPU.
pub struct GpuSource<'a> {
    decoder: &'a Decoder,
    gpu: Arc<Gpu>,
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
        gpu: &Arc<Gpu>,
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
    async fn step(
        &mut self,
        src: &[usize],
        tokens: &[u32],
        pos: usize,
        want: &[usize],
    ) -> Result<Vec<Vec<(u32, f32)>>> {
        let inputs = StepInputs {
            src: src.to_vec(),
            tokens: tokens.to_vec(),
            pos,
            want: want.to_vec(),
        };
        let mut rec = Recorder::new(&self.gpu);
        rec.set_phase("decode");
        self.begin(&mut rec, &inputs)?;
        self.decoder
            .step_planned(&mut rec, pos as u32, &mut self.state)?; // (B, V)
        let picked = self.record_pick(&mut rec, want)?;
        rec.submit()?;
        self.resolve(picked, want).await
    }
}

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
        gpu: &Arc<Gpu>,
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

/// Beam search from `opts.decoder_start_token_id` against one image's cross-attention K/V (shared by all
/// beams). Returns the best hypothesis with the start token first, as the reference's `generate`.
pub async fn beam_search(
    decoder: &Decoder,
    gpu: &Arc<Gpu>,
    cross: &CrossKv,
    opts: &GenerateOptions,
    cancel: &dyn Fn() -> bool,
) -> Result<Vec<u32>> {
    if opts.max_length(decoder.max_positions()) <= 1 {
        return Ok(vec![opts.decoder_start_token_id]);
    }
    let job = DecodeJob::Beam(Box::new(BeamJob::new(decoder, gpu, cross, opts)?));
    job.run_alone(decoder, gpu, cancel, &|_| {}).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    const V: usize = 8;
    const EOS: u32 = 2;
    const S: u32 = 2; // decoder start (= EOS, as in Florence-2)

    /// A step source over a scripted table: log-probs of the next token as a function of the sequence.
    struct Scripted<F: Fn(&[u32]) -> Vec<f32>> {
        f: F,
        seqs: Vec<Vec<u32>>,
        calls: usize,
    }

    impl<F: Fn(&[u32]) -> Vec<f32>> StepSource for Scripted<F> {
        async fn step(
            &mut self,
            src: &[usize],
            tokens: &[u32],
            pos: usize,
            want: &[usize],
        ) -> Result<Vec<Vec<(u32, f32)>>> {
            self.calls += 1;
            let mut seqs: Vec<Vec<u32>> = src.iter().map(|&s| self.seqs[s].clone()).collect();
            for (s, &t) in seqs.iter_mut().zip(tokens) {
                assert_eq!(s.len(), pos, "position = tokens fed before");
                s.push(t);
            }
            self.seqs = seqs;
            Ok(self
                .seqs
                .iter()
                .zip(want)
                .map(|(s, &w)| {
                    if w == 0 {
                        return Vec::new();
                    }
                    (self.f)(s)
                        .into_iter()
                        .enumerate()
                        .map(|(i, x)| (i as u32, x))
                        .collect()
                })
                .collect())
        }
    }

    fn block_on<T>(fut: impl Future<Output = T>) -> T {
        let mut fut = std::pin::pin!(fut);
        let mut cx = Context::from_waker(Waker::noop());
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(v) => v,
            Poll::Pending => panic!("scripted source never waits"),
        }
    }

    fn cfg(nb: usize, max_length: usize) -> BeamConfig {
        BeamConfig {
            num_beams: nb,
            length_penalty: 1.0,
            early_stopping: EarlyStopping::True,
            max_length,
            eos_token_ids: vec![EOS],
            decoder_start_token_id: S,
            processors: Processors {
                max_length,
                ..Default::default()
            },
        }
    }

    /// A row with `default` everywhere and the given (token, log-prob) pairs.
    fn row(default: f32, set: &[(u32, f32)]) -> Vec<f32> {
        let mut r = vec![default; V];
        for &(t, x) in set {
            r[t as usize] = x;
        }
        r
    }

    fn go(c: BeamConfig, f: impl Fn(&[u32]) -> Vec<f32>) -> (Vec<u32>, usize) {
        let nb = c.num_beams;
        let mut src = Scripted {
            f,
            seqs: vec![Vec::new(); nb],
            calls: 0,
        };
        let out = block_on(run(c, &mut src, &|| false)).unwrap();
        (out, src.calls)
    }

    #[test]
    fn eos_at_step_one_wins_and_stops_once_all_beams_finished() {
        // Step 1: EOS is the best continuation; step 2 every beam ends, with a worse normalised score.
        let f = |s: &[u32]| match s {
            [S] => row(-9.0, &[(EOS, -0.5), (3, -1.0), (4, -1.2)]),
            _ => row(-9.0, &[(EOS, -0.4)]),
        };
        let (out, calls) = go(cfg(2, 10), f);
        // Finished: [S, EOS] -0.5 / 1, then [S, 3, EOS] -1.4 / 2 = -0.7: both slots full -> stop.
        assert_eq!(out, vec![S, EOS]);
        assert_eq!(calls, 2);
    }

    #[test]
    fn length_penalty_normalises_by_generated_length_without_the_start_token() {
        // [S, EOS]: -0.5 / 1. [S, 3, EOS]: (-0.3 - 0.6) / 2 = -0.45 with penalty 1 (wins),
        // -0.9 with penalty 0 (loses). Were the start token counted, -0.9 / 3 = -0.3 vs -0.5 / 2.
        let f = |s: &[u32]| match s {
            [S] => row(-9.0, &[(EOS, -0.5), (3, -0.3)]),
            [S, 3] => row(-9.0, &[(EOS, -0.6)]),
            _ => row(-9.0, &[(EOS, -3.0)]),
        };
        let (out, _) = go(cfg(2, 10), f);
        assert_eq!(out, vec![S, 3, EOS]);
        let mut c = cfg(2, 10);
        c.length_penalty = 0.0;
        assert_eq!(go(c, f).0, vec![S, EOS]);
        // Penalty 2: -0.5 vs -0.9 / 4 = -0.225.
        let mut c = cfg(2, 10);
        c.length_penalty = 2.0;
        assert_eq!(go(c, f).0, vec![S, 3, EOS]);
    }

    #[test]
    fn eos_beyond_the_first_num_beams_candidates_is_not_a_hypothesis() {
        // Step 1 candidates (beams_to_keep = 4): 3 (-0.2), 4 (-0.3), EOS (-0.5) at index 2 >= 2 beams:
        // dropped although its -0.5 would beat everything that finishes later.
        let f = |s: &[u32]| match s {
            [S] => row(-9.0, &[(3, -0.2), (4, -0.3), (EOS, -0.5)]),
            [S, 3] | [S, 4] => row(-9.0, &[(EOS, -2.0)]),
            _ => row(-9.0, &[(EOS, -0.1)]),
        };
        let (out, calls) = go(cfg(2, 10), f);
        assert_eq!(out, vec![S, 3, EOS]);
        assert_eq!(calls, 2);
        // With 1 beam only index 0 counts, so the same EOS (index 2) is skipped as well.
        let (out, _) = go(cfg(1, 10), f);
        assert_eq!(out, vec![S, 3, EOS]);
    }

    #[test]
    fn ties_go_to_the_lower_beam_then_token() {
        // Tokens 3 and 4 tie at step 1; both beams then end with equal scores: the lower beam (token 3)
        // is the first hypothesis.
        let f = |s: &[u32]| match s {
            [S] => row(-9.0, &[(3, -0.7), (4, -0.7)]),
            _ => row(-9.0, &[(EOS, -0.2)]),
        };
        assert_eq!(go(cfg(2, 10), f).0, vec![S, 3, EOS]);
        // All-equal rows: the lowest token ids win everywhere.
        let flat = |_: &[u32]| vec![-1.0; V];
        let (out, _) = go(cfg(2, 4), flat);
        assert_eq!(out, vec![S, 0, 0, 0]);
        let mut bs = BeamSearch::new(cfg(3, 10));
        let rules = bs.rules();
        let r: Vec<(u32, f32)> = (0..V as u32).map(|t| (t, -1.0)).collect();
        bs.advance(&rules, &[r.clone(), r.clone(), r]).unwrap();
        // Beams 1 and 2 start at -1e9: every running beam comes from beam 0, lowest tokens first.
        assert_eq!(bs.src(), &[0, 0, 0]);
        assert_eq!(bs.running(), &[vec![S, 0], vec![S, 1], vec![S, 3]]);
    }

    /// Step 1: EOS finishes at -0.3; step 2: [S, 3] finishes at -1.31 / 2 while [S, 3, 5] runs on at
    /// -0.32; step 3: [S, 3, 5, EOS] finishes at -0.33 / 3 = -0.11, the best of all.
    fn late_winner(s: &[u32]) -> Vec<f32> {
        match s {
            [S] => row(-9.0, &[(EOS, -0.3), (3, -0.31), (4, -2.0)]),
            [S, 3] => row(-9.0, &[(5, -0.01), (EOS, -1.0)]),
            [S, 3, 5] => row(-9.0, &[(EOS, -0.01)]),
            _ => row(-9.0, &[(EOS, -4.0)]),
        }
    }

    #[test]
    fn early_stopping_true_stops_at_num_beams_hypotheses_false_looks_further() {
        let (out, calls) = go(cfg(2, 10), late_winner);
        assert_eq!(out, vec![S, EOS]);
        assert_eq!(calls, 2);
        let mut c = cfg(2, 10);
        c.early_stopping = EarlyStopping::False;
        let (out, calls) = go(c, late_winner);
        assert_eq!(out, vec![S, 3, 5, EOS]);
        // Step 3 leaves running beams near -9: -9.3 / 3 cannot beat -0.3: stop.
        assert_eq!(calls, 3);
    }

    #[test]
    fn early_stopping_never_normalises_running_beams_at_max_length() {
        // After step 1: finished [EOS] at -0.3 (slot 2 empty, so nobody stops). After step 2 both slots
        // are full (worst -0.655). False: best running -0.32 / 2 = -0.16 > -0.655 goes on; a running
        // beam at -1.5 would stop False (-0.75) but not Never (-1.5 / 9 with max_length 10).
        let f = |s: &[u32]| match s {
            [S] => row(-9.0, &[(EOS, -0.3), (3, -0.31)]),
            [S, 3] => row(-9.0, &[(EOS, -1.0), (5, -1.19)]),
            [S, 3, 5] => row(-9.0, &[(EOS, -0.01), (6, -0.02)]),
            _ => row(-9.0, &[(EOS, -0.02)]),
        };
        let mut c = cfg(2, 10);
        c.early_stopping = EarlyStopping::False;
        let (out, calls) = go(c.clone(), f);
        // Finished after step 2: [S, EOS] -0.3, [S, 3, EOS] -0.655; running [S, 3, 5] -1.5 -> -0.75.
        assert_eq!((out, calls), (vec![S, EOS], 2));
        c.early_stopping = EarlyStopping::Never;
        let (out, calls) = go(c.clone(), f);
        // Never goes on: [S, 3, 5, EOS] -1.51 / 3 = -0.503 replaces -0.655; [S, 3, 5, 6, EOS] -1.54 / 4
        // = -0.385 then replaces it; the best stays [S, EOS].
        assert_eq!(out, vec![S, EOS]);
        assert!(calls > 3, "{calls}");
        // With penalty 0 Never behaves like False (current length).
        c.length_penalty = 0.0;
        let (_, calls0) = go(c, f);
        assert!(calls0 < calls);
    }

    #[test]
    fn max_length_bounds_and_forced_tokens_apply() {
        // Nothing ever ends by itself: stops at max_length with the best running beams as hypotheses;
        // forced BOS at step 1 and forced EOS at the last step (that one runs no decoder step).
        let f = |_: &[u32]| row(-9.0, &[(5, -0.1), (6, -0.2)]);
        let mut c = cfg(3, 5);
        c.processors.forced_bos_token_id = Some(0);
        c.processors.forced_eos_token_id = Some(EOS);
        let (out, calls) = go(c.clone(), f);
        assert_eq!(out, vec![S, 0, 5, 5, EOS]);
        assert_eq!(calls, 3);
        // The bigram rule: after [S, 5, 5] token 5 is banned (5 was followed by 5), after
        // [S, 5, 5, 6, 5] both 5 and 6 are, so the lowest of the rest (0) comes.
        let mut c = cfg(2, 6);
        c.processors.no_repeat_ngram_size = 2;
        let (out, _) = go(c, f);
        assert_eq!(out, vec![S, 5, 5, 6, 5, 0]);
        // max_length 1: no step at all.
        assert_eq!(go(cfg(2, 1), f), (vec![S], 0));
    }

    #[test]
    fn cancel_is_polled() {
        let mut src = Scripted {
            f: |_: &[u32]| vec![0.0; V],
            seqs: vec![Vec::new(); 2],
            calls: 0,
        };
        let r = block_on(run(cfg(2, 10), &mut src, &|| true));
        assert!(matches!(r, Err(Error::Cancelled)));
    }
}
