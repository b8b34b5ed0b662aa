//! Decoding loops over the BART decoder: greedy ([`greedy`]) and beam search ([`beam`]; one decoder
//! batch row per beam, caches reordered on the GPU, cross-attention K/V shared), dispatched by
//! [`generate`] on `num_beams`.
//!
//! Readback per step is a few bytes: greedy reads the argmax id, or the top-16 ids when the
//! no-repeat-n-gram rule bans fewer than 16 tokens (the best allowed token is then among them); beam
//! search reads the top-16 (id, log-prob) pairs of every beam while each beam's bans + 2 x beams <= 16.
//! Only past that does a step read whole rows. A forced token (forced BOS / EOS) reads back nothing, and
//! a forced final token does not even run the decoder.

pub mod beam;
pub mod greedy;
pub mod job;
pub mod processors;

use serde_json::Value;

use crate::config::Florence2Config;
use crate::error::{Error, Result};

pub use job::{greedy, DecodeJob};
pub use processors::{NextToken, Processors};

/// Largest k the GPU top-k supports; with more bans than this a step reads its full logits row.
pub const TOPK_MAX: usize = 16;

/// Beam search's `early_stopping` (the reference's `True`, `False`, `"never"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EarlyStopping {
    /// Stop as soon as `num_beams` hypotheses are finished.
    #[default]
    True,
    /// Stop when the best running beam, length-normalised at its current length, cannot beat the worst
    /// finished hypothesis.
    False,
    /// Like `False`, but with a positive length penalty the running beam is normalised at `max_length`
    /// (the canonical beam search).
    Never,
}

impl std::str::FromStr for EarlyStopping {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "true" => Ok(EarlyStopping::True),
            "false" => Ok(EarlyStopping::False),
            "never" => Ok(EarlyStopping::Never),
            _ => Err(Error::Config(format!(
                "early_stopping must be true, false or never, got {s:?}"
            ))),
        }
    }
}

/// What [`DecodeJob::begin`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Begin {
    /// The generation is over.
    Done,
    /// This step needed no decoder run (forced final tokens) and is taken.
    Skipped,
    /// Run the decoder for the job's state at this position, then [`DecodeJob::record_pick`].
    Run(u32),
}

/// Florence-2's defaults (its checkpoints' generation settings / the model card).
pub const DEFAULT_NUM_BEAMS: usize = 3;
/// The model card's `max_new_tokens` (generation is also bounded by the decoder's position table).
pub const DEFAULT_MAX_NEW_TOKENS: usize = 1024;
pub const DEFAULT_NO_REPEAT_NGRAM_SIZE: usize = 3;
/// More beams than this are refused (each beam is a decoder batch row).
pub const MAX_BEAMS: usize = 64;

/// Settings of one generation call.
#[derive(Clone, Debug, PartialEq)]
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
    /// 1 = greedy decoding, more = beam search.
    pub num_beams: usize,
    /// Exponent of the generated length dividing a finished hypothesis' log-prob sum (beam search).
    pub length_penalty: f32,
    pub early_stopping: EarlyStopping,
}

fn check_id(name: &str, id: u32, vocab_size: usize) -> Result<()> {
    if u64::from(id) >= vocab_size as u64 {
        return Err(Error::Config(format!(
            "generation setting {name} = {id} is outside the vocabulary ({vocab_size} tokens)"
        )));
    }
    Ok(())
}

impl GenerateOptions {
    /// Settings from the model config: its eos / decoder start / forced ids, its `num_beams` and
    /// `no_repeat_ngram_size` when present (else Florence-2's 3 and 3), `early_stopping` true,
    /// `length_penalty` 1; `max_new_tokens` as given.
    pub fn from_config(cfg: &Florence2Config, max_new_tokens: usize) -> Self {
        GenerateOptions {
            max_new_tokens,
            num_beams: cfg
                .num_beams
                .filter(|&n| (1..=MAX_BEAMS).contains(&n))
                .unwrap_or(DEFAULT_NUM_BEAMS),
            length_penalty: 1.0,
            early_stopping: EarlyStopping::True,
            no_repeat_ngram_size: cfg
                .no_repeat_ngram_size
                .unwrap_or(DEFAULT_NO_REPEAT_NGRAM_SIZE),
            forced_bos_token_id: cfg.text.forced_bos_token_id,
            forced_eos_token_id: cfg.text.forced_eos_token_id,
            eos_token_ids: vec![cfg.text.eos_token_id],
            decoder_start_token_id: cfg.text.decoder_start_token_id,
        }
    }

    /// Override the settings with the keys a `generation_config.json` sets (`no_repeat_ngram_size`,
    /// `forced_bos_token_id`, `forced_eos_token_id`, `eos_token_id` (an id or a list),
    /// `decoder_start_token_id`, `num_beams` (1..=64), `length_penalty`, `early_stopping` (true, false or
    /// "never")); absent or null keys keep the current value.
    pub fn with_generation_config(mut self, json: &[u8]) -> Result<Self> {
        let bad =
            |k: &str, v: &Value| Error::Config(format!("generation_config.json: bad {k} {v}"));
        let v: Value = crate::json::parse_strict_slice(json)
            .map_err(|e| Error::Config(format!("generation_config.json: {e}")))?;
        let id = |k: &str| -> Result<Option<u32>> {
            match v.get(k).filter(|x| !x.is_null()) {
                None => Ok(None),
                Some(x) => x
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .map(Some)
                    .ok_or_else(|| bad(k, x)),
            }
        };
        if let Some(x) = v.get("no_repeat_ngram_size").filter(|x| !x.is_null()) {
            self.no_repeat_ngram_size =
                x.as_u64()
                    .filter(|&n| n <= 1 << 16)
                    .ok_or_else(|| bad("no_repeat_ngram_size", x))? as usize;
        }
        if let Some(t) = id("forced_bos_token_id")? {
            self.forced_bos_token_id = Some(t);
        }
        if let Some(t) = id("forced_eos_token_id")? {
            self.forced_eos_token_id = Some(t);
        }
        if let Some(t) = id("decoder_start_token_id")? {
            self.decoder_start_token_id = t;
        }
        if let Some(x) = v.get("num_beams").filter(|x| !x.is_null()) {
            self.num_beams = x
                .as_u64()
                .filter(|n| (1..=MAX_BEAMS as u64).contains(n))
                .ok_or_else(|| bad("num_beams", x))? as usize;
        }
        if let Some(x) = v.get("length_penalty").filter(|x| !x.is_null()) {
            self.length_penalty = x
                .as_f64()
                .map(|p| p as f32)
                .filter(|p| p.is_finite())
                .ok_or_else(|| bad("length_penalty", x))?;
        }
        match v.get("early_stopping").filter(|x| !x.is_null()) {
            None => {}
            Some(Value::Bool(true)) => self.early_stopping = EarlyStopping::True,
            Some(Value::Bool(false)) => self.early_stopping = EarlyStopping::False,
            Some(Value::String(s)) if s == "never" => self.early_stopping = EarlyStopping::Never,
            Some(x) => return Err(bad("early_stopping", x)),
        }
        match v.get("eos_token_id").filter(|x| !x.is_null()) {
            None => {}
            Some(Value::Array(a)) => {
                self.eos_token_ids = a
                    .iter()
                    .map(|x| {
                        x.as_u64()
                            .and_then(|n| u32::try_from(n).ok())
                            .ok_or_else(|| bad("eos_token_id", x))
                    })
                    .collect::<Result<_>>()?;
            }
            Some(_) => {
                if let Some(t) = id("eos_token_id")? {
                    self.eos_token_ids = vec![t];
                }
            }
        }
        Ok(self)
    }

    /// The reference's `max_length` (decoder sequence length incl. the start token), capped so that no
    /// position exceeds the decoder's position table.
    pub fn max_length(&self, max_positions: usize) -> usize {
        self.max_new_tokens
            .saturating_add(1)
            .min(max_positions.max(1))
    }

    /// Every token id of these settings (decoder start, forced BOS/EOS, EOS ids) must be inside the
    /// vocabulary: a `generation_config.json` comes from the network, and a forced id past the vocabulary
    /// would be fed to the GPU as an embedding row. Loaders call this once, right after reading the
    /// configs (a named [`Error::Config`]).
    pub fn check_ids(&self, vocab_size: usize) -> Result<()> {
        self.check_fed_ids(vocab_size)?;
        for &id in &self.eos_token_ids {
            check_id("eos_token_id", id, vocab_size)?;
        }
        Ok(())
    }

    /// The ids a generation can feed to the decoder (decoder start, forced BOS, forced EOS): greedy and
    /// beam search check these before the first step, since options are plain data a caller can change.
    /// (EOS ids are only compared with chosen tokens; an id that can never be chosen just never stops.)
    pub fn check_fed_ids(&self, vocab_size: usize) -> Result<()> {
        check_id(
            "decoder_start_token_id",
            self.decoder_start_token_id,
            vocab_size,
        )?;
        for (name, id) in [
            ("forced_bos_token_id", self.forced_bos_token_id),
            ("forced_eos_token_id", self.forced_eos_token_id),
        ] {
            if let Some(id) = id {
                check_id(name, id, vocab_size)?;
            }
        }
        Ok(())
    }

    /// Checks before a generation: 1..=64 beams, a finite length penalty.
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_BEAMS).contains(&self.num_beams) {
            return Err(Error::InvalidInput(format!(
                "num_beams {} is outside 1..={MAX_BEAMS}",
                self.num_beams
            )));
        }
        if !self.length_penalty.is_finite() {
            return Err(Error::InvalidInput(format!(
                "length_penalty {} is not finite",
                self.length_penalty
            )));
        }
        Ok(())
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

/// Observes one generation: `cancel` is polled before every decode step (true stops it with
/// [`Error::Cancelled`]); `on_token` gets every token of the answer (the start token excluded): as it is
/// chosen with greedy decoding, in order once the search ends with beam search (whose tokens are only
/// final then).
#[derive(Clone, Copy)]
pub struct Observer<'a> {
    pub cancel: &'a dyn Fn() -> bool,
    pub on_token: &'a dyn Fn(u32),
}

impl Default for Observer<'_> {
    /// Never cancelled, no token callback.
    fn default() -> Self {
        Observer {
            cancel: &|| false,
            on_token: &|_| {},
        }
    }
}

impl<'a> Observer<'a> {
    /// Only a cancellation hook.
    pub fn cancel(cancel: &'a dyn Fn() -> bool) -> Self {
        Observer {
            cancel,
            on_token: &|_| {},
        }
    }
}

/// Greedy decoding (`num_beams` 1) or beam search, as `opts` says, observed by `obs`. Returns the ids
/// with the decoder start token first.
pub async fn generate(
    decoder: &crate::model::bart::Decoder,
    gpu: &std::sync::Arc<crate::gpu::Device>,
    cross: &crate::model::bart::CrossKv,
    opts: &GenerateOptions,
    obs: Observer<'_>,
) -> Result<Vec<u32>> {
    opts.validate()?;
    if opts.max_length(decoder.max_positions()) <= 1 {
        return Ok(vec![opts.decoder_start_token_id]);
    }
    DecodeJob::new(decoder, gpu, cross, opts)?
        .run_alone(decoder, gpu, obs.cancel, obs.on_token)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> GenerateOptions {
        GenerateOptions {
            max_new_tokens: 7,
            no_repeat_ngram_size: 0,
            forced_bos_token_id: None,
            forced_eos_token_id: Some(2),
            eos_token_ids: vec![2],
            decoder_start_token_id: 2,
            num_beams: 1,
            length_penalty: 1.0,
            early_stopping: EarlyStopping::True,
        }
    }

    #[test]
    fn token_ids_outside_the_vocabulary_are_refused_by_name() {
        for (json, key) in [
            (
                &br#"{"forced_bos_token_id": 40}"#[..],
                "forced_bos_token_id",
            ),
            (
                br#"{"forced_eos_token_id": 4294967295}"#,
                "forced_eos_token_id",
            ),
            (br#"{"eos_token_id": [2, 32]}"#, "eos_token_id"),
            (
                br#"{"decoder_start_token_id": 32}"#,
                "decoder_start_token_id",
            ),
        ] {
            let o = base().with_generation_config(json).unwrap();
            let e = o.check_ids(32).unwrap_err();
            assert!(
                matches!(&e, Error::Config(m) if m.contains(key)),
                "{key}: {e}"
            );
        }
        base().check_ids(32).unwrap();
        assert!(
            base().check_ids(2).is_err(),
            "eos 2 is outside a 2-token vocabulary"
        );
    }

    #[test]
    fn generation_config_duplicate_keys_are_refused() {
        let e = base()
            .with_generation_config(br#"{"num_beams": 1, "num_beams": 64}"#)
            .unwrap_err();
        assert!(e.to_string().contains("num_beams"), "{e}");
    }

    #[test]
    fn generation_config_overrides_present_keys_only() {
        let o = base()
            .with_generation_config(
                br#"{"no_repeat_ngram_size": 3, "forced_bos_token_id": 0, "eos_token_id": [2, 5],
                     "num_beams": 3, "forced_eos_token_id": null}"#,
            )
            .unwrap();
        assert_eq!(o.no_repeat_ngram_size, 3);
        assert_eq!(o.forced_bos_token_id, Some(0));
        assert_eq!(o.forced_eos_token_id, Some(2));
        assert_eq!(o.eos_token_ids, vec![2, 5]);
        assert_eq!(o.max_new_tokens, 7);
        assert_eq!(o.num_beams, 3);
        assert_eq!(o.early_stopping, EarlyStopping::True);
        let o = base()
            .with_generation_config(br#"{"eos_token_id": 9}"#)
            .unwrap();
        assert_eq!(o.eos_token_ids, vec![9]);
        assert_eq!(o.num_beams, 1);
        let o = base()
            .with_generation_config(
                br#"{"early_stopping": "never", "length_penalty": 0.5, "num_beams": 4}"#,
            )
            .unwrap();
        assert_eq!(o.early_stopping, EarlyStopping::Never);
        assert_eq!(o.length_penalty, 0.5);
        assert_eq!(o.num_beams, 4);
        let o = base()
            .with_generation_config(br#"{"early_stopping": false}"#)
            .unwrap();
        assert_eq!(o.early_stopping, EarlyStopping::False);
        for bad in [
            &br#"{"eos_token_id": -1}"#[..],
            br#"{"forced_bos_token_id": "x"}"#,
            br#"{"no_repeat_ngram_size": 1e9}"#,
            br#"{"num_beams": 0}"#,
            br#"{"num_beams": 1000}"#,
            br#"{"early_stopping": "sometimes"}"#,
            br#"{"length_penalty": "x"}"#,
            br#"not json"#,
        ] {
            assert!(matches!(
                base().with_generation_config(bad),
                Err(Error::Config(_))
            ));
        }
    }

    #[test]
    fn max_length_is_capped_by_the_position_table() {
        let mut o = base();
        assert_eq!(o.max_length(1024), 8);
        o.max_new_tokens = usize::MAX;
        assert_eq!(o.max_length(1024), 1024);
        assert_eq!(o.processors(16).max_length, 16);
    }
}
