//! The push-style streaming loader: feed one safetensors file's bytes in order, in chunks of any size
//! (as `fetch()` delivers them). The header is parsed as soon as its bytes are there; after that each
//! chunk is routed to the tensor(s) it covers, converted to f32 and written straight into the tensor's
//! GPU buffer at the right offset. Chunks may split a tensor or an element anywhere (the converter keeps
//! the partial element; quantized `.qweight` rows are gathered whole, then copied or dequantized in
//! batches of at most 256 KiB of f32). Host memory held: the header bytes until parsed, the current chunk
//! and its f32 conversion (layout fix-ups are permutes on the GPU, so nothing else accumulates).
//!
//! ```ignore
//! let mut asm = Assembler::new(&gpu, &cfg, LoadOptions::default());
//! let mut s = StreamLoader::new("model.safetensors", Some(content_length));
//! while let Some(chunk) = body.next().await { s.feed(&mut asm, &chunk)?; }
//! s.finish(&mut asm)?;                       // one StreamLoader per shard
//! let weights = asm.finish()?;
//! ```

use crate::error::{Error, Result};
use crate::weights::assemble::{Assembler, TensorPlan, TensorWriter};
use crate::weights::header::{parse_header, Header, HeaderState, MAX_HEADER_LEN};

enum State {
    /// Collecting the header (`need`: bytes needed from the file start, once known).
    Header {
        buf: Vec<u8>,
    },
    Data(Box<DataState>),
    Done,
}

struct DataState {
    header: Header,
    plans: Vec<Option<TensorPlan>>,
    /// Index (file order) of the tensor the next data byte belongs to.
    next: usize,
    /// Bytes of the data section received so far.
    pos: u64,
    /// Writer of the tensor being received, if it is needed.
    cur: Option<TensorWriter>,
}

/// Consumes one safetensors file pushed in order.
pub struct StreamLoader {
    file: String,
    total_len: Option<u64>,
    received: u64,
    expect_names: Vec<String>,
    state: State,
}

impl StreamLoader {
    /// `total_len`: the file's length if known (Content-Length), checked against the header early.
    pub fn new(file: &str, total_len: Option<u64>) -> Self {
        StreamLoader {
            file: file.to_owned(),
            total_len,
            received: 0,
            expect_names: Vec::new(),
            state: State::Header { buf: Vec::new() },
        }
    }

    /// Tensors an index places in this file (each must be in its header).
    pub fn expect_names(mut self, names: impl IntoIterator<Item = String>) -> Self {
        self.expect_names = names.into_iter().collect();
        self
    }

    /// Bytes received so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// The parsed header, once it has arrived.
    pub fn header(&self) -> Option<&Header> {
        match &self.state {
            State::Data(d) => Some(&d.header),
            _ => None,
        }
    }

    /// Push the next bytes of the file.
    pub fn feed(&mut self, asm: &mut Assembler, mut chunk: &[u8]) -> Result<()> {
        // The caller's chunk counts as held while we process it.
        let chunk_len = chunk.len() as u64;
        asm.note_held(chunk_len);
        self.received = self.received.saturating_add(chunk.len() as u64);
        if let Some(total) = self.total_len {
            if self.received > total {
                return Err(Error::SafetensorsHeader {
                    file: self.file.clone(),
                    msg: format!("more than the announced {total} bytes arrived"),
                });
            }
        }
        while !chunk.is_empty() {
            match &mut self.state {
                State::Header { .. } => {
                    let used = self.feed_header(asm, chunk, chunk_len)?;
                    chunk = &chunk[used..];
                }
                State::Data(d) => {
                    let used = d.feed(asm, chunk)?;
                    chunk = &chunk[used..];
                    if d.next >= d.header.tensors.len() && d.cur.is_none() && !chunk.is_empty() {
                        return Err(Error::SafetensorsHeader {
                            file: self.file.clone(),
                            msg: "bytes after the last tensor's data".into(),
                        });
                    }
                }
                State::Done => {
                    return Err(Error::SafetensorsHeader {
                        file: self.file.clone(),
                        msg: "data after the end of the file".into(),
                    })
                }
            }
        }
        Ok(())
    }

    /// Takes the header's bytes from the front of `chunk` (of the caller's `chunk_len` bytes); once the
    /// header is whole, checks it, plans its tensors and moves on to the data. Returns the bytes taken.
    fn feed_header(&mut self, asm: &mut Assembler, chunk: &[u8], chunk_len: u64) -> Result<usize> {
        let State::Header { buf } = &mut self.state else {
            return Ok(0);
        };
        // Take only what the header needs; the rest is data.
        let need = header_need(buf, &self.file)?;
        let want = need.saturating_sub(buf.len() as u64) as usize;
        let take = want.min(chunk.len());
        buf.extend_from_slice(&chunk[..take]);
        asm.note_held(chunk_len + buf.capacity() as u64);
        match parse_header(buf, &self.file)? {
            HeaderState::NeedMore(total) => self.check_header_fits(total)?,
            HeaderState::Done(header) => {
                self.check_header(&header)?;
                let plans = asm.plan_header(&self.file, &header)?;
                asm.note_held(chunk_len);
                self.state = State::Data(Box::new(DataState {
                    header,
                    plans,
                    next: 0,
                    pos: 0,
                    cur: None,
                }));
            }
        }
        Ok(take)
    }

    /// A header that needs `total` bytes from the file start must fit in the announced length.
    fn check_header_fits(&self, total: u64) -> Result<()> {
        if let Some(len) = self.total_len {
            if total > len {
                return Err(Error::SafetensorsHeader {
                    file: self.file.clone(),
                    msg: format!(
                        "header length {} runs past the end of the {len}-byte file",
                        total - 8
                    ),
                });
            }
        }
        Ok(())
    }

    /// The parsed header must match the announced length and hold every tensor the index places here.
    fn check_header(&self, header: &Header) -> Result<()> {
        if let Some(len) = self.total_len {
            header.check_file_len(&self.file, len)?;
        }
        for n in &self.expect_names {
            if header.get(n).is_none() {
                return Err(Error::CheckpointIndex {
                    file: self.file.clone(),
                    msg: format!("index places tensor '{n}' in this shard, but it is not there"),
                });
            }
        }
        Ok(())
    }

    /// The file ended: every tensor must be complete.
    pub fn finish(mut self, asm: &mut Assembler) -> Result<()> {
        match std::mem::replace(&mut self.state, State::Done) {
            State::Header { buf } => {
                let need = header_need(&buf, &self.file)?.max(8);
                Err(Error::Truncated {
                    file: self.file,
                    expected: need,
                    got: self.received,
                })
            }
            State::Data(mut d) => {
                d.drain_empty(asm)?;
                let expected = d.header.data_start + d.header.data_len;
                if d.pos < d.header.data_len || d.cur.is_some() || d.next < d.header.tensors.len() {
                    return Err(Error::Truncated {
                        file: self.file,
                        expected,
                        got: self.received,
                    });
                }
                asm.note_held(0);
                Ok(())
            }
            State::Done => Ok(()),
        }
    }
}

/// Bytes needed from the file start to finish the header (8 until the length is known).
fn header_need(buf: &[u8], file: &str) -> Result<u64> {
    let Some(lb) = buf.get(..8) else {
        return Ok(8);
    };
    let mut a = [0u8; 8];
    a.copy_from_slice(lb);
    let n = u64::from_le_bytes(a);
    if n > MAX_HEADER_LEN {
        return Err(Error::SafetensorsHeader {
            file: file.to_owned(),
            msg: format!("header length {n} exceeds the {MAX_HEADER_LEN}-byte limit"),
        });
    }
    Ok(8 + n)
}

/// Bytes of the current tensor to take from a chunk: `min(remaining, available)`, computed in u64 and only
/// then narrowed (the result is at most `available`, so it fits usize on every target). Narrowing first
/// made a tensor of exactly 4 GiB a zero-byte step on wasm32: an endless loop.
pub fn step_len(remaining: u64, available: usize) -> usize {
    match usize::try_from(remaining) {
        Ok(r) => r.min(available),
        Err(_) => available,
    }
}

impl DataState {
    /// Route bytes to tensors; returns how many bytes were consumed (all, unless the data section ended).
    fn feed(&mut self, asm: &mut Assembler, chunk: &[u8]) -> Result<usize> {
        let mut used = 0usize;
        while used < chunk.len() {
            let Some(info) = self.header.tensors.get(self.next) else {
                break;
            };
            let (t_start, t_end) = (info.start, info.end);
            if self.pos == t_start && self.cur.is_none() {
                if let Some(plan) = self.plans.get_mut(self.next).and_then(Option::take) {
                    self.cur = Some(asm.begin(plan)?);
                }
            }
            let n = step_len(t_end - self.pos, chunk.len() - used);
            let piece = &chunk[used..used + n];
            if let Some(w) = self.cur.as_mut() {
                asm.push(w, piece)?;
            }
            used += n;
            self.pos += n as u64;
            if self.pos == t_end {
                if let Some(w) = self.cur.take() {
                    asm.finish_tensor(w)?;
                }
                self.next += 1;
            }
        }
        self.drain_empty(asm)?;
        Ok(used)
    }

    /// Complete zero-byte tensors sitting at the current position (they need no data).
    fn drain_empty(&mut self, asm: &mut Assembler) -> Result<()> {
        while self.cur.is_none() {
            let Some(info) = self.header.tensors.get(self.next) else {
                break;
            };
            if info.start != self.pos || info.end != self.pos {
                break;
            }
            if let Some(plan) = self.plans.get_mut(self.next).and_then(Option::take) {
                let w = asm.begin(plan)?;
                asm.finish_tensor(w)?;
            }
            self.next += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::step_len;

    #[test]
    fn step_len_never_truncates_the_remaining_count() {
        // 4 GiB, 4 GiB + 5 and u64::MAX remaining: the step is the whole chunk, never 0 or 5.
        for remaining in [1u64 << 32, (1 << 32) + 5, u64::MAX] {
            assert_eq!(step_len(remaining, 4096), 4096, "{remaining}");
        }
        assert_eq!(step_len(7, 4096), 7);
        assert_eq!(step_len(0, 4096), 0);
    }
}
