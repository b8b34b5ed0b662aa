//! Florence-2's tokenizer: BART byte-level BPE (`tokenizer.json`, loaded with the `tokenizers` crate) plus
//! the tokens the Florence-2 processor adds.
//!
//! HF-native `tokenizer.json` files carry every Florence-2 token already; the original checkpoints' files
//! carry only BART's 50265 tokens, and the reference processor then calls `add_special_tokens` with the
//! Florence-2 list, in order, so the new tokens take the next free ids (50265.. on the real vocabulary).
//! We do the same: a token already present keeps its id, a missing one is appended. Which case applies is
//! decided by looking the tokens up, never by hard-coded ids.
//!
//! Decoding is the `tokenizers` decode and nothing else: transformers >= 5 skips
//! `clean_up_tokenization_spaces` for BPE tokenizers, and no spaces are inserted around special tokens
//! (`</s><s>car<loc_53>...`), which is what Florence-2's post-processing parses.

use std::ops::Range;

use tokenizers::{AddedToken, Tokenizer};

use crate::error::{Error, Result};

/// Largest accepted tokenizer.json (the real one is 3.7 MB).
pub const MAX_TOKENIZER_JSON_BYTES: usize = 64 * 1024 * 1024;

/// Number of location tokens `<loc_0>`..`<loc_999>`.
pub const NUM_LOC_TOKENS: u32 = 1000;

const BEFORE_LOC: [&str; 4] = ["<od>", "</od>", "<ocr>", "</ocr>"];
const AFTER_LOC: [&str; 20] = [
    "<cap>",
    "</cap>",
    "<ncap>",
    "</ncap>",
    "<dcap>",
    "</dcap>",
    "<grounding>",
    "</grounding>",
    "<seg>",
    "</seg>",
    "<sep>",
    "<region_cap>",
    "</region_cap>",
    "<region_to_desciption>", // sic: the reference's spelling
    "</region_to_desciption>",
    "<proposal>",
    "</proposal>",
    "<poly>",
    "</poly>",
    "<and>",
];

/// The tokens the Florence-2 processor adds to BART's vocabulary, in the reference order
/// (`<od> </od> <ocr> </ocr> <loc_0>..<loc_999> <cap> ... <and>`; 1024 tokens).
pub fn florence_added_tokens() -> Vec<String> {
    let mut v: Vec<String> = BEFORE_LOC.iter().map(|s| s.to_string()).collect();
    v.extend((0..NUM_LOC_TOKENS).map(|i| format!("<loc_{i}>")));
    v.extend(AFTER_LOC.iter().map(|s| s.to_string()));
    v
}

fn tok_err(msg: impl Into<String>) -> Error {
    Error::Tokenizer(msg.into())
}

/// How the Florence-2 tokens were found in the loaded file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlorenceTokens {
    /// All of them were in the file (HF-native conversions).
    Present,
    /// None were: all were appended (original checkpoints' BART-only file).
    Added,
    /// Some were: the missing ones were appended, as the reference's `add_special_tokens` would.
    PartiallyAdded,
}

#[derive(Clone, Debug)]
pub struct Florence2Tokenizer {
    inner: Tokenizer,
    bos: u32,
    eos: u32,
    vocab_size: usize,
    loc: Range<u32>,
    florence_tokens: FlorenceTokens,
}

impl Florence2Tokenizer {
    /// Loads a `tokenizer.json` and makes sure every Florence-2 token exists (see the module docs).
    /// Hostile or malformed input returns [`Error::Tokenizer`]; truncation/padding settings in the file are
    /// disabled (prompt ids must never be cut or padded silently).
    pub fn from_json_bytes(bytes: &[u8]) -> Result<Self> {
        if bytes.len() > MAX_TOKENIZER_JSON_BYTES {
            return Err(tok_err(format!(
                "tokenizer.json is {} bytes (limit {MAX_TOKENIZER_JSON_BYTES})",
                bytes.len()
            )));
        }
        let mut inner = parse_guarded(bytes)?;
        inner
            .with_truncation(None)
            .map_err(|e| tok_err(format!("cannot disable truncation: {e}")))?;
        inner.with_padding(None);

        let wanted = florence_added_tokens();
        let present = wanted
            .iter()
            .filter(|t| inner.token_to_id(t).is_some())
            .count();
        let florence_tokens = if present == wanted.len() {
            FlorenceTokens::Present
        } else {
            let added: Vec<AddedToken> = wanted
                .iter()
                .map(|t| AddedToken::from(t.clone(), true))
                .collect();
            inner.add_special_tokens(&added);
            if present == 0 {
                FlorenceTokens::Added
            } else {
                FlorenceTokens::PartiallyAdded
            }
        };

        let id = |t: &str| {
            inner
                .token_to_id(t)
                .ok_or_else(|| tok_err(format!("tokenizer.json has no {t} token")))
        };
        let bos = id("<s>")?;
        let eos = id("</s>")?;
        let loc0 = id("<loc_0>")?;
        for i in 0..NUM_LOC_TOKENS {
            let t = format!("<loc_{i}>");
            if inner.token_to_id(&t) != loc0.checked_add(i) {
                return Err(tok_err(format!(
                    "location tokens are not contiguous: {t} is not id {loc0} + {i}"
                )));
            }
        }
        for t in &wanted {
            id(t)?;
        }
        let vocab_size = inner
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |&m| m as usize + 1);
        Ok(Florence2Tokenizer {
            inner,
            bos,
            eos,
            vocab_size,
            loc: loc0..loc0 + NUM_LOC_TOKENS,
            florence_tokens,
        })
    }

    /// Prompt ids as the reference processor builds them: `<s>` + tokens(prompt) + `</s>` (the prompt is
    /// the already-expanded task prompt, e.g. "What does the image describe?"). Added tokens written in
    /// the text (`<loc_52>`, `</s>`) are matched as tokens, as in the reference.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| tok_err(format!("encode failed: {e}")))?;
        let mut ids = Vec::with_capacity(enc.get_ids().len() + 2);
        ids.push(self.bos);
        ids.extend_from_slice(enc.get_ids());
        ids.push(self.eos);
        Ok(ids)
    }

    /// Token ids of `text` without `<s>`/`</s>`.
    pub fn encode_raw(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| tok_err(format!("encode failed: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes ids. Florence-2 post-processing needs `skip_special_tokens = false` (location tokens, `<s>`,
    /// `</s>`, `<pad>` kept verbatim, no spaces added). Unknown ids are skipped (tokenizers' behaviour).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| tok_err(format!("decode failed: {e}")))
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// One more than the largest id (base vocabulary plus added tokens): 51289 for the original
    /// checkpoints, 51290 for HF-native files (`<image>`). The model's embedding may be padded larger.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Ids of `<loc_0>`..`<loc_999>` (contiguous, checked at load).
    pub fn loc_token_range(&self) -> Range<u32> {
        self.loc.clone()
    }

    /// `<loc_i>`'s bin, if `id` is a location token.
    pub fn loc_bin(&self, id: u32) -> Option<u32> {
        self.loc.contains(&id).then(|| id - self.loc.start)
    }

    pub fn bos_id(&self) -> u32 {
        self.bos
    }

    pub fn eos_id(&self) -> u32 {
        self.eos
    }

    /// `<pad>`'s id when the file has one.
    pub fn pad_id(&self) -> Option<u32> {
        self.inner.token_to_id("<pad>")
    }

    /// `<image>`'s id (HF-native files only; the model never needs it in the prompt).
    pub fn image_token_id(&self) -> Option<u32> {
        self.inner.token_to_id("<image>")
    }

    /// Whether the Florence-2 tokens came with the file or were added at load.
    pub fn florence_tokens(&self) -> FlorenceTokens {
        self.florence_tokens
    }
}

/// `Tokenizer::from_bytes`, with a panic inside the `tokenizers` crate turned into an error where
/// unwinding exists (native; on wasm32 a panic aborts). Malformed JSON is an ordinary error there.
/// A `tokenizer.json` for a converted checkpoint: the file as it is when it already carries every
/// Florence-2 token, else the file with the missing ones added exactly as [`Florence2Tokenizer`] adds
/// them at load (so the ids are the ones the loader would give).
pub fn complete_tokenizer_json(bytes: &[u8]) -> Result<Vec<u8>> {
    let tok = Florence2Tokenizer::from_json_bytes(bytes)?;
    if tok.florence_tokens == FlorenceTokens::Present {
        return Ok(bytes.to_vec());
    }
    let mut s = tok
        .inner
        .to_string(true)
        .map_err(|e| tok_err(format!("cannot write tokenizer.json: {e}")))?;
    s.push('\n');
    Ok(s.into_bytes())
}

/// BART's byte-level BPE tokenizer from a `vocab.json` and `merges.txt` (the original checkpoints' GPT-2
/// style files), with the structure of the hub's `tokenizer.json` files: byte-level pre-tokenizer and
/// decoder (no prefix space), RoBERTa post-processor (`<s>` .. `</s>`), `<s> <pad> </s> <unk>` special
/// and `<mask>` special with lstrip; then completed like [`complete_tokenizer_json`].
pub fn tokenizer_json_from_vocab_merges(vocab: &[u8], merges: &[u8]) -> Result<Vec<u8>> {
    use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
    use tokenizers::models::bpe::BPE;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::processors::roberta::RobertaProcessing;

    let v: std::collections::HashMap<String, u32> =
        serde_json::from_slice(vocab).map_err(|e| tok_err(format!("vocab.json: {e}")))?;
    let text = std::str::from_utf8(merges).map_err(|e| tok_err(format!("merges.txt: {e}")))?;
    let mut pairs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.starts_with("#version") || line.trim().is_empty() {
            continue;
        }
        let (a, b) = line
            .split_once(' ')
            .ok_or_else(|| tok_err(format!("merges.txt line {}: not two tokens", i + 1)))?;
        pairs.push((a.to_owned(), b.to_owned()));
    }
    let id = |t: &str| {
        v.get(t)
            .copied()
            .ok_or_else(|| tok_err(format!("vocab.json has no {t}")))
    };
    let (bos, eos) = (id("<s>")?, id("</s>")?);
    let bpe = BPE::builder()
        .vocab_and_merges(
            v.iter()
                .map(|(k, i)| (k.clone(), *i))
                .collect::<tokenizers::models::bpe::Vocab>(),
            pairs,
        )
        .build()
        .map_err(|e| tok_err(format!("vocab.json + merges.txt: {e}")))?;
    let mut tok = Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
    tok.with_decoder(Some(ByteLevelDecoder::default()));
    tok.with_post_processor(Some(
        RobertaProcessing::new(("</s>".into(), eos), ("<s>".into(), bos)).add_prefix_space(false),
    ));
    let specials: Vec<AddedToken> = ["<s>", "<pad>", "</s>", "<unk>"]
        .iter()
        .filter(|t| v.contains_key(**t))
        .map(|t| AddedToken::from(*t, true))
        .collect();
    tok.add_special_tokens(&specials);
    if v.contains_key("<mask>") {
        tok.add_special_tokens(&[AddedToken::from("<mask>", true).lstrip(true)]);
    }
    let json = tok
        .to_string(false)
        .map_err(|e| tok_err(format!("cannot write tokenizer.json: {e}")))?;
    complete_tokenizer_json(json.as_bytes())
}

fn parse_guarded(bytes: &[u8]) -> Result<Tokenizer> {
    match std::panic::catch_unwind(|| Tokenizer::from_bytes(bytes)) {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) => Err(tok_err(format!("invalid tokenizer.json: {e}"))),
        Err(_) => Err(tok_err("invalid tokenizer.json (the parser panicked)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn added_token_list_has_reference_shape() {
        let t = florence_added_tokens();
        assert_eq!(t.len(), 1024);
        assert_eq!(t[0], "<od>");
        assert_eq!(t[4], "<loc_0>");
        assert_eq!(t[1003], "<loc_999>");
        assert_eq!(t[1004], "<cap>");
        assert_eq!(t[1023], "<and>");
    }

    #[test]
    fn hostile_json_is_an_error_not_a_panic() {
        for bad in [
            &b""[..],
            b"{",
            b"[]",
            b"{}",
            b"{\"model\": 3}",
            b"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}",
            b"{\"model\": {\"type\": \"Nope\"}}",
            b"{\"version\":\"1.0\",\"added_tokens\":[{\"id\":4294967295,\"content\":\"x\"}],\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}",
        ] {
            let r = Florence2Tokenizer::from_json_bytes(bad);
            assert!(matches!(r, Err(Error::Tokenizer(_))), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
