//! Download progress as the library reports it: an observer called with each file's bytes done and
//! total (the CLI draws a bar from it; the server's `/health` and a Node addon can show it too).

use std::fmt;
use std::sync::Arc;

/// One file's download state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DownloadProgress {
    /// `ORG/NAME/FILE`.
    pub file: String,
    /// Bytes on disk (a resumed download starts at what the partial file held).
    pub done: u64,
    /// The announced length, when the hub gave one.
    pub total: Option<u64>,
    /// The file is complete and verified (the last call for it).
    pub finished: bool,
}

/// A callback for [`DownloadProgress`], called on the downloading thread after every chunk written.
#[derive(Clone)]
pub struct ProgressObserver(Arc<dyn Fn(&DownloadProgress) + Send + Sync>);

impl ProgressObserver {
    pub fn new(f: impl Fn(&DownloadProgress) + Send + Sync + 'static) -> ProgressObserver {
        ProgressObserver(Arc::new(f))
    }

    pub fn report(&self, p: &DownloadProgress) {
        (self.0)(p)
    }
}

impl fmt::Debug for ProgressObserver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ProgressObserver")
    }
}
