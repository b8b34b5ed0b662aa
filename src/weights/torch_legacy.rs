//! The legacy PyTorch container (`torch.save(..., _use_new_zipfile_serialization=False)`), read in
//! order by [`TorchReader`]: five pickles (the magic number, protocol version 1001, a system-info dict
//! that must say little-endian, the object: the state dict, the sorted list of storage keys), then per
//! key a u64 little-endian element count (checked against the pickle's) and the storage's raw bytes.

use crate::error::{Error, Result};
use crate::weights::pickle::{read_pickle, Parsed, Value, MAX_PICKLE_LEN};
use crate::weights::torch_reader::{bad, State, StorageSink, TorchReader};

/// The legacy format's magic number (its first pickle).
const LEGACY_MAGIC: i128 = 0x1950a86a20f9469cfc6c;
/// The legacy format's protocol version (its second pickle).
const LEGACY_PROTOCOL: i128 = 1001;

impl TorchReader {
    /// Legacy: the five pickles, parsed from the buffered input (the caller buffers with
    /// [`TorchReader::buffer_until`] and tries again each time the buffer has doubled, and at the end
    /// of the input); the bytes after them go on to the storages.
    pub(crate) fn legacy_pickles(
        &mut self,
        sink: &mut impl StorageSink,
        chunk: &[u8],
    ) -> Result<usize> {
        let data = std::mem::take(&mut self.buf);
        let Some(used) = self.legacy_parse(sink, &data)? else {
            if chunk.is_empty() {
                return Err(Error::Pickle {
                    file: self.file.clone(),
                    msg: "the input ends inside the legacy header pickles".into(),
                });
            }
            if data.len() > 2 * MAX_PICKLE_LEN {
                return Err(bad(&self.file, "the legacy header pickles are too long"));
            }
            self.state = State::LegacyPickles {
                retry_at: (2 * data.len()).max(1 << 12),
            };
            self.buf = data;
            return Ok(chunk.len());
        };
        self.replay = data[used..].to_vec();
        Ok(chunk.len())
    }

    /// Parse the five legacy pickles from `data`; `None` if it ends first.
    fn legacy_parse(&mut self, sink: &mut impl StorageSink, data: &[u8]) -> Result<Option<usize>> {
        let mut values = Vec::with_capacity(5);
        let mut pos = 0;
        for _ in 0..5 {
            match read_pickle(&data[pos..], &self.file)? {
                Parsed::Done(v, n) => {
                    values.push(v);
                    pos += n;
                }
                Parsed::NeedMore => return Ok(None),
            }
        }
        let [magic, proto, info, obj, keys] = values.as_slice() else {
            return Ok(None);
        };
        if !matches!(magic, Value::Int(LEGACY_MAGIC)) {
            return Err(bad(&self.file, "not a PyTorch file (wrong magic number)"));
        }
        if !matches!(proto, Value::Int(LEGACY_PROTOCOL)) {
            return Err(bad(&self.file, "unknown legacy protocol version"));
        }
        if !little_endian(info) {
            return Err(bad(
                &self.file,
                "written on a big-endian machine (only little-endian loads)",
            ));
        }
        self.set_state_dict(sink, obj)?;
        self.legacy_keys(keys)?;
        Ok(Some(pos))
    }

    /// The storage key list: the order of the storage records.
    fn legacy_keys(&mut self, keys: &Value) -> Result<()> {
        let Value::List(keys) = keys else {
            return Err(bad(&self.file, "the storage key list is not a list"));
        };
        let sd = self
            .sd
            .as_ref()
            .ok_or_else(|| bad(&self.file, "no state dict"))?;
        let mut seen = vec![false; sd.storages.len()];
        for k in keys.items.iter() {
            let Value::Str(k) = k else {
                return Err(bad(&self.file, "a storage key is not a string"));
            };
            let i = sd.storage_index(k).ok_or_else(|| {
                bad(
                    &self.file,
                    format!("storage '{k}' is not used by a state dict tensor"),
                )
            })?;
            if std::mem::replace(&mut seen[i], true) {
                return Err(bad(&self.file, format!("storage '{k}' is listed twice")));
            }
            self.legacy_order.push(i);
        }
        self.state = if self.legacy_order.is_empty() {
            State::End
        } else {
            State::LegacyCount { at: 0 }
        };
        Ok(())
    }

    /// Legacy: a storage record's u64 element count, then its bytes.
    pub(crate) fn legacy_count(&mut self, chunk: &[u8], at: usize) -> Result<usize> {
        let want = (8 - self.buf.len()).min(chunk.len());
        self.buf.extend_from_slice(&chunk[..want]);
        if self.buf.len() < 8 {
            return Ok(want);
        }
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.buf);
        self.buf.clear();
        let numel = u64::from_le_bytes(b);
        let Some(&index) = self.legacy_order.get(at) else {
            return Err(bad(&self.file, "no storage record expected here"));
        };
        let s = self.sd.as_ref().and_then(|sd| sd.storages.get(index));
        let Some(s) = s else {
            return Err(bad(&self.file, "no state dict"));
        };
        if numel != s.numel {
            let msg = format!(
                "storage '{}' has {numel} elements, its references say {}",
                s.key, s.numel
            );
            return Err(bad(&self.file, msg));
        }
        self.legacy_at = at;
        let len = s.byte_len();
        self.begin_storage(index, Some(len))?;
        Ok(want)
    }
}

/// The legacy system-info dict says little-endian.
fn little_endian(info: &Value) -> bool {
    let (Value::Dict(items) | Value::OrderedDict(items)) = info else {
        return false;
    };
    items
        .items
        .chunks(2)
        .any(|kv| matches!(kv, [Value::Str(k), Value::Bool(true)] if &**k == "little_endian"))
}
