//! A PyTorch state dict read from its pickle ([`crate::weights::pickle`]): tensor descriptors (name,
//! dtype, shape, storage, element offset) and the storages they live in (key, element type, element
//! count). Tensors share storages (tied weights), sit at offsets inside them, and must be contiguous
//! (row-major strides; a dimension of size 1 may have any stride): other strides are refused by name.
//!
//! Storage references are persistent ids: `('storage', torch.XStorage, key, location, numel)` in the zip
//! format, with a sixth `view_metadata` (which must be `None`) in the legacy format.

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::weights::header::{Header, StDtype, TensorInfo};
use crate::weights::pickle::{Global, Items, Value};

/// Most tensors a state dict may hold (a large model has ~1,200).
pub const MAX_TENSORS: usize = 100_000;
/// Highest tensor rank.
const MAX_RANK: usize = 8;

/// One storage (`archive/data/KEY` in a zip, one record after a legacy file's pickles).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StorageRef {
    pub key: String,
    pub dtype: StDtype,
    /// Elements of `dtype`.
    pub numel: u64,
}

impl StorageRef {
    /// Bytes the storage holds (checked not to overflow when read).
    pub fn byte_len(&self) -> u64 {
        self.numel * self.dtype.size() as u64
    }
}

/// One tensor of the state dict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TorchTensor {
    pub name: String,
    /// Index into [`StateDict::storages`].
    pub storage: usize,
    pub dtype: StDtype,
    pub shape: Vec<usize>,
    /// First element inside the storage.
    pub offset: u64,
}

impl TorchTensor {
    /// Byte range inside its storage.
    pub fn byte_range(&self) -> (u64, u64) {
        let es = self.dtype.size() as u64;
        let n: u64 = self.shape.iter().map(|&d| d as u64).product();
        (self.offset * es, (self.offset + n) * es)
    }
}

/// The tensors of a checkpoint and their storages.
#[derive(Clone, Debug, Default)]
pub struct StateDict {
    /// Sorted by name.
    pub tensors: Vec<TorchTensor>,
    /// In order of first reference.
    pub storages: Vec<StorageRef>,
    /// Storage key -> index into `storages`.
    keys: BTreeMap<String, usize>,
}

impl StateDict {
    /// The tensors as a [`Header`] for [`crate::weights::Assembler::plan_header`]: byte ranges are
    /// relative to each tensor's own storage.
    pub fn header(&self) -> Header {
        let tensors = self
            .tensors
            .iter()
            .map(|t| {
                let (start, end) = t.byte_range();
                TensorInfo {
                    name: t.name.clone(),
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                    start,
                    end,
                }
            })
            .collect();
        Header {
            data_start: 0,
            data_len: 0,
            tensors,
            metadata: BTreeMap::new(),
        }
    }

    /// The storage of `key`, if a tensor uses it.
    pub fn storage_index(&self, key: &str) -> Option<usize> {
        self.keys.get(key).copied()
    }
}

fn bad(file: &str, msg: impl Into<String>) -> Error {
    Error::TorchCheckpoint {
        file: file.to_owned(),
        msg: msg.into(),
    }
}

/// The state dict a checkpoint's object pickle holds: a dict (or `OrderedDict`) of name -> tensor.
/// Entries whose value is not a tensor are skipped; a later entry of the same name replaces an earlier
/// one (as in Python).
pub fn state_dict(root: &Value, file: &str) -> Result<StateDict> {
    let (Value::Dict(items) | Value::OrderedDict(items)) = root else {
        return Err(bad(
            file,
            format!("the pickle holds a {}, not a state dict", root.kind()),
        ));
    };
    let mut sd = StateDict::default();
    let mut by_name = BTreeMap::new();
    for kv in items.items.chunks(2) {
        let [key, value] = kv else { continue };
        let Value::Str(name) = key else {
            return Err(bad(file, format!("a state dict key is a {}", key.kind())));
        };
        let Some(t) = tensor(&mut sd, name, value, file)? else {
            log::debug!(
                "{file}: skipping '{name}' (a {}, not a tensor)",
                value.kind()
            );
            continue;
        };
        by_name.insert(name.to_string(), t);
        if by_name.len() > MAX_TENSORS {
            return Err(bad(file, format!("more than {MAX_TENSORS} tensors")));
        }
    }
    sd.tensors = by_name.into_values().collect();
    Ok(sd)
}

/// A tensor value (`_rebuild_tensor_v2(...)`, or `_rebuild_parameter(tensor, ...)`), or `None`.
fn tensor(sd: &mut StateDict, name: &str, v: &Value, file: &str) -> Result<Option<TorchTensor>> {
    let args = match v {
        Value::Reduced(Global::RebuildTensorV2, args) => args,
        Value::Reduced(Global::RebuildParameter, args) => match args.items.first() {
            Some(Value::Reduced(Global::RebuildTensorV2, inner)) => inner,
            _ => return Err(bad(file, format!("parameter '{name}' holds no tensor"))),
        },
        _ => return Ok(None),
    };
    let e = |m: &str| bad(file, format!("tensor '{name}': {m}"));
    let [pid, offset, size, stride, ..] = args.items.as_slice() else {
        return Err(e(
            "_rebuild_tensor_v2 takes (storage, offset, size, stride, ...)",
        ));
    };
    let Value::PersId(pid) = pid else {
        return Err(e("its storage is not a persistent id"));
    };
    let storage = storage_ref(sd, pid, file)?;
    let &Value::Int(offset) = offset else {
        return Err(e("storage offset is not an int"));
    };
    let offset = u64::try_from(offset).map_err(|_| e("negative storage offset"))?;
    let shape = int_tuple(size).ok_or_else(|| e("size is not a tuple of ints"))?;
    let stride = int_tuple(stride).ok_or_else(|| e("stride is not a tuple of ints"))?;
    let s = &sd.storages[storage];
    let t = TorchTensor {
        name: name.to_owned(),
        storage,
        dtype: s.dtype,
        shape: check_shape(&shape, &stride).map_err(|m| e(&m))?,
        offset,
    };
    check_in_storage(&t, s).map_err(|m| e(&m))?;
    Ok(Some(t))
}

/// Non-negative ints of a tuple.
fn int_tuple(v: &Value) -> Option<Vec<u64>> {
    let Value::Tuple(Items { items, .. }) = v else {
        return None;
    };
    items
        .iter()
        .map(|x| match x {
            Value::Int(i) => u64::try_from(*i).ok(),
            _ => None,
        })
        .collect()
}

/// The shape, if the strides are row-major contiguous and the element count fits.
fn check_shape(shape: &[u64], stride: &[u64]) -> std::result::Result<Vec<usize>, String> {
    if shape.len() != stride.len() || shape.len() > MAX_RANK {
        return Err(format!(
            "rank {} with {} strides (at most {MAX_RANK})",
            shape.len(),
            stride.len()
        ));
    }
    let mut want = 1u64;
    for (&d, &s) in shape.iter().zip(stride).rev() {
        if d != 1 && s != want && d != 0 {
            return Err(format!(
                "not contiguous (size {shape:?}, strides {stride:?}): only row-major tensors load"
            ));
        }
        want = want
            .checked_mul(d)
            .filter(|&n| usize::try_from(n).is_ok() && n < 1 << 56)
            .ok_or_else(|| format!("size {shape:?} overflows"))?;
    }
    Ok(shape.iter().map(|&d| d as usize).collect())
}

/// The tensor's elements lie inside its storage.
fn check_in_storage(t: &TorchTensor, s: &StorageRef) -> std::result::Result<(), String> {
    let n: u64 = t.shape.iter().map(|&d| d as u64).product();
    let end = t.offset.checked_add(n).filter(|&e| e <= s.numel);
    match end {
        Some(_) => Ok(()),
        None => Err(format!(
            "elements [{}, +{n}) lie outside storage '{}' of {} elements",
            t.offset, s.key, s.numel
        )),
    }
}

/// Register (or find) the storage a persistent id names; returns its index.
fn storage_ref(sd: &mut StateDict, pid: &Value, file: &str) -> Result<usize> {
    let Value::Tuple(Items { items, .. }) = pid else {
        return Err(bad(file, format!("a persistent id is a {}", pid.kind())));
    };
    let (tag, ty, key, numel, view) = match items.as_slice() {
        [t, ty, k, _loc, n] => (t, ty, k, n, None),
        [t, ty, k, _loc, n, view] => (t, ty, k, n, Some(view)),
        _ => return Err(bad(file, "a persistent id is not a 5- or 6-tuple")),
    };
    if !matches!(tag, Value::Str(s) if &**s == "storage") {
        return Err(bad(
            file,
            "a persistent id is not a ('storage', ...) reference",
        ));
    }
    if view.is_some_and(|v| !matches!(v, Value::None)) {
        return Err(bad(
            file,
            "storage views (legacy view_metadata) are not supported",
        ));
    }
    let (Value::Global(Global::Storage(dtype)), Value::Str(key), Value::Int(numel)) =
        (ty, key, numel)
    else {
        return Err(bad(
            file,
            "a storage reference is not (type, key, location, numel)",
        ));
    };
    let numel = u64::try_from(*numel)
        .ok()
        .filter(|n| n.checked_mul(8).is_some())
        .ok_or_else(|| bad(file, format!("storage '{key}' has {numel} elements")))?;
    let s = StorageRef {
        key: key.to_string(),
        dtype: *dtype,
        numel,
    };
    if let Some(i) = sd.storage_index(key) {
        if sd.storages[i] != s {
            return Err(bad(
                file,
                format!("storage '{key}' is declared twice, differently"),
            ));
        }
        return Ok(i);
    }
    if sd.storages.len() >= MAX_TENSORS {
        return Err(bad(file, format!("more than {MAX_TENSORS} storages")));
    }
    sd.keys.insert(s.key.clone(), sd.storages.len());
    sd.storages.push(s);
    Ok(sd.storages.len() - 1)
}
