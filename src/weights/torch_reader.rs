//! A PyTorch checkpoint read strictly in file order, in chunks of any size (a `fetch()` body, or ranged
//! reads of a local file), handing each storage's bytes to a [`StorageSink`] as they arrive. Host memory
//! held: the object pickle, or a local header, or a small record, at most.
//!
//! Two containers:
//! - **zip** (`torch.save` since 1.6): `PREFIX/data.pkl` (the object pickle: the state dict), small
//!   records (`.format_version`, `.storage_alignment`, `byteorder`: `little`, absent in older files),
//!   `PREFIX/data/KEY` per storage (raw little-endian elements), more small records, then the central
//!   directory, where reading stops. Entries are stored; torch pads their data to 64-byte alignment with
//!   an extra field (skipped). Torch 2.x defers every entry's sizes to a data descriptor after its data,
//!   so an entry's end is found without them: `data.pkl` ends where its pickle stops, a storage's length
//!   is its element count times its element size (from the pickle), a small record ends at the first
//!   descriptor whose sizes name its own length; each descriptor is checked against the length.
//! - **legacy** (`_use_new_zipfile_serialization=False`, `weights::torch_legacy`): five
//!   pickles (magic number, protocol 1001, system info, the object, the sorted storage keys), then per
//!   key a u64 element count and the storage's bytes.

use crate::error::{Error, Result};
use crate::weights::pickle::{read_pickle, Parsed, Value, MAX_PICKLE_LEN};
use crate::weights::torch::{state_dict, StateDict};
use crate::weights::zip::{find_descriptor, parse_descriptor, parse_local, Descriptor, Local};

/// Longest zip record of unknown size we read (`byteorder`, `version`, ... are a few bytes).
const MAX_SMALL_RECORD: usize = 64 << 10;

/// Receives what the reader finds.
pub trait StorageSink {
    /// The state dict, before any storage byte.
    fn state_dict(&mut self, sd: &StateDict) -> Result<()>;
    /// The next bytes of storage `index` (into [`StateDict::storages`]), from byte `offset` of it.
    fn storage_bytes(&mut self, index: usize, offset: u64, bytes: &[u8]) -> Result<()>;
}

/// Where the reader is.
pub(crate) enum State {
    /// The first bytes decide the container.
    Start,
    /// Zip: collecting a local header in `buf`.
    ZipHeader,
    /// Zip: `data.pkl` of unknown length, collected in `buf` until its pickle parses (tried again
    /// each time `buf` has doubled, and at the end of the input).
    ZipPickle { retry_at: usize },
    /// Zip: a record of known length collected in `buf`.
    ZipCollect { what: Record, len: u64 },
    /// Zip: a small record of unknown length collected in `buf` until its descriptor (positions before
    /// `scan` searched).
    ZipScan { what: Record, scan: usize },
    /// Zip: the data descriptor after an entry of `len` bytes, collected in `buf`.
    ZipDescriptor { len: u64 },
    /// Zip: skipping an entry's data.
    ZipSkip { left: u64, len: u64 },
    /// A storage's bytes (`pos` of `len` received).
    Storage { index: usize, pos: u64, len: u64 },
    /// Legacy: collecting the five pickles in `buf` (parsed again once it has doubled).
    LegacyPickles { retry_at: usize },
    /// Legacy: collecting the u64 element count of the storage `legacy_order[at]`.
    LegacyCount { at: usize },
    /// Nothing more is read (zip: the central directory; legacy: after the last storage).
    End,
}

/// A zip record the reader looks at.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Record {
    Pickle,
    ByteOrder,
    Other,
}

/// Reads one checkpoint pushed in order.
pub struct TorchReader {
    pub(crate) file: String,
    pub(crate) state: State,
    pub(crate) buf: Vec<u8>,
    /// Bytes already taken from earlier input that belong after a pickle: read before new input.
    pub(crate) replay: Vec<u8>,
    /// Zip: the archive's record prefix (`archive/`), once `data.pkl` is found.
    prefix: Option<String>,
    /// Zip: the current entry's name and whether a data descriptor follows its data.
    entry: (String, bool),
    pub(crate) sd: Option<StateDict>,
    /// Per storage: fully received.
    pub(crate) received: Vec<bool>,
    /// Legacy: storage indices in file order (from the key list), and the position of the current one.
    pub(crate) legacy_order: Vec<usize>,
    pub(crate) legacy_at: usize,
    zip: bool,
}

pub(crate) fn bad(file: &str, msg: impl Into<String>) -> Error {
    Error::TorchCheckpoint {
        file: file.to_owned(),
        msg: msg.into(),
    }
}

impl TorchReader {
    pub fn new(file: &str) -> Self {
        TorchReader {
            file: file.to_owned(),
            state: State::Start,
            buf: Vec::new(),
            replay: Vec::new(),
            prefix: None,
            entry: (String::new(), false),
            sd: None,
            received: Vec::new(),
            legacy_order: Vec::new(),
            legacy_at: 0,
            zip: false,
        }
    }

    /// The state dict, once its pickle was read.
    pub fn state_dict(&self) -> Option<&StateDict> {
        self.sd.as_ref()
    }

    /// Bytes the reader holds (header, pickle or record being collected).
    pub fn held(&self) -> u64 {
        (self.buf.capacity() + self.replay.capacity()) as u64
    }

    /// Push the next bytes.
    pub fn feed(&mut self, sink: &mut impl StorageSink, chunk: &[u8]) -> Result<()> {
        self.run(sink, chunk)?;
        while !self.replay.is_empty() {
            let r = std::mem::take(&mut self.replay);
            self.run(sink, &r)?;
        }
        Ok(())
    }

    fn run(&mut self, sink: &mut impl StorageSink, mut chunk: &[u8]) -> Result<()> {
        let mut idle = 0;
        while !chunk.is_empty() {
            let used = self.step(sink, chunk)?;
            if used == 0 && matches!(self.state, State::End) {
                if self.zip {
                    // The central directory and end records: not needed.
                    return Ok(());
                }
                return Err(bad(&self.file, "bytes after the last storage"));
            }
            // A step may use no bytes only to change state (an empty record); never twice running.
            idle = if used == 0 { idle + 1 } else { 0 };
            if idle > 2 {
                return Err(bad(&self.file, "the reader made no progress"));
            }
            chunk = &chunk[used..];
        }
        Ok(())
    }

    /// The input ended: every storage must have arrived whole.
    pub fn finish(mut self, sink: &mut impl StorageSink) -> Result<()> {
        // A pickle still waiting for its next retry is parsed now.
        match self.state {
            State::LegacyPickles { .. } => self.state = State::LegacyPickles { retry_at: 0 },
            State::ZipPickle { .. } => self.state = State::ZipPickle { retry_at: 0 },
            _ => {}
        }
        if matches!(
            self.state,
            State::LegacyPickles { .. } | State::ZipPickle { .. }
        ) {
            self.step(sink, &[])?;
            self.feed(sink, &[])?;
        }
        let Some(sd) = &self.sd else {
            return Err(self.truncated("the state dict"));
        };
        if !matches!(self.state, State::End) {
            let what = if self.zip {
                "the central directory"
            } else {
                "the last storage"
            };
            return Err(self.truncated(what));
        }
        if let Some(i) = self.received.iter().position(|r| !r) {
            let key = &sd.storages[i].key;
            return Err(bad(&self.file, format!("storage '{key}' is missing")));
        }
        Ok(())
    }

    fn truncated(&self, what: &str) -> Error {
        bad(
            &self.file,
            format!("the file ends before {what} (truncated?)"),
        )
    }

    /// One step of the state machine on `chunk`; returns the bytes it used.
    fn step(&mut self, sink: &mut impl StorageSink, chunk: &[u8]) -> Result<usize> {
        match self.state {
            State::Start => {
                let need = 2usize.saturating_sub(self.buf.len()).min(chunk.len());
                self.buf.extend_from_slice(&chunk[..need]);
                if self.buf.len() >= 2 {
                    self.start()?;
                }
                Ok(need)
            }
            State::ZipHeader => self.zip_header(chunk),
            State::ZipPickle { retry_at } => {
                if self.buffer_until(chunk, retry_at) {
                    Ok(chunk.len())
                } else {
                    self.zip_pickle(sink, chunk)
                }
            }
            State::ZipCollect { what, len } => self.zip_collect(sink, chunk, what, len),
            State::ZipScan { what, scan } => self.zip_scan(chunk, what, scan),
            State::ZipDescriptor { len } => self.zip_descriptor(chunk, len),
            State::Storage { index, pos, len } => self.storage(sink, chunk, index, pos, len),
            State::ZipSkip { left, len } => {
                let n = crate::weights::stream::step_len(left, chunk.len());
                let left = left - n as u64;
                if left == 0 {
                    self.entry_done(len);
                } else {
                    self.state = State::ZipSkip { left, len };
                }
                Ok(n)
            }
            State::LegacyPickles { retry_at } => {
                if self.buffer_until(chunk, retry_at) {
                    Ok(chunk.len())
                } else {
                    self.legacy_pickles(sink, chunk)
                }
            }
            State::LegacyCount { at } => self.legacy_count(chunk, at),
            State::End => Ok(0),
        }
    }

    /// Decide the container from the first two bytes (kept in `buf`, where the next state reads on).
    fn start(&mut self) -> Result<()> {
        match self.buf.as_slice() {
            [b'P', b'K'] => {
                self.zip = true;
                self.state = State::ZipHeader;
            }
            [0x80, 2..=5] => self.state = State::LegacyPickles { retry_at: 0 },
            _ => {
                return Err(bad(
                    &self.file,
                    "neither a zip archive nor a legacy PyTorch pickle stream",
                ))
            }
        }
        Ok(())
    }

    fn zip_header(&mut self, chunk: &[u8]) -> Result<usize> {
        let mut taken = 0;
        loop {
            match parse_local(&self.buf, &self.file)? {
                Local::NeedMore(n) => {
                    if !self.fill_to(n, chunk, &mut taken) {
                        return Ok(taken);
                    }
                }
                Local::End => {
                    self.buf.clear();
                    self.state = State::End;
                    return Ok(taken);
                }
                Local::Entry(e) => {
                    self.buf.clear();
                    self.entry = (e.name.clone(), e.descriptor);
                    self.begin_entry(&e.name, e.data_len)?;
                    return Ok(taken);
                }
            }
        }
    }

    /// Route an entry by its name. `len`: its size, unless deferred to its descriptor.
    fn begin_entry(&mut self, name: &str, len: Option<u64>) -> Result<()> {
        let Some(prefix) = self.prefix.clone() else {
            // `PREFIX/data.pkl` with a one-component prefix.
            let prefix = name
                .strip_suffix("data.pkl")
                .filter(|p| p.len() > 1 && p.find('/') == Some(p.len() - 1));
            if let Some(p) = prefix {
                self.prefix = Some(p.to_owned());
                return self.collect(Record::Pickle, len);
            }
            if name.contains("/data/") {
                return Err(bad(
                    &self.file,
                    format!("storage '{name}' comes before data.pkl (not a torch.save archive)"),
                ));
            }
            return self.collect(Record::Other, len);
        };
        let rest = name.strip_prefix(prefix.as_str()).unwrap_or("");
        if rest == "byteorder" {
            return self.collect(Record::ByteOrder, len);
        }
        let Some(key) = rest.strip_prefix("data/") else {
            return self.collect(Record::Other, len);
        };
        let sd = self
            .sd
            .as_ref()
            .ok_or_else(|| bad(&self.file, "no state dict"))?;
        let Some(index) = sd.storage_index(key) else {
            return Err(bad(
                &self.file,
                format!("storage '{key}' is not used by a state dict tensor"),
            ));
        };
        self.begin_storage(index, len)
    }

    /// Read a record: collect it (known length), parse it as it comes (a pickle), or find its end.
    fn collect(&mut self, what: Record, len: Option<u64>) -> Result<()> {
        self.state = match (what, len) {
            (Record::Other, Some(len)) if len > 0 => State::ZipSkip { left: len, len },
            (Record::Pickle, None) => State::ZipPickle { retry_at: 0 },
            (_, None) => State::ZipScan { what, scan: 0 },
            (_, Some(len)) => {
                let max = if what == Record::Pickle {
                    MAX_PICKLE_LEN as u64
                } else {
                    16
                };
                if len > max {
                    return Err(bad(
                        &self.file,
                        format!("a {len}-byte record exceeds {max} bytes"),
                    ));
                }
                State::ZipCollect { what, len }
            }
        };
        Ok(())
    }

    /// An entry's data ended after `len` bytes: its descriptor, if it has one, comes next.
    fn entry_done(&mut self, len: u64) {
        self.state = if self.entry.1 {
            State::ZipDescriptor { len }
        } else {
            State::ZipHeader
        };
    }

    /// Start a storage: once, and sized as its references say (`len`, when the header gives it).
    pub(crate) fn begin_storage(&mut self, index: usize, len: Option<u64>) -> Result<()> {
        let Some(s) = self.sd.as_ref().and_then(|sd| sd.storages.get(index)) else {
            return Err(bad(&self.file, "no state dict"));
        };
        if self.received.get(index) == Some(&true) {
            return Err(bad(
                &self.file,
                format!("storage '{}' appears twice", s.key),
            ));
        }
        let want = s.byte_len();
        if let Some(l) = len.filter(|&l| l != want) {
            let (n, d) = (s.numel, s.dtype.as_str());
            let msg = format!(
                "storage '{}' holds {l} bytes, its references say {want} ({n} x {d})",
                s.key
            );
            return Err(bad(&self.file, msg));
        }
        self.state = State::Storage {
            index,
            pos: 0,
            len: want,
        };
        if want == 0 {
            self.end_storage(index, 0);
        }
        Ok(())
    }

    fn end_storage(&mut self, index: usize, len: u64) {
        if let Some(r) = self.received.get_mut(index) {
            *r = true;
        }
        if self.zip {
            self.entry_done(len);
            return;
        }
        let at = self.legacy_at + 1;
        self.state = if at >= self.legacy_order.len() {
            State::End
        } else {
            State::LegacyCount { at }
        };
    }

    fn storage(
        &mut self,
        sink: &mut impl StorageSink,
        chunk: &[u8],
        index: usize,
        pos: u64,
        len: u64,
    ) -> Result<usize> {
        let n = crate::weights::stream::step_len(len - pos, chunk.len());
        sink.storage_bytes(index, pos, &chunk[..n])?;
        let pos = pos + n as u64;
        if pos == len {
            self.end_storage(index, len);
        } else {
            self.state = State::Storage { index, pos, len };
        }
        Ok(n)
    }

    fn zip_collect(
        &mut self,
        sink: &mut impl StorageSink,
        chunk: &[u8],
        what: Record,
        len: u64,
    ) -> Result<usize> {
        let want = (len as usize - self.buf.len()).min(chunk.len());
        self.buf.extend_from_slice(&chunk[..want]);
        if self.buf.len() as u64 == len {
            let data = std::mem::take(&mut self.buf);
            self.entry_done(len);
            self.record(sink, what, &data)?;
        }
        Ok(want)
    }

    /// A whole record of known length.
    fn record(&mut self, sink: &mut impl StorageSink, what: Record, data: &[u8]) -> Result<()> {
        match what {
            Record::Pickle => match read_pickle(data, &self.file)? {
                Parsed::Done(v, used) if used == data.len() => self.set_state_dict(sink, &v),
                Parsed::Done(..) => Err(bad(&self.file, "bytes after data.pkl's pickle")),
                Parsed::NeedMore => Err(Error::Pickle {
                    file: self.file.clone(),
                    msg: "data.pkl ends before its STOP opcode".into(),
                }),
            },
            Record::ByteOrder if data != b"little" => {
                let order = String::from_utf8_lossy(data);
                Err(bad(
                    &self.file,
                    format!("byte order '{order}' (only little-endian loads)"),
                ))
            }
            _ => Ok(()),
        }
    }

    /// Appends `chunk` to the buffer; true while the buffer stays short of `retry_at` bytes and the
    /// input goes on (the caller waits for more before parsing again).
    pub(crate) fn buffer_until(&mut self, chunk: &[u8], retry_at: usize) -> bool {
        self.buf.extend_from_slice(chunk);
        self.buf.len() < retry_at && !chunk.is_empty()
    }

    /// `data.pkl` without a size: parse it as it grows (the buffer holding `chunk` appended by
    /// [`TorchReader::buffer_until`]); it ends at its STOP opcode.
    fn zip_pickle(&mut self, sink: &mut impl StorageSink, chunk: &[u8]) -> Result<usize> {
        match read_pickle(&self.buf, &self.file)? {
            Parsed::NeedMore if chunk.is_empty() => Err(Error::Pickle {
                file: self.file.clone(),
                msg: "the input ends inside data.pkl".into(),
            }),
            Parsed::NeedMore => {
                let retry_at = (2 * self.buf.len()).max(1 << 12);
                self.state = State::ZipPickle { retry_at };
                Ok(chunk.len())
            }
            Parsed::Done(v, used) => {
                let data = std::mem::take(&mut self.buf);
                self.replay = data[used..].to_vec();
                self.set_state_dict(sink, &v)?;
                self.entry_done(used as u64);
                Ok(chunk.len())
            }
        }
    }

    /// A small record without a size: it ends at the first descriptor naming its length.
    fn zip_scan(&mut self, chunk: &[u8], what: Record, scan: usize) -> Result<usize> {
        let old = self.buf.len();
        let take = chunk.len().min(MAX_SMALL_RECORD + 16 - old);
        self.buf.extend_from_slice(&chunk[..take]);
        match find_descriptor(&self.buf, scan) {
            (Some(p), _) => {
                let data = std::mem::take(&mut self.buf);
                if what == Record::ByteOrder && &data[..p] != b"little" {
                    let order = String::from_utf8_lossy(&data[..p]);
                    return Err(bad(
                        &self.file,
                        format!("byte order '{order}' (only little-endian loads)"),
                    ));
                }
                self.state = State::ZipHeader;
                Ok((p + 16).saturating_sub(old))
            }
            (None, _) if self.buf.len() >= MAX_SMALL_RECORD + 16 => {
                let name = &self.entry.0;
                Err(bad(&self.file, format!("entry '{name}' has no size and no descriptor within {MAX_SMALL_RECORD} bytes")))
            }
            (None, scan) => {
                self.state = State::ZipScan { what, scan };
                Ok(take)
            }
        }
    }

    /// Moves bytes of `chunk[*taken..]` into the buffer until it holds `n`; false when none can move
    /// (the chunk is used up and the caller waits for more input).
    fn fill_to(&mut self, n: usize, chunk: &[u8], taken: &mut usize) -> bool {
        let want = (n - self.buf.len()).min(chunk.len() - *taken);
        if want == 0 {
            return false;
        }
        self.buf.extend_from_slice(&chunk[*taken..*taken + want]);
        *taken += want;
        true
    }

    /// The data descriptor after an entry of `len` bytes.
    fn zip_descriptor(&mut self, chunk: &[u8], len: u64) -> Result<usize> {
        let mut taken = 0;
        loop {
            match parse_descriptor(&self.buf, len, &self.entry.0, &self.file)? {
                Descriptor::NeedMore(n) => {
                    if !self.fill_to(n, chunk, &mut taken) {
                        return Ok(taken);
                    }
                }
                Descriptor::Len(_) => {
                    self.buf.clear();
                    self.state = State::ZipHeader;
                    return Ok(taken);
                }
            }
        }
    }

    pub(crate) fn set_state_dict(&mut self, sink: &mut impl StorageSink, v: &Value) -> Result<()> {
        let sd = state_dict(v, &self.file)?;
        self.received = vec![false; sd.storages.len()];
        sink.state_dict(&sd)?;
        self.sd = Some(sd);
        Ok(())
    }
}
