//! Progress and token callbacks of a task, and the token streamer that turns ids into text pieces.

use std::cell::RefCell;

use crate::processor::tokenizer::Florence2Tokenizer;

/// The stages of one task, in order (see the data flow in [`crate::pipeline`]). `Preprocess` and
/// `Vision` are skipped when the task runs on an [`crate::pipeline::EncodedImage`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Image -> pixels, prompt -> ids.
    Preprocess,
    /// DaViT + projector.
    Vision,
    /// Prompt embedding + BART encoder + cross-attention K/V.
    Encoder,
    /// Decoder steps (greedy or beam search).
    Decode,
    /// Ids -> text -> the task's answer.
    Postprocess,
}

impl Stage {
    pub fn name(self) -> &'static str {
        match self {
            Stage::Preprocess => "preprocess",
            Stage::Vision => "vision",
            Stage::Encoder => "encoder",
            Stage::Decode => "decode",
            Stage::Postprocess => "postprocess",
        }
    }
}

/// A token callback: the text a token adds to the answer, and its id.
pub type OnToken<'a> = &'a dyn Fn(&str, u32);

/// Callbacks of one task; both optional. They run on the task's thread.
#[derive(Clone, Copy, Default)]
pub struct Callbacks<'a> {
    /// Called as each stage starts.
    pub on_stage: Option<&'a dyn Fn(Stage)>,
    /// Called once per generated token (the start token excluded) with the text it adds to the
    /// decoded answer (empty while a multi-byte character is incomplete) and its id: as each token is
    /// chosen with greedy decoding, in order at the end with beam search (whose tokens are only final
    /// then).
    pub on_token: Option<OnToken<'a>>,
}

impl Callbacks<'_> {
    pub(crate) fn stage(&self, s: Stage) {
        if let Some(f) = self.on_stage {
            f(s);
        }
    }
}

/// Turns ids into the text each one adds (decoding with special tokens kept, as the answer is): the
/// decoded text grows by a piece per id, empty while a multi-byte character is incomplete.
#[derive(Default)]
pub(crate) struct Pieces {
    ids: Vec<u32>,
    emitted: usize,
}

impl Pieces {
    pub fn push(&mut self, tok: &Florence2Tokenizer, id: u32) -> String {
        self.ids.push(id);
        let text = tok.decode(&self.ids, false).unwrap_or_default();
        if text.ends_with('\u{FFFD}') || text.len() < self.emitted {
            String::new()
        } else {
            let piece = text.get(self.emitted..).unwrap_or_default().to_owned();
            self.emitted = text.len();
            piece
        }
    }
}

/// [`Pieces`] feeding an [`OnToken`] callback.
pub(crate) struct TokenStreamer<'a> {
    tok: &'a Florence2Tokenizer,
    on_token: Option<OnToken<'a>>,
    pieces: RefCell<Pieces>,
}

impl<'a> TokenStreamer<'a> {
    pub fn new(tok: &'a Florence2Tokenizer, on_token: Option<OnToken<'a>>) -> Self {
        TokenStreamer {
            tok,
            on_token,
            pieces: RefCell::new(Pieces::default()),
        }
    }

    pub fn push(&self, id: u32) {
        let Some(f) = self.on_token else { return };
        let piece = self.pieces.borrow_mut().push(self.tok, id);
        f(&piece, id);
    }
}
