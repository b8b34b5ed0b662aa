//! The bookkeeping against scripted log-probs.

use super::*;
use crate::model::generate::processors::Processors;
use crate::model::generate::EarlyStopping;
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
    async fn step(&mut self, s: &StepInputs) -> Result<Vec<Vec<(u32, f32)>>> {
        let (src, tokens, pos, want) = (&s.src, &s.tokens, s.pos, &s.want);
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
