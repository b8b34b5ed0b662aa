//! The beam bookkeeping in pure Rust: candidates, finished hypotheses, the early-stop heuristic, and
//! the plan of the next step.

use crate::error::{Error, Result};
use crate::model::generate::processors::{NextToken, Processors};
use crate::model::generate::{EarlyStopping, GenerateOptions};

/// The reference's "-1e9" (an impossible score that stays finite).
const NEG: f32 = -1.0e9;

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
