//! Where a model's bytes come from. Model code never touches files: the one loader
//! ([`crate::weights::load::load_checkpoint`], under `Pipeline::load`) asks a [`ModelSource`] for small
//! JSON files whole and to load each weights file into an [`Assembler`].
//!
//! Any [`ModelFiles`] is a [`ModelSource`]: it serves each safetensors file as a [`ByteSource`] of byte
//! ranges, read by the ranged loader. Natively that is [`DirFiles`] / [`FileSource`] (positioned reads,
//! never the whole file); tests use [`MemFiles`] / [`MemSource`]. The browser's `Fetcher` is a
//! [`ModelSource`] of its own that streams each `fetch()` body into a [`crate::weights::StreamLoader`].
//!
//! The futures carry no `Send` bound: wasm is single-threaded and the native implementations resolve
//! immediately (`pollster::block_on` drives them).

#[cfg(not(target_arch = "wasm32"))]
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A random-access byte source (one file).
#[allow(clippy::len_without_is_empty)]
#[allow(async_fn_in_trait)]
pub trait ByteSource {
    /// A name for error messages (the file name).
    fn name(&self) -> &str;
    /// Total length in bytes.
    async fn len(&mut self) -> Result<u64>;
    /// Exactly `len` bytes starting at `start`; a short read is [`Error::Truncated`].
    async fn read_range(&mut self, start: u64, len: usize) -> Result<Vec<u8>>;
}

/// A model directory: small files read whole, safetensors files opened as [`ByteSource`]s.
#[allow(async_fn_in_trait)]
pub trait ModelFiles {
    type Source: ByteSource;
    /// The whole file (at most `max` bytes: more is an error), or `None` if it does not exist.
    async fn read_small(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>>;
    /// Open a (possibly large) file for ranged reads, or `None` if it does not exist.
    async fn open(&self, name: &str) -> Result<Option<Self::Source>>;
}

fn too_large(name: &str, max: u64) -> Error {
    Error::FileRead {
        file: name.to_owned(),
        msg: format!("larger than the {max}-byte limit"),
    }
}

/// A shard or file name as it appears in an index: relative, made of `/`-separated components of ASCII
/// letters, digits, `.`, `_` and `-` only, none of them `.` or `..` (so it can neither climb out of the
/// model directory nor change meaning when joined to a URL: no `?`, `#`, `%`, `\\`, `:`). At most 255 bytes.
pub fn check_relative_name(name: &str) -> bool {
    if name.is_empty() || name.len() > 255 || name.starts_with('/') {
        return false;
    }
    name.split('/').all(|c| {
        !c.is_empty()
            && c != "."
            && c != ".."
            && c.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    })
}

// ---- in memory -------------------------------------------------------------------------------------

/// An in-memory file (tests, or bytes already fetched).
#[derive(Clone, Debug)]
pub struct MemSource {
    name: String,
    data: std::sync::Arc<[u8]>,
}

impl MemSource {
    pub fn new(name: impl Into<String>, data: impl Into<std::sync::Arc<[u8]>>) -> Self {
        MemSource {
            name: name.into(),
            data: data.into(),
        }
    }
}

impl ByteSource for MemSource {
    fn name(&self) -> &str {
        &self.name
    }
    async fn len(&mut self) -> Result<u64> {
        Ok(self.data.len() as u64)
    }
    async fn read_range(&mut self, start: u64, len: usize) -> Result<Vec<u8>> {
        let total = self.data.len() as u64;
        let end = check_range(&self.name, start, len, total)?;
        Ok(self
            .data
            .get(start as usize..end as usize)
            .map(<[u8]>::to_vec)
            .unwrap_or_default())
    }
}

/// In-memory model files by name.
#[derive(Clone, Debug, Default)]
pub struct MemFiles {
    files: std::collections::BTreeMap<String, std::sync::Arc<[u8]>>,
}

impl MemFiles {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn insert(&mut self, name: impl Into<String>, data: impl Into<std::sync::Arc<[u8]>>) {
        self.files.insert(name.into(), data.into());
    }
}

impl ModelFiles for MemFiles {
    type Source = MemSource;
    async fn read_small(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>> {
        match self.files.get(name) {
            Some(d) if d.len() as u64 > max => Err(too_large(name, max)),
            d => Ok(d.map(|d| d.to_vec())),
        }
    }
    async fn open(&self, name: &str) -> Result<Option<MemSource>> {
        Ok(self
            .files
            .get(name)
            .map(|d| MemSource::new(name, d.clone())))
    }
}

// ---- native files ----------------------------------------------------------------------------------

/// A file on disk, read by positioned reads (never whole).
#[cfg(not(target_arch = "wasm32"))]
#[derive(Debug)]
pub struct FileSource {
    name: String,
    file: std::fs::File,
}

#[cfg(not(target_arch = "wasm32"))]
fn io_err(file: &str, e: std::io::Error) -> Error {
    Error::FileRead {
        file: file.to_owned(),
        msg: e.to_string(),
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl FileSource {
    /// Open a regular file (devices, FIFOs and directories are refused: [`crate::files::open_regular`]).
    pub fn open(path: &Path) -> Result<Self> {
        let name = path.display().to_string();
        let (file, _) = crate::files::open_regular(path)?;
        Ok(FileSource { name, file })
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl ByteSource for FileSource {
    fn name(&self) -> &str {
        &self.name
    }
    async fn len(&mut self) -> Result<u64> {
        Ok(self
            .file
            .metadata()
            .map_err(|e| io_err(&self.name, e))?
            .len())
    }
    async fn read_range(&mut self, start: u64, len: usize) -> Result<Vec<u8>> {
        use std::io::{Read, Seek, SeekFrom};
        let total = self.len().await?;
        let end = check_range(&self.name, start, len, total)?;
        self.file
            .seek(SeekFrom::Start(start))
            .map_err(|e| io_err(&self.name, e))?;
        let mut buf = vec![0u8; len];
        self.file.read_exact(&mut buf).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                Error::Truncated {
                    file: self.name.clone(),
                    expected: end,
                    got: total,
                }
            } else {
                io_err(&self.name, e)
            }
        })?;
        Ok(buf)
    }
}

/// A model directory on disk.
#[cfg(not(target_arch = "wasm32"))]
#[derive(Clone, Debug)]
pub struct DirFiles {
    dir: PathBuf,
}

#[cfg(not(target_arch = "wasm32"))]
impl DirFiles {
    pub fn new(dir: &Path) -> Self {
        DirFiles {
            dir: dir.to_path_buf(),
        }
    }

    fn path(&self, name: &str) -> Result<PathBuf> {
        if !check_relative_name(name) {
            return Err(Error::FileRead {
                file: name.to_owned(),
                msg: "not a plain relative file name".into(),
            });
        }
        Ok(self.dir.join(name))
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl ModelFiles for DirFiles {
    type Source = FileSource;
    async fn read_small(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>> {
        // Regular files only, at most `max` bytes (a `config.json` linked to /dev/zero reports length 0
        // and would never end).
        crate::files::read_capped_opt(&self.path(name)?, max)
    }
    async fn open(&self, name: &str) -> Result<Option<FileSource>> {
        let p = self.path(name)?;
        if !p.exists() {
            return Ok(None);
        }
        FileSource::open(&p).map(Some)
    }
}

/// The end of a read of `len` bytes at `start` of a `total`-byte file, which must stay inside it
/// ([`Error::Truncated`] otherwise).
fn check_range(name: &str, start: u64, len: usize, total: u64) -> Result<u64> {
    let end = start.saturating_add(len as u64);
    if end > total {
        return Err(Error::Truncated {
            file: name.to_owned(),
            expected: end,
            got: total,
        });
    }
    Ok(end)
}
