//! PyTorch checkpoints (`pytorch_model.bin`, zip or legacy) into a [`TensorSink`] (the loader's
//! `Assembler`, the converter's writer): a [`TorchReader`]
//! reads the file in order and this sink plans the state dict's tensors like a safetensors header's,
//! then routes each storage's bytes to the writers of the tensors inside it (several at once where
//! tensors share a storage: tied weights). Natively the file is read in `chunk_bytes` ranges
//! ([`load_torch_source`]); the browser pushes `fetch()` chunks ([`TorchStreamLoader`]).

use crate::error::{Error, Result};
use crate::weights::plan::TensorPlan;
use crate::weights::sink::TensorSink;
use crate::weights::source::ByteSource;
use crate::weights::torch::StateDict;
use crate::weights::torch_reader::{StorageSink, TorchReader};

/// A weights file name that is a PyTorch checkpoint (`pytorch_model.bin`, its `-0000N-of-0000M.bin`
/// shards): anything ending in `.bin`.
pub fn is_torch_file(name: &str) -> bool {
    name.ends_with(".bin")
}

/// A planned tensor inside its storage.
struct Slot<W> {
    /// Byte range inside the storage.
    start: u64,
    end: u64,
    plan: Option<TensorPlan>,
    writer: Option<W>,
}

/// The [`StorageSink`] that fills a [`TensorSink`] (the loader's `Assembler`, the converter's writer).
struct AsmSink<'a, K: TensorSink> {
    asm: &'a mut K,
    file: String,
    expect_names: Vec<String>,
    /// Per storage: its planned tensors.
    slots: Vec<Vec<Slot<K::Writer>>>,
}

impl<K: TensorSink> StorageSink for AsmSink<'_, K> {
    fn state_dict(&mut self, sd: &StateDict) -> Result<()> {
        let header = sd.header();
        for n in &self.expect_names {
            if header.get(n).is_none() {
                return Err(Error::CheckpointIndex {
                    file: self.file.clone(),
                    msg: format!("index places tensor '{n}' in this shard, but it is not there"),
                });
            }
        }
        let plans = self.asm.plan_header(&self.file, &header)?;
        self.slots = (0..sd.storages.len()).map(|_| Vec::new()).collect();
        for (t, plan) in sd.tensors.iter().zip(plans) {
            let Some(plan) = plan else { continue };
            let (start, end) = t.byte_range();
            if start == end {
                // No bytes will come for an empty tensor.
                let w = self.asm.begin(plan)?;
                self.asm.finish_tensor(w)?;
                continue;
            }
            self.slots[t.storage].push(Slot {
                start,
                end,
                plan: Some(plan),
                writer: None,
            });
        }
        Ok(())
    }

    fn storage_bytes(&mut self, index: usize, offset: u64, bytes: &[u8]) -> Result<()> {
        let end = offset + bytes.len() as u64;
        let Some(slots) = self.slots.get_mut(index) else {
            return Ok(());
        };
        for s in slots.iter_mut() {
            if s.end <= offset || s.start >= end {
                continue;
            }
            if let Some(plan) = s.plan.take() {
                s.writer = Some(self.asm.begin(plan)?);
            }
            let Some(w) = s.writer.as_mut() else { continue };
            let from = (s.start.max(offset) - offset) as usize;
            let to = (s.end.min(end) - offset) as usize;
            self.asm.push(w, &bytes[from..to])?;
            if s.end <= end {
                if let Some(w) = s.writer.take() {
                    self.asm.finish_tensor(w)?;
                }
            }
        }
        Ok(())
    }
}

/// Consumes one PyTorch checkpoint pushed in order (the push-style twin of
/// [`crate::weights::StreamLoader`]).
pub struct TorchStreamLoader<W = crate::weights::assemble::TensorWriter> {
    reader: TorchReader,
    file: String,
    total_len: Option<u64>,
    received: u64,
    expect_names: Vec<String>,
    slots: Vec<Vec<Slot<W>>>,
}

impl<W> TorchStreamLoader<W> {
    /// `total_len`: the file's length if known (Content-Length).
    pub fn new(file: &str, total_len: Option<u64>) -> Self {
        TorchStreamLoader {
            reader: TorchReader::new(file),
            file: file.to_owned(),
            total_len,
            received: 0,
            expect_names: Vec::new(),
            slots: Vec::new(),
        }
    }

    /// Tensors an index places in this file (each must be in its state dict).
    pub fn expect_names(mut self, names: impl IntoIterator<Item = String>) -> Self {
        self.expect_names = names.into_iter().collect();
        self
    }

    /// Bytes received so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    fn sink<'a, K: TensorSink<Writer = W>>(&mut self, asm: &'a mut K) -> AsmSink<'a, K> {
        AsmSink {
            asm,
            file: self.file.clone(),
            expect_names: std::mem::take(&mut self.expect_names),
            slots: std::mem::take(&mut self.slots),
        }
    }

    /// Push the next bytes of the file.
    pub fn feed<K: TensorSink<Writer = W>>(&mut self, asm: &mut K, chunk: &[u8]) -> Result<()> {
        self.received = self.received.saturating_add(chunk.len() as u64);
        if self.total_len.is_some_and(|t| self.received > t) {
            return Err(Error::TorchCheckpoint {
                file: self.file.clone(),
                msg: "more than the announced bytes arrived".into(),
            });
        }
        let mut sink = self.sink(asm);
        let res = self.reader.feed(&mut sink, chunk);
        let held = self.reader.held() + chunk.len() as u64;
        self.expect_names = sink.expect_names;
        self.slots = sink.slots;
        asm.note_held(held);
        res
    }

    /// The file ended: every storage must be complete.
    pub fn finish<K: TensorSink<Writer = W>>(mut self, asm: &mut K) -> Result<()> {
        let mut sink = self.sink(asm);
        self.reader.finish(&mut sink)?;
        if let Some(s) = sink
            .slots
            .iter()
            .flatten()
            .find(|s| s.plan.is_some() || s.writer.is_some())
        {
            return Err(Error::Truncated {
                file: self.file,
                expected: s.end,
                got: s.start,
            });
        }
        asm.note_held(0);
        Ok(())
    }
}

/// Load one PyTorch checkpoint from a ranged source: read in order, `chunk_bytes` at a time.
pub async fn load_torch_source<S: ByteSource, K: TensorSink>(
    asm: &mut K,
    src: &mut S,
    expect_names: &[&str],
) -> Result<()> {
    let len = src.len().await?;
    let file = src.name().to_owned();
    let mut loader = TorchStreamLoader::new(&file, Some(len))
        .expect_names(expect_names.iter().map(|s| s.to_string()));
    let chunk = asm.chunk_bytes().max(16) as u64;
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(chunk) as usize;
        let bytes = src.read_range(off, n).await?;
        loader.feed(asm, &bytes)?;
        off += n as u64;
    }
    loader.finish(asm)
}
