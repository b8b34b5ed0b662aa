//! A hub model (`--model org/name[@revision]`) downloaded after the server binds: the GPU worker thread
//! resolves it through the hub cache before it loads, while `/health` answers `downloading` with the
//! progress the cache's observer reports and requests get the loading answer (503).
//!
//! Progress, as `/health` shows it (`progress`) — what the observer sees, nothing guessed:
//! - `bytes`: bytes on disk of the files downloaded so far in this run (a resumed file counts what its
//!   partial blob held); files already complete in the cache are not downloaded and not counted;
//! - `files_done`: files downloaded and verified in this run;
//! - `file`, `file_bytes`, `file_total`: the file being downloaded, its bytes on disk and its announced
//!   length (`null` when the hub gave none).
//!
//! The number of files is not known in advance (a sharded checkpoint names its shards in its index), so
//! there is no overall total. `/metrics` has the gauge `florence2_download_bytes` (= `bytes`).
//!
//! A failed download (404, checksum mismatch, offline with nothing cached) fails like a failed load:
//! `/health` says `failed` and the server exits with the error. SIGTERM during the download ends the
//! process without waiting for it; the partial blob (`blobs/ETAG.incomplete`) stays and the next start
//! resumes it with a range request.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use florence2_wasm::hub_cache::{DownloadProgress, ProgressObserver};

use super::worker::{Shared, DOWNLOADING};

/// What has been downloaded in this run, per file.
#[derive(Default)]
pub struct Progress {
    inner: Mutex<ProgressInner>,
}

#[derive(Default)]
struct ProgressInner {
    /// File -> bytes on disk.
    done: BTreeMap<String, u64>,
    files_done: u64,
    current: Option<DownloadProgress>,
}

impl Progress {
    fn record(&self, p: &DownloadProgress) {
        let Ok(mut s) = self.inner.lock() else {
            return;
        };
        s.done.insert(p.file.clone(), p.done);
        if p.finished {
            s.files_done += 1;
        }
        s.current = Some(p.clone());
    }

    /// Bytes on disk of the files downloaded so far.
    pub fn bytes(&self) -> u64 {
        self.inner
            .lock()
            .map(|s| s.done.values().sum())
            .unwrap_or(0)
    }

    /// `/health`'s `progress` object (see the module docs).
    pub fn json(&self) -> Value {
        let Ok(s) = self.inner.lock() else {
            return Value::Null;
        };
        let cur = s.current.as_ref();
        json!({
            "bytes": s.done.values().sum::<u64>(),
            "files_done": s.files_done,
            "file": cur.map(|p| p.file.clone()),
            "file_bytes": cur.map(|p| p.done),
            "file_total": cur.and_then(|p| p.total),
        })
    }

    /// The Prometheus gauge `florence2_download_bytes`.
    pub fn render(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "# HELP florence2_download_bytes Bytes of the hub model downloaded by this process.\n\
             # TYPE florence2_download_bytes gauge\n\
             florence2_download_bytes {}",
            self.bytes()
        );
    }
}

/// Resolve the hub id `model` to a snapshot directory, recording progress in `shared` (whose state
/// says [`DOWNLOADING`] meanwhile); the error's message on failure.
pub fn fetch(model: &Path, shared: &Arc<Shared>) -> Result<PathBuf, String> {
    shared.state.store(DOWNLOADING, Ordering::Release);
    let s = shared.clone();
    let observer = ProgressObserver::new(move |p| s.download.record(p));
    crate::cli::model_dir_observed(model, Some(observer)).map_err(|f| match f {
        crate::cli::Failure::Usage(m) | crate::cli::Failure::Run(m) => m,
    })
}
