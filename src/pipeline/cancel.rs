//! Cancellation of a task: anything that can answer "stop now?". The pipeline asks before the image is
//! encoded, before the prompt is encoded, and once per decode step.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Asked "stop now?" between stages and before every decode step.
pub trait Cancel {
    fn is_cancelled(&self) -> bool;
}

/// Any `Fn() -> bool` (e.g. `|| signal.aborted()` in the browser).
impl<F: Fn() -> bool> Cancel for F {
    fn is_cancelled(&self) -> bool {
        self()
    }
}

/// A shareable cancel flag: clone it, hand one clone to the task and call [`CancelToken::cancel`] on
/// another, from any thread (a server cancels a request whose client went away).
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    pub fn new() -> Self {
        Self::default()
    }

    /// Ask every task holding a clone of this token to stop at its next check.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

impl Cancel for CancelToken {
    fn is_cancelled(&self) -> bool {
        CancelToken::is_cancelled(self)
    }
}

/// Never cancelled.
#[derive(Clone, Copy, Debug, Default)]
pub struct NeverCancel;

impl Cancel for NeverCancel {
    fn is_cancelled(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_sees_the_cancel() {
        let t = CancelToken::new();
        let c = t.clone();
        assert!(!Cancel::is_cancelled(&c));
        t.cancel();
        assert!(Cancel::is_cancelled(&c));
        assert!(!NeverCancel.is_cancelled());
        assert!((|| true).is_cancelled());
    }
}
