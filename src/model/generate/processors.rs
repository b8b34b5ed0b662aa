//! The reference's logits processors, applied on the CPU as rules on the next token instead of on the
//! full logits (which never leave the GPU):
//!
//! 1. no-repeat-n-gram (`NoRepeatNGramLogitsProcessor`): tokens that would complete an n-gram already
//!    present in the sequence are banned (score -inf);
//! 2. forced BOS (`ForcedBOSTokenLogitsProcessor`): when the sequence holds only the decoder start token,
//!    the next token is `forced_bos_token_id`;
//! 3. forced EOS (`ForcedEOSTokenLogitsProcessor`): when the sequence is one short of `max_length`, the next
//!    token is `forced_eos_token_id`.
//!
//! The reference applies them in that order to the scores; a forced token wins over a ban (forcing sets
//! its score to 0 and every other score to -inf), which is what [`Processors::rule`] returns.

use std::collections::BTreeSet;

/// What the processors allow for the next token of one sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NextToken {
    /// Exactly this token (forced BOS / EOS).
    Forced(u32),
    /// Any token except these (sorted, distinct; empty = unconstrained).
    Banned(Vec<u32>),
}

/// The configured processors.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Processors {
    /// 0 = off.
    pub no_repeat_ngram_size: usize,
    pub forced_bos_token_id: Option<u32>,
    pub forced_eos_token_id: Option<u32>,
    /// The reference's `max_length`: decoder sequence length (start token included) at which
    /// generation stops; forced EOS applies when the sequence is `max_length - 1` long.
    pub max_length: usize,
}

impl Processors {
    /// The rule for the token following `seq` (decoder start token first).
    pub fn rule(&self, seq: &[u32]) -> NextToken {
        let cur_len = seq.len();
        if cur_len == 1 {
            if let Some(t) = self.forced_bos_token_id {
                return NextToken::Forced(t);
            }
        }
        if cur_len + 1 == self.max_length {
            if let Some(t) = self.forced_eos_token_id {
                return NextToken::Forced(t);
            }
        }
        NextToken::Banned(banned_ngram_tokens(seq, self.no_repeat_ngram_size))
    }
}

/// Tokens banned by the no-repeat-n-gram rule after `seq`: for every earlier occurrence of the last n-1
/// tokens, the token that followed it (the reference's `_get_ngrams` + `_get_generated_ngrams`).
pub fn banned_ngram_tokens(seq: &[u32], n: usize) -> Vec<u32> {
    let cur_len = seq.len();
    if n == 0 || cur_len + 1 < n {
        return Vec::new();
    }
    if n == 1 {
        // Every token already present completes a 1-gram.
        return seq
            .iter()
            .copied()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
    }
    let prefix = &seq[cur_len + 1 - n..];
    let mut out = BTreeSet::new();
    for w in seq.windows(n) {
        if w[..n - 1] == *prefix {
            out.insert(w[n - 1]);
        }
    }
    out.into_iter().collect()
}

/// Pick the next token from descending candidates `(id, score)` (ties already ordered lower id first),
/// skipping banned ids. `None` when every candidate is banned (the caller must look further).
pub fn pick(candidates: &[(u32, f32)], rule: &NextToken) -> Option<u32> {
    match rule {
        NextToken::Forced(t) => Some(*t),
        NextToken::Banned(b) => candidates
            .iter()
            .find(|(id, _)| b.binary_search(id).is_err())
            .map(|(id, _)| *id),
    }
}

/// Greedy choice over a full logits row: the first maximum among non-banned ids (NaN never wins).
pub fn argmax_allowed(logits: &[f32], rule: &NextToken) -> Option<u32> {
    match rule {
        NextToken::Forced(t) => Some(*t),
        NextToken::Banned(b) => {
            let mut best: Option<(u32, f32)> = None;
            for (i, &v) in logits.iter().enumerate() {
                let id = i as u32;
                if b.binary_search(&id).is_ok() || v.is_nan() {
                    continue;
                }
                if best.is_none_or(|(_, bv)| v > bv) {
                    best = Some((id, v));
                }
            }
            best.map(|(id, _)| id)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_bans_match_the_reference_definition() {
        // n = 2: after "... 7", every token that followed a 7 is banned.
        assert_eq!(banned_ngram_tokens(&[2, 7, 5, 7, 9, 7], 2), vec![5, 9]);
        // n = 3: the last two tokens (5, 7) occurred before, followed by 9.
        assert_eq!(banned_ngram_tokens(&[2, 5, 7, 9, 5, 7], 3), vec![9]);
        // Too short for any complete n-gram.
        assert_eq!(banned_ngram_tokens(&[2], 3), Vec::<u32>::new());
        assert_eq!(banned_ngram_tokens(&[2, 0], 3), Vec::<u32>::new());
        // cur_len + 1 == n: the prefix is the whole sequence, nothing precedes it.
        assert_eq!(banned_ngram_tokens(&[2, 2], 3), Vec::<u32>::new());
        // Off.
        assert_eq!(banned_ngram_tokens(&[1, 1, 1], 0), Vec::<u32>::new());
        // n = 1 bans everything seen.
        assert_eq!(banned_ngram_tokens(&[4, 2, 4], 1), vec![2, 4]);
        // Repeated token runs: (0, 0) followed by 0 at index 2.
        assert_eq!(banned_ngram_tokens(&[0, 0, 0, 0], 3), vec![0]);
    }

    #[test]
    fn forced_tokens_win_and_apply_at_the_reference_lengths() {
        let p = Processors {
            no_repeat_ngram_size: 3,
            forced_bos_token_id: Some(0),
            forced_eos_token_id: Some(2),
            max_length: 5,
        };
        assert_eq!(p.rule(&[2]), NextToken::Forced(0));
        assert_eq!(p.rule(&[2, 0]), NextToken::Banned(vec![]));
        assert_eq!(p.rule(&[2, 0, 9]), NextToken::Banned(vec![]));
        // Length 4 = max_length - 1: EOS forced even though nothing bans it.
        assert_eq!(p.rule(&[2, 0, 9, 9]), NextToken::Forced(2));
        // Without forced ids the rule is only the bans.
        let q = Processors {
            no_repeat_ngram_size: 2,
            max_length: 5,
            ..Default::default()
        };
        assert_eq!(q.rule(&[2]), NextToken::Banned(vec![]));
        assert_eq!(q.rule(&[2, 0, 2]), NextToken::Banned(vec![0]));
    }

    #[test]
    fn pick_skips_banned_and_ties_go_to_lower_ids() {
        let c = [(5, 3.0), (7, 3.0), (1, 2.0)];
        assert_eq!(pick(&c, &NextToken::Banned(vec![])), Some(5));
        assert_eq!(pick(&c, &NextToken::Banned(vec![5])), Some(7));
        assert_eq!(pick(&c, &NextToken::Banned(vec![1, 5, 7])), None);
        assert_eq!(pick(&c, &NextToken::Forced(9)), Some(9));
        let logits = [0.5, 2.0, f32::NAN, 2.0, -1.0];
        assert_eq!(argmax_allowed(&logits, &NextToken::Banned(vec![])), Some(1));
        assert_eq!(
            argmax_allowed(&logits, &NextToken::Banned(vec![1])),
            Some(3)
        );
        assert_eq!(
            argmax_allowed(&logits, &NextToken::Banned(vec![0, 1, 3, 4])),
            None
        );
    }
}
