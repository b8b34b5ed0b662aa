//! The converted weights on disk: safetensors files written while the tensors stream in. Each tensor's
//! output bytes go to a spill file at an offset reserved when it begins (tensors sharing a PyTorch
//! storage fill at once); when a shard is complete (the next tensor would pass `--shard-size` and no
//! tensor is open) its header is written and its tensors copied after it, chunk by chunk. Host memory:
//! one copy chunk (the reader's chunk size) and the shard's pending header entries.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::weights::export::encode::OutTensor;
use crate::weights::load::{INDEX_FILE, SINGLE_FILE};

pub(crate) fn write_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::FileWrite {
        file: path.display().to_string(),
        msg: e.to_string(),
    }
}

#[derive(Debug)]
struct Entry {
    id: u64,
    t: OutTensor,
    /// Offset in the spill file.
    off: u64,
    written: u64,
    done: bool,
}

/// A tensor held back in a file of its own until the end (the LM head, until it is known whether it
/// is a tied copy of the shared embedding).
#[derive(Debug)]
struct Held {
    id: u64,
    t: OutTensor,
    path: PathBuf,
    file: File,
    written: u64,
}

/// Where a tensor's bytes are.
enum Place<'a> {
    Spill(u64),
    File(&'a Path, u64),
    Held(&'a File),
}

/// A finished shard: its temporary file, its tensors (name, output label, bytes).
#[derive(Debug)]
struct Shard {
    tmp: PathBuf,
    tensors: Vec<(String, &'static str, u64)>,
}

/// One written weights file.
#[derive(Clone, Debug)]
pub struct WrittenFile {
    pub name: String,
    /// Tensors (name, output label such as `f16` or `q4`, bytes).
    pub tensors: Vec<(String, &'static str, u64)>,
    /// The file's length.
    pub file_bytes: u64,
}

/// Writes the output tensors into one or more safetensors files in `dir`.
#[derive(Debug)]
pub struct ShardWriter {
    dir: PathBuf,
    shard_size: Option<u64>,
    /// Bytes copied (or compared) at once.
    copy_chunk: usize,
    spill_path: PathBuf,
    spill: File,
    spill_len: u64,
    entries: Vec<Entry>,
    /// Id of the next tensor.
    next_id: u64,
    /// Tensors of closed shards: id -> (file, offset of its bytes).
    placed: std::collections::BTreeMap<u64, (PathBuf, u64)>,
    held: Option<Held>,
    shards: Vec<Shard>,
    /// The safetensors `format` metadata written in every file (`pt`, or `mlx` for channels-last convs).
    pub format: String,
}

impl ShardWriter {
    /// `copy_chunk`: bytes copied (or compared) at once.
    pub fn new(dir: &Path, shard_size: Option<u64>, copy_chunk: usize) -> Result<Self> {
        let spill_path = dir.join(".tensors.spill");
        let spill = create_spill(&spill_path)?;
        Ok(ShardWriter {
            dir: dir.to_path_buf(),
            shard_size,
            copy_chunk: copy_chunk.max(4096),
            spill_path,
            spill,
            spill_len: 0,
            entries: Vec::new(),
            next_id: 0,
            placed: std::collections::BTreeMap::new(),
            held: None,
            shards: Vec::new(),
            format: "pt".into(),
        })
    }

    fn current_bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.t.byte_len()).sum()
    }

    /// Reserve the next tensor's place; `open`: tensors still being written (a shard only closes when
    /// none is). Returns its id.
    pub fn reserve(&mut self, t: OutTensor, open: usize) -> Result<u64> {
        let len = t.byte_len();
        if let Some(limit) = self.shard_size {
            let cur = self.current_bytes();
            if open == 0 && cur > 0 && cur + len > limit {
                self.close_shard()?;
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        self.entries.push(Entry {
            id,
            t,
            off: self.spill_len,
            written: 0,
            done: false,
        });
        self.spill_len += len;
        Ok(id)
    }

    /// Reserve a tensor held back in a file of its own until [`ShardWriter::close`] (at most one).
    pub fn reserve_held(&mut self, t: OutTensor) -> Result<u64> {
        if let Some(h) = &self.held {
            return Err(Error::FileWrite {
                file: t.name,
                msg: format!("'{}' is already held back", h.t.name),
            });
        }
        let path = self.dir.join(".held.spill");
        let file = create_spill(&path)?;
        let id = self.next_id;
        self.next_id += 1;
        self.held = Some(Held {
            id,
            t,
            path,
            file,
            written: 0,
        });
        Ok(id)
    }

    fn entry(&mut self, id: u64) -> Result<&mut Entry> {
        self.entries
            .iter_mut()
            .rev()
            .find(|e| e.id == id)
            .ok_or_else(|| Error::FileWrite {
                file: SINGLE_FILE.into(),
                msg: format!("no open tensor {id}"),
            })
    }

    /// The next output bytes of tensor `id`.
    pub fn write(&mut self, id: u64, bytes: &[u8]) -> Result<()> {
        if let Some(h) = self.held.as_mut().filter(|h| h.id == id) {
            let len = h.t.byte_len();
            if h.written + bytes.len() as u64 > len {
                return Err(Error::FileWrite {
                    file: h.t.name.clone(),
                    msg: format!("more than its {len} bytes"),
                });
            }
            h.file
                .write_all_at(bytes, h.written)
                .map_err(|e| write_err(&h.path, e))?;
            h.written += bytes.len() as u64;
            return Ok(());
        }
        let e = self.entry(id)?;
        let (off, name, len) = (e.off + e.written, e.t.name.clone(), e.t.byte_len());
        if e.written + bytes.len() as u64 > len {
            return Err(Error::FileWrite {
                file: name,
                msg: format!("more than its {len} bytes"),
            });
        }
        e.written += bytes.len() as u64;
        self.spill
            .write_all_at(bytes, off)
            .map_err(|e| write_err(&self.spill_path, e))
    }

    /// Tensor `id` is complete.
    pub fn finish(&mut self, id: u64) -> Result<()> {
        let (name, len, written) = match self.held.as_ref().filter(|h| h.id == id) {
            Some(h) => (h.t.name.clone(), h.t.byte_len(), h.written),
            None => {
                let e = self.entry(id)?;
                e.done = true;
                (e.t.name.clone(), e.t.byte_len(), e.written)
            }
        };
        if written != len {
            return Err(Error::Truncated {
                file: name,
                expected: len,
                got: written,
            });
        }
        Ok(())
    }

    /// The output tensor of `id`, while it is in the open shard or held back, and whether it is
    /// complete.
    fn find(&self, id: u64) -> Option<(&OutTensor, bool, Place<'_>)> {
        if let Some(h) = self.held.as_ref().filter(|h| h.id == id) {
            let done = h.written == h.t.byte_len();
            return Some((&h.t, done, Place::Held(&h.file)));
        }
        self.entries
            .iter()
            .find(|e| e.id == id)
            .map(|e| (&e.t, e.done, Place::Spill(e.off)))
    }

    /// Whether tensor `a` (complete, in the open shard, held back, or in a closed shard with `a_t` its
    /// entry) and the held-back tensor are byte for byte equal, with the same dtype and shape.
    pub fn held_equals(&self, a: u64, a_t: &OutTensor) -> Result<bool> {
        let Some(h) = self.held.as_ref() else {
            return Ok(false);
        };
        if h.written != h.t.byte_len() || h.t.dtype != a_t.dtype || h.t.shape != a_t.shape {
            return Ok(false);
        }
        let place = match self.find(a) {
            Some((_, false, _)) => return Ok(false),
            Some((_, true, p)) => p,
            None => match self.placed.get(&a) {
                Some((path, off)) => Place::File(path, *off),
                None => return Ok(false),
            },
        };
        let opened;
        let (src, base, src_path): (&File, u64, &Path) = match place {
            Place::Spill(off) => (&self.spill, off, &self.spill_path),
            Place::Held(f) => (f, 0, &h.path),
            Place::File(path, off) => {
                opened = File::open(path).map_err(|e| write_err(path, e))?;
                (&opened, off, path)
            }
        };
        let len = h.t.byte_len();
        let mut x = vec![0u8; self.copy_chunk.min(len as usize)];
        let mut y = x.clone();
        let mut pos = 0u64;
        while pos < len {
            let n = (len - pos).min(self.copy_chunk as u64) as usize;
            src.read_exact_at(&mut x[..n], base + pos)
                .map_err(|e| write_err(src_path, e))?;
            h.file
                .read_exact_at(&mut y[..n], pos)
                .map_err(|e| write_err(&h.path, e))?;
            if x[..n] != y[..n] {
                return Ok(false);
            }
            pos += n as u64;
        }
        Ok(true)
    }

    /// Forget the held-back tensor (a tied copy); returns its name.
    pub fn drop_held(&mut self) -> Result<Option<String>> {
        let Some(h) = self.held.take() else {
            return Ok(None);
        };
        drop(h.file);
        std::fs::remove_file(&h.path).map_err(|e| write_err(&h.path, e))?;
        Ok(Some(h.t.name))
    }

    /// Move the held-back tensor into the open shard (closing the shard first if it would pass the size).
    fn place_held(&mut self) -> Result<()> {
        let Some(h) = self.held.take() else {
            return Ok(());
        };
        let len = h.t.byte_len();
        if h.written != len {
            return Err(Error::Truncated {
                file: h.t.name,
                expected: len,
                got: h.written,
            });
        }
        let id = h.id;
        let t = h.t.clone();
        self.next_id = self.next_id.max(id + 1);
        let new = self.reserve(t, 0)?;
        let off = self.entry(new)?.off;
        let mut buf = vec![0u8; self.copy_chunk.min(len as usize)];
        let mut pos = 0u64;
        while pos < len {
            let n = (len - pos).min(self.copy_chunk as u64) as usize;
            h.file
                .read_exact_at(&mut buf[..n], pos)
                .map_err(|e| write_err(&h.path, e))?;
            self.spill
                .write_all_at(&buf[..n], off + pos)
                .map_err(|e| write_err(&self.spill_path, e))?;
            pos += n as u64;
        }
        let e = self.entry(new)?;
        e.written = len;
        e.done = true;
        drop(h.file);
        std::fs::remove_file(&h.path).map_err(|e| write_err(&h.path, e))
    }

    /// Write the current shard's file (header, then its tensors from the spill) under a temporary name.
    fn close_shard(&mut self) -> Result<()> {
        let kept: Vec<&Entry> = self.entries.iter().collect();
        if kept.is_empty() {
            self.entries.clear();
            return Ok(());
        }
        if let Some(e) = kept.iter().find(|e| !e.done) {
            return Err(Error::Truncated {
                file: e.t.name.clone(),
                expected: e.t.byte_len(),
                got: e.written,
            });
        }
        let mut header = serde_json::Map::new();
        let mut meta = serde_json::Map::new();
        meta.insert("format".into(), self.format.clone().into());
        header.insert("__metadata__".into(), meta.into());
        let mut pos = 0u64;
        let mut offsets = Vec::with_capacity(kept.len());
        for e in &kept {
            offsets.push((e.id, pos));
            let end = pos + e.t.byte_len();
            header.insert(
                e.t.name.clone(),
                serde_json::json!({
                    "dtype": e.t.dtype.as_str(),
                    "shape": e.t.shape,
                    "data_offsets": [pos, end],
                }),
            );
            pos = end;
        }
        let mut json = serde_json::to_vec(&serde_json::Value::Object(header))
            .map_err(|e| write_err(&self.dir, e))?;
        // Pad the header with spaces to a multiple of 8 bytes (the data section stays aligned).
        while json.len() % 8 != 0 {
            json.push(b' ');
        }
        let tmp = self.dir.join(format!(".shard-{}.tmp", self.shards.len()));
        let mut f = File::create(&tmp).map_err(|e| write_err(&tmp, e))?;
        let werr = |e: std::io::Error| write_err(&tmp, e);
        f.write_all(&(json.len() as u64).to_le_bytes())
            .map_err(werr)?;
        f.write_all(&json).map_err(werr)?;
        let mut buf = vec![0u8; self.copy_chunk];
        let mut tensors = Vec::with_capacity(kept.len());
        for e in &kept {
            let len = e.t.byte_len();
            self.spill
                .seek(SeekFrom::Start(e.off))
                .map_err(|x| write_err(&self.spill_path, x))?;
            let mut left = len;
            while left > 0 {
                let n = left.min(self.copy_chunk as u64) as usize;
                self.spill
                    .read_exact(&mut buf[..n])
                    .map_err(|x| write_err(&self.spill_path, x))?;
                f.write_all(&buf[..n]).map_err(werr)?;
                left -= n as u64;
            }
            tensors.push((e.t.name.clone(), e.t.label, len));
        }
        f.sync_all().map_err(werr)?;
        let data_start = 8 + json.len() as u64;
        for (id, off) in offsets {
            self.placed.insert(id, (tmp.clone(), data_start + off));
        }
        self.shards.push(Shard { tmp, tensors });
        self.entries.clear();
        self.spill
            .set_len(0)
            .map_err(|e| write_err(&self.spill_path, e))?;
        self.spill_len = 0;
        Ok(())
    }

    /// Write the last shard, name the files (`model.safetensors`, or `model-0000i-of-0000n.safetensors`
    /// and `model.safetensors.index.json`) and remove the spill file.
    pub fn close(mut self) -> Result<Vec<WrittenFile>> {
        self.place_held()?;
        self.close_shard()?;
        drop(self.spill);
        std::fs::remove_file(&self.spill_path).map_err(|e| write_err(&self.spill_path, e))?;
        let n = self.shards.len();
        let mut files = Vec::with_capacity(n);
        let mut weight_map = serde_json::Map::new();
        let mut total = 0u64;
        for (i, s) in self.shards.into_iter().enumerate() {
            let name = if n == 1 {
                SINGLE_FILE.to_owned()
            } else {
                format!("model-{:05}-of-{n:05}.safetensors", i + 1)
            };
            let path = self.dir.join(&name);
            std::fs::rename(&s.tmp, &path).map_err(|e| write_err(&path, e))?;
            let file_bytes = std::fs::metadata(&path)
                .map_err(|e| write_err(&path, e))?
                .len();
            for (t, _, b) in &s.tensors {
                weight_map.insert(t.clone(), name.clone().into());
                total += b;
            }
            files.push(WrittenFile {
                name,
                tensors: s.tensors,
                file_bytes,
            });
        }
        if n > 1 {
            let index = serde_json::json!({
                "metadata": {"total_size": total},
                "weight_map": weight_map,
            });
            write_json(&self.dir.join(INDEX_FILE), &index)?;
        }
        Ok(files)
    }
}

/// Write a JSON file, pretty, with a final newline.
pub(crate) fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    let mut s = serde_json::to_string_pretty(v).map_err(|e| write_err(path, e))?;
    s.push('\n');
    std::fs::write(path, s).map_err(|e| write_err(path, e))
}

/// Creates the spill file `path` for reading and writing; one left there by an earlier run is an
/// error, never overwritten.
fn create_spill(path: &Path) -> Result<File> {
    File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| write_err(path, e))
}
