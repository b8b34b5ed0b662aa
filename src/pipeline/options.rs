//! Per-task generation settings: overrides on top of the pipeline's defaults (the model's
//! `generation_config.json`, then config.json, then Florence-2's defaults).

use crate::error::{Error, Result};
pub use crate::model::generate::DEFAULT_MAX_NEW_TOKENS;
use crate::model::generate::{EarlyStopping, GenerateOptions, MAX_BEAMS};

/// What one task may change; `None` keeps the pipeline's default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TaskOptions {
    /// New tokens after the decoder start token (default [`DEFAULT_MAX_NEW_TOKENS`]).
    pub max_new_tokens: Option<usize>,
    /// Beam width 1..=64; 1 is greedy decoding (and streams its tokens).
    pub num_beams: Option<usize>,
    /// 0 turns the rule off.
    pub no_repeat_ngram_size: Option<usize>,
    pub early_stopping: Option<EarlyStopping>,
    /// Must be finite.
    pub length_penalty: Option<f32>,
}

impl TaskOptions {
    /// Greedy decoding, otherwise the defaults.
    pub fn greedy() -> Self {
        TaskOptions {
            num_beams: Some(1),
            ..Default::default()
        }
    }

    /// `defaults` with these overrides, checked (beams in 1..=64, a finite length penalty).
    pub fn resolve(&self, defaults: &GenerateOptions) -> Result<GenerateOptions> {
        let mut g = defaults.clone();
        if let Some(n) = self.max_new_tokens {
            g.max_new_tokens = n;
        }
        if let Some(n) = self.num_beams {
            if !(1..=MAX_BEAMS).contains(&n) {
                return Err(Error::InvalidInput(format!(
                    "num_beams {n} is outside 1..={MAX_BEAMS}"
                )));
            }
            g.num_beams = n;
        }
        if let Some(n) = self.no_repeat_ngram_size {
            g.no_repeat_ngram_size = n;
        }
        if let Some(e) = self.early_stopping {
            g.early_stopping = e;
        }
        if let Some(p) = self.length_penalty {
            g.length_penalty = p;
        }
        g.validate()?;
        Ok(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> GenerateOptions {
        GenerateOptions {
            max_new_tokens: DEFAULT_MAX_NEW_TOKENS,
            no_repeat_ngram_size: 3,
            forced_bos_token_id: Some(0),
            forced_eos_token_id: Some(2),
            eos_token_ids: vec![2],
            decoder_start_token_id: 2,
            num_beams: 3,
            length_penalty: 1.0,
            early_stopping: EarlyStopping::True,
        }
    }

    #[test]
    fn overrides_apply_and_absent_ones_keep_the_defaults() {
        assert_eq!(
            TaskOptions::default().resolve(&defaults()).unwrap(),
            defaults()
        );
        let g = TaskOptions {
            max_new_tokens: Some(5),
            num_beams: Some(1),
            no_repeat_ngram_size: Some(0),
            early_stopping: Some(EarlyStopping::Never),
            length_penalty: Some(0.5),
        }
        .resolve(&defaults())
        .unwrap();
        assert_eq!(
            (g.max_new_tokens, g.num_beams, g.no_repeat_ngram_size),
            (5, 1, 0)
        );
        assert_eq!(
            (g.early_stopping, g.length_penalty),
            (EarlyStopping::Never, 0.5)
        );
        assert_eq!(g.forced_bos_token_id, Some(0));
    }

    #[test]
    fn bad_overrides_are_named_errors() {
        for o in [
            TaskOptions {
                num_beams: Some(0),
                ..Default::default()
            },
            TaskOptions {
                num_beams: Some(MAX_BEAMS + 1),
                ..Default::default()
            },
            TaskOptions {
                length_penalty: Some(f32::NAN),
                ..Default::default()
            },
        ] {
            let e = o.resolve(&defaults()).unwrap_err();
            assert!(matches!(e, Error::InvalidInput(_)), "{o:?}: {e}");
        }
    }
}
