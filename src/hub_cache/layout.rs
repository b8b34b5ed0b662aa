//! The Hugging Face cache layout of one model repository, as `huggingface_hub` writes it:
//!
//! ```text
//! CACHE/.locks/models--ORG--NAME/ETAG.lock   held while one process downloads the blob
//! CACHE/models--ORG--NAME/
//!   blobs/ETAG                      the file's bytes, named by its ETag (sha256 for LFS files)
//!   blobs/ETAG.incomplete           a partial download, resumed by the next run
//!   refs/REVISION                   the commit a branch or tag pointed to when last fetched
//!   snapshots/COMMIT/FILE           a relative link to ../../blobs/ETAG (a copy where links fail)
//!   .no_exist/COMMIT/FILE           an empty file: the repository has no FILE at COMMIT
//! ```
//!
//! Every name that comes from a server (commit, ETag) or an index (file names) is checked before it
//! becomes a path, so a hostile hub cannot write outside the repository's directory.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::weights::source::check_relative_name;

/// One repository's directory in the cache.
#[derive(Clone, Debug)]
pub struct RepoCache {
    root: PathBuf,
}

/// A revision as a path below `refs/`: letters, digits, `.`, `_`, `-` and `/`-separated parts (e.g.
/// `main`, `v1.0`, `refs/pr/1`, a commit hash), at most 255 bytes, no empty, `.` or `..` part.
pub fn is_revision(s: &str) -> bool {
    check_relative_name(s)
}

/// A commit hash or ETag as a file name: 1 to 128 letters, digits, `-` or `_`.
pub fn is_key(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// An ETag header as a blob name: `W/` and quotes dropped, then [`is_key`].
pub fn normalize_etag(raw: &str) -> Option<String> {
    let t = raw.trim();
    let t = t.strip_prefix("W/").unwrap_or(t);
    let t = t.trim_matches('"');
    is_key(t).then(|| t.to_owned())
}

fn io_err(path: &Path, e: std::io::Error) -> Error {
    Error::FileRead {
        file: path.display().to_string(),
        msg: e.to_string(),
    }
}

impl RepoCache {
    /// The directory of model repository `repo` (`ORG/NAME`) under the cache root `cache_dir`.
    pub fn new(cache_dir: &Path, repo: &str) -> RepoCache {
        RepoCache {
            root: cache_dir.join(format!("models--{}", repo.replace('/', "--"))),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn snapshot_dir(&self, commit: &str) -> PathBuf {
        self.root.join("snapshots").join(commit)
    }

    pub fn blob_path(&self, etag: &str) -> PathBuf {
        self.root.join("blobs").join(etag)
    }

    /// `CACHE/.locks/models--ORG--NAME/ETAG.lock`, the lock `huggingface_hub` takes around a blob's
    /// download.
    pub fn lock_path(&self, etag: &str) -> PathBuf {
        let repo = self.root.file_name().unwrap_or_default();
        let cache = self.root.parent().unwrap_or(&self.root);
        cache.join(".locks").join(repo).join(format!("{etag}.lock"))
    }

    /// Wait for and hold the exclusive lock on blob `etag` (released when the file is dropped), so
    /// that concurrent processes, this one's or `huggingface_hub`'s, download a blob once.
    pub fn lock_blob(&self, etag: &str) -> Result<std::fs::File> {
        let path = self.lock_path(etag);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
        }
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| io_err(&path, e))?;
        f.lock().map_err(|e| io_err(&path, e))?;
        Ok(f)
    }

    /// The commit `revision` names in the cache: a commit hash with a snapshot, or what `refs/REVISION`
    /// holds.
    pub fn commit_of(&self, revision: &str) -> Option<String> {
        if is_key(revision) && self.snapshot_dir(revision).is_dir() {
            return Some(revision.to_owned());
        }
        let c = std::fs::read_to_string(self.root.join("refs").join(revision)).ok()?;
        let c = c.trim();
        is_key(c).then(|| c.to_owned())
    }

    /// Record that `revision` points at `commit` (nothing for a revision that is the commit itself).
    pub fn write_ref(&self, revision: &str, commit: &str) -> Result<()> {
        if revision == commit {
            return Ok(());
        }
        let path = self.root.join("refs").join(revision);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
        }
        std::fs::write(&path, commit).map_err(|e| io_err(&path, e))
    }

    /// Make `snapshots/COMMIT/FILE` the blob `etag` (a relative link, or a copy where links fail).
    pub fn link(&self, commit: &str, file: &str, etag: &str) -> Result<PathBuf> {
        let dst = self.snapshot_dir(commit).join(file);
        let dir = dst.parent().unwrap_or(&self.root);
        std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
        // Replace what was there (an older blob of a moved branch, a broken link).
        if dst.symlink_metadata().is_ok() {
            std::fs::remove_file(&dst).map_err(|e| io_err(&dst, e))?;
        }
        let up = "../".repeat(2 + file.matches('/').count());
        let target = PathBuf::from(format!("{up}blobs/{etag}"));
        #[cfg(unix)]
        let linked = std::os::unix::fs::symlink(&target, &dst).is_ok();
        #[cfg(not(unix))]
        let linked = false;
        if !linked {
            std::fs::copy(self.blob_path(etag), &dst).map_err(|e| io_err(&dst, e))?;
        }
        Ok(dst)
    }

    /// Record that the repository has no `file` at `commit`.
    pub fn mark_missing(&self, commit: &str, file: &str) -> Result<()> {
        let path = self.root.join(".no_exist").join(commit).join(file);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
        }
        std::fs::write(&path, b"").map_err(|e| io_err(&path, e))
    }

    /// Whether the cache knows the repository has no `file` at `commit`.
    pub fn is_missing(&self, commit: &str, file: &str) -> bool {
        self.root
            .join(".no_exist")
            .join(commit)
            .join(file)
            .is_file()
    }
}
