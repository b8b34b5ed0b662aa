//! Decoding loops over the BART decoder: greedy now, beam search next (the decoder state already keeps
//! one cache row per beam and reorders caches on the GPU).
//!
//! Readback per step is a few bytes: the argmax id, or the top-16 ids when the no-repeat-n-gram rule bans
//! fewer than 16 tokens (the best allowed token is then among them); the logits stay on the GPU. A
//! forced token (forced BOS / EOS) reads back nothing, and a forced final token does not even run the
//! decoder.

pub mod greedy;
pub mod processors;

use crate::model::config::Florence2Config;

pub use greedy::greedy;
pub use processors::{NextToken, Processors};

/// Largest k the GPU top-k supports; with more bans than this a step reads its full logits row.
pub const TOPK_MAX: usize = 16;

/// Settings of one generation call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenerateOptions {
    /// New tokens after the decoder start token (also bounded by max_position_embeddings).
    pub max_new_tokens: usize,
    /// 0 = off.
    pub no_repeat_ngram_size: usize,
    pub forced_bos_token_id: Option<u32>,
    pub forced_eos_token_id: Option<u32>,
    /// Generation stops after any of these.
    pub eos_token_ids: Vec<u32>,
    pub decoder_start_token_id: u32,
}

impl GenerateOptions {
    /// Settings from the model config: its eos / decoder start / forced ids and its
    /// `no_repeat_ngram_size` when present; `max_new_tokens` as given.
    pub fn from_config(cfg: &Florence2Config, max_new_tokens: usize) -> Self {
        GenerateOptions {
            max_new_tokens,
            no_repeat_ngram_size: cfg.no_repeat_ngram_size.unwrap_or(0),
            forced_bos_token_id: cfg.text.forced_bos_token_id,
            forced_eos_token_id: cfg.text.forced_eos_token_id,
            eos_token_ids: vec![cfg.text.eos_token_id],
            decoder_start_token_id: cfg.text.decoder_start_token_id,
        }
    }

    /// The reference's `max_length` (decoder sequence length incl. the start token), capped so that no
    /// position exceeds the decoder's position table.
    pub fn max_length(&self, max_positions: usize) -> usize {
        self.max_new_tokens
            .saturating_add(1)
            .min(max_positions.max(1))
    }

    pub fn processors(&self, max_positions: usize) -> Processors {
        Processors {
            no_repeat_ngram_size: self.no_repeat_ngram_size,
            forced_bos_token_id: self.forced_bos_token_id,
            forced_eos_token_id: self.forced_eos_token_id,
            max_length: self.max_length(max_positions),
        }
    }
}
