//! `runTask`'s `onToken` on the native engine: each token's text and id reach the JS callback through a
//! thread-safe function, in order, and a last call with `null` text tells the JS side that every token
//! call before it has run (calls run first in, first out), so the task's promise settles after them.

use napi::threadsafe_function::{
    ErrorStrategy, ThreadSafeCallContext, ThreadsafeFunction, ThreadsafeFunctionCallMode,
};
use napi::{JsFunction, JsUnknown};

/// `(text, id)` of a token, or `(None, 0)`: the end of the task's tokens.
type TokenCall = (Option<String>, u32);

/// The JS `onToken` callback, callable from the task's pool thread.
pub struct TokenSink {
    f: ThreadsafeFunction<TokenCall, ErrorStrategy::Fatal>,
}

impl TokenSink {
    /// Wraps `f(text | null, id)` (on the JS thread, while the task is being set up).
    pub fn new(f: &JsFunction) -> napi::Result<Self> {
        let f = f.create_threadsafe_function(0, |ctx: ThreadSafeCallContext<TokenCall>| {
            let (text, id) = ctx.value;
            let text: JsUnknown = match text {
                Some(t) => ctx.env.create_string(&t)?.into_unknown(),
                None => ctx.env.get_null()?.into_unknown(),
            };
            Ok(vec![text, ctx.env.create_uint32(id)?.into_unknown()])
        })?;
        Ok(TokenSink { f })
    }

    /// Queues one token's call (never blocks the decoder: the queue is unbounded).
    pub fn token(&self, text: &str, id: u32) {
        self.f.call(
            (Some(text.to_string()), id),
            ThreadsafeFunctionCallMode::NonBlocking,
        );
    }

    /// Queues the end-of-tokens call.
    pub fn end(&self) {
        self.f
            .call((None, 0), ThreadsafeFunctionCallMode::NonBlocking);
    }
}
