//! The converted weights on disk: safetensors files written while the tensors stream in. Each tensor's
//! output bytes go to a spill file at an offset reserved when it begins (tensors sharing a PyTorch
//! storage fill at once); when a shard is complete (the next tensor would pass `--shard-size` and no
//! tensor is open) its header is written and its tensors copied after it, chunk by chunk. Host memory:
//! one copy chunk and the shard's pending header entries.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::weights::export::encode::OutTensor;
use crate::weights::load::{INDEX_FILE, SINGLE_FILE};

const COPY_CHUNK: usize = 8 << 20;

pub(crate) fn write_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::FileWrite {
        file: path.display().to_string(),
        msg: e.to_string(),
    }
}

#[derive(Debug)]
struct Entry {
    t: OutTensor,
    /// Offset in the spill file.
    off: u64,
    written: u64,
    done: bool,
    /// A tied copy found equal to another tensor: not written.
    dropped: bool,
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
    spill_path: PathBuf,
    spill: File,
    spill_len: u64,
    entries: Vec<Entry>,
    shards: Vec<Shard>,
    /// The safetensors `format` metadata written in every file (`pt`, or `mlx` for channels-last convs).
    pub format: String,
}

impl ShardWriter {
    pub fn new(dir: &Path, shard_size: Option<u64>) -> Result<Self> {
        let spill_path = dir.join(".tensors.spill");
        let spill = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&spill_path)
            .map_err(|e| write_err(&spill_path, e))?;
        Ok(ShardWriter {
            dir: dir.to_path_buf(),
            shard_size,
            spill_path,
            spill,
            spill_len: 0,
            entries: Vec::new(),
            shards: Vec::new(),
            format: "pt".into(),
        })
    }

    /// Shards written so far.
    pub fn shards_closed(&self) -> usize {
        self.shards.len()
    }

    fn current_bytes(&self) -> u64 {
        self.entries
            .iter()
            .filter(|e| !e.dropped)
            .map(|e| e.t.byte_len())
            .sum()
    }

    /// Reserve the next tensor's place; `open`: tensors still being written (a shard only closes when
    /// none is). Returns its slot.
    pub fn reserve(&mut self, t: OutTensor, open: usize) -> Result<usize> {
        let len = t.byte_len();
        if let Some(limit) = self.shard_size {
            let cur = self.current_bytes();
            if open == 0 && cur > 0 && cur + len > limit {
                self.close_shard()?;
            }
        }
        self.entries.push(Entry {
            t,
            off: self.spill_len,
            written: 0,
            done: false,
            dropped: false,
        });
        self.spill_len += len;
        Ok(self.entries.len() - 1)
    }

    fn entry(&mut self, slot: usize) -> Result<&mut Entry> {
        self.entries.get_mut(slot).ok_or_else(|| Error::FileWrite {
            file: SINGLE_FILE.into(),
            msg: format!("no tensor in slot {slot}"),
        })
    }

    /// The next output bytes of the tensor in `slot`.
    pub fn write(&mut self, slot: usize, bytes: &[u8]) -> Result<()> {
        let e = self.entry(slot)?;
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

    /// The tensor in `slot` is complete.
    pub fn finish(&mut self, slot: usize) -> Result<()> {
        let e = self.entry(slot)?;
        if e.written != e.t.byte_len() {
            return Err(Error::Truncated {
                file: e.t.name.clone(),
                expected: e.t.byte_len(),
                got: e.written,
            });
        }
        e.done = true;
        Ok(())
    }

    /// The output tensor of `slot` (while its shard is open).
    pub fn tensor(&self, slot: usize) -> Option<&OutTensor> {
        self.entries.get(slot).map(|e| &e.t)
    }

    /// Drop the tensor in `copy` if it is complete and byte for byte the one in `orig` (same dtype and
    /// shape): a tied copy. Returns whether it was dropped.
    pub fn drop_if_equal(&mut self, orig: usize, copy: usize) -> Result<bool> {
        let (Some(a), Some(b)) = (self.entries.get(orig), self.entries.get(copy)) else {
            return Ok(false);
        };
        if !(a.done && b.done) || a.t.dtype != b.t.dtype || a.t.shape != b.t.shape {
            return Ok(false);
        }
        let (ao, bo, len) = (a.off, b.off, a.t.byte_len());
        let mut x = vec![0u8; COPY_CHUNK.min(len as usize)];
        let mut y = x.clone();
        let mut pos = 0u64;
        while pos < len {
            let n = (len - pos).min(COPY_CHUNK as u64) as usize;
            let rd = |buf: &mut [u8], at: u64| {
                self.spill
                    .read_exact_at(buf, at)
                    .map_err(|e| write_err(&self.spill_path, e))
            };
            rd(&mut x[..n], ao + pos)?;
            rd(&mut y[..n], bo + pos)?;
            if x[..n] != y[..n] {
                return Ok(false);
            }
            pos += n as u64;
        }
        if let Some(b) = self.entries.get_mut(copy) {
            b.dropped = true;
        }
        Ok(true)
    }

    /// Write the current shard's file (header, then its tensors from the spill) under a temporary name.
    fn close_shard(&mut self) -> Result<()> {
        let kept: Vec<&Entry> = self.entries.iter().filter(|e| !e.dropped).collect();
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
        for e in &kept {
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
        let mut buf = vec![0u8; COPY_CHUNK];
        let mut tensors = Vec::with_capacity(kept.len());
        for e in &kept {
            let len = e.t.byte_len();
            self.spill
                .seek(SeekFrom::Start(e.off))
                .map_err(|x| write_err(&self.spill_path, x))?;
            let mut left = len;
            while left > 0 {
                let n = left.min(COPY_CHUNK as u64) as usize;
                self.spill
                    .read_exact(&mut buf[..n])
                    .map_err(|x| write_err(&self.spill_path, x))?;
                f.write_all(&buf[..n]).map_err(werr)?;
                left -= n as u64;
            }
            tensors.push((e.t.name.clone(), e.t.label, len));
        }
        f.sync_all().map_err(werr)?;
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
