//! Our own safetensors header parser, validated and incremental.
//!
//! File layout: `u64` little-endian header length `n`, then `n` bytes of JSON
//! (`{"name": {"dtype": "F32", "shape": [..], "data_offsets": [start, end]}, "__metadata__": {..}}`),
//! then the data section; offsets are relative to the start of the data section.
//!
//! [`parse_header`] works from a *prefix* of the file: the browser calls it as bytes arrive and gets
//! [`HeaderState::NeedMore`] until the whole header is there. Everything that shapes a buffer is checked
//! before it is trusted: the header length is bounded, shapes' element counts are overflow-checked,
//! each tensor's byte range is exactly `numel * dtype size`, and the ranges, sorted, tile the data section
//! from 0 with neither gaps nor overlaps. Data-section length against the file length is checked by
//! [`Header::check_file_len`] once the file's length is known.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::error::{Error, Result};

/// Largest header we accept (the base model's is ~30 KB; the format's own reference limit is 100 MB).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// Element types a safetensors file may declare. Only `F32`, `F16` and `BF16` can be loaded; the others
/// are parsed (so their byte ranges are validated) and rejected with [`Error::UnsupportedDtype`] if a
/// needed tensor has them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StDtype {
    F32,
    F16,
    BF16,
    F64,
    I64,
    I32,
    I16,
    I8,
    U64,
    U32,
    U16,
    U8,
    Bool,
    F8E4M3,
    F8E5M2,
}

impl StDtype {
    fn parse(s: &str) -> Option<StDtype> {
        Some(match s {
            "F32" => StDtype::F32,
            "F16" => StDtype::F16,
            "BF16" => StDtype::BF16,
            "F64" => StDtype::F64,
            "I64" => StDtype::I64,
            "I32" => StDtype::I32,
            "I16" => StDtype::I16,
            "I8" => StDtype::I8,
            "U64" => StDtype::U64,
            "U32" => StDtype::U32,
            "U16" => StDtype::U16,
            "U8" => StDtype::U8,
            "BOOL" => StDtype::Bool,
            "F8_E4M3" => StDtype::F8E4M3,
            "F8_E5M2" => StDtype::F8E5M2,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            StDtype::F64 | StDtype::I64 | StDtype::U64 => 8,
            StDtype::F32 | StDtype::I32 | StDtype::U32 => 4,
            StDtype::F16 | StDtype::BF16 | StDtype::I16 | StDtype::U16 => 2,
            StDtype::I8 | StDtype::U8 | StDtype::Bool | StDtype::F8E4M3 | StDtype::F8E5M2 => 1,
        }
    }

    /// True for the dtypes we convert to f32 at load.
    pub fn is_loadable(self) -> bool {
        matches!(self, StDtype::F32 | StDtype::F16 | StDtype::BF16)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            StDtype::F32 => "F32",
            StDtype::F16 => "F16",
            StDtype::BF16 => "BF16",
            StDtype::F64 => "F64",
            StDtype::I64 => "I64",
            StDtype::I32 => "I32",
            StDtype::I16 => "I16",
            StDtype::I8 => "I8",
            StDtype::U64 => "U64",
            StDtype::U32 => "U32",
            StDtype::U16 => "U16",
            StDtype::U8 => "U8",
            StDtype::Bool => "BOOL",
            StDtype::F8E4M3 => "F8_E4M3",
            StDtype::F8E5M2 => "F8_E5M2",
        }
    }
}

/// One tensor's entry in the header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: StDtype,
    pub shape: Vec<usize>,
    /// Byte range relative to the start of the data section.
    pub start: u64,
    pub end: u64,
}

impl TensorInfo {
    pub fn numel(&self) -> usize {
        // Checked at parse time not to overflow.
        self.shape.iter().product()
    }
    pub fn byte_len(&self) -> u64 {
        self.end - self.start
    }
}

/// A parsed, validated header.
#[derive(Clone, Debug)]
pub struct Header {
    /// Absolute file offset of the data section (`8 + n`).
    pub data_start: u64,
    /// Length of the data section implied by the tensors (the last tensor's end).
    pub data_len: u64,
    /// Tensors sorted by `start` (file order).
    pub tensors: Vec<TensorInfo>,
    /// `__metadata__` (string to string), if present.
    pub metadata: BTreeMap<String, String>,
}

/// Result of parsing a prefix of a file.
#[derive(Clone, Debug)]
pub enum HeaderState {
    /// The prefix is too short: at least this many bytes (from the file start) are needed.
    NeedMore(u64),
    Done(Header),
}

fn herr(file: &str, msg: impl Into<String>) -> Error {
    Error::SafetensorsHeader {
        file: file.to_owned(),
        msg: msg.into(),
    }
}

/// Parse the header from a prefix of the file (`prefix` may be the whole file). `file` names the file in
/// errors. Returns `NeedMore(total)` until `prefix.len() >= 8 + n`.
pub fn parse_header(prefix: &[u8], file: &str) -> Result<HeaderState> {
    let Some(len_bytes) = prefix.get(..8) else {
        return Ok(HeaderState::NeedMore(8));
    };
    let mut lb = [0u8; 8];
    lb.copy_from_slice(len_bytes);
    let n = u64::from_le_bytes(lb);
    if n > MAX_HEADER_LEN {
        return Err(herr(
            file,
            format!("header length {n} exceeds the {MAX_HEADER_LEN}-byte limit"),
        ));
    }
    if n < 2 {
        return Err(herr(file, format!("header length {n} is too small")));
    }
    let total = 8 + n;
    let Some(json) = prefix.get(8..total as usize) else {
        return Ok(HeaderState::NeedMore(total));
    };
    let text =
        std::str::from_utf8(json).map_err(|e| herr(file, format!("header is not UTF-8: {e}")))?;
    // Strict: a tensor name given twice is an error naming it (plain `Value` keeps the last one).
    let value: Value = crate::json::parse_strict(text)
        .map_err(|e| herr(file, format!("header is not valid JSON: {e}")))?;
    let obj = value
        .as_object()
        .ok_or_else(|| herr(file, "header is not a JSON object"))?;

    let mut tensors = Vec::with_capacity(obj.len());
    let mut metadata = BTreeMap::new();
    for (name, entry) in obj {
        if name == "__metadata__" {
            metadata = parse_metadata(file, entry)?;
            continue;
        }
        tensors.push(parse_entry(file, name, entry)?);
    }

    tensors.sort_by_key(|t| (t.start, t.end));
    let data_len = check_tiling(file, &tensors, total)?;
    Ok(HeaderState::Done(Header {
        data_start: total,
        data_len,
        tensors,
        metadata,
    }))
}

/// The `__metadata__` entry: an object of strings.
fn parse_metadata(file: &str, entry: &Value) -> Result<BTreeMap<String, String>> {
    let m = entry
        .as_object()
        .ok_or_else(|| herr(file, "__metadata__ is not an object"))?;
    let mut metadata = BTreeMap::new();
    for (k, v) in m {
        let s = v
            .as_str()
            .ok_or_else(|| herr(file, format!("__metadata__.{k} is not a string")))?;
        metadata.insert(k.clone(), s.to_owned());
    }
    Ok(metadata)
}

/// Checks that the ranges of `tensors` (sorted by start) tile [0, data_len) exactly and that the data
/// section after the `total`-byte prefix ends at a representable offset; returns data_len.
fn check_tiling(file: &str, tensors: &[TensorInfo], total: u64) -> Result<u64> {
    let mut pos = 0u64;
    for t in tensors {
        if t.start < pos {
            return Err(herr(
                file,
                format!(
                    "tensor '{}' bytes [{}, {}) overlap the previous tensor (ending at {pos})",
                    t.name, t.start, t.end
                ),
            ));
        }
        if t.start > pos {
            return Err(herr(
                file,
                format!(
                    "gap in the data section: bytes [{pos}, {}) belong to no tensor (before '{}')",
                    t.start, t.name
                ),
            ));
        }
        pos = t.end;
    }
    // The data section must end at a representable file offset (`8 + n + data_len` in u64): a shape of
    // 2^64 - 1 bytes passes every per-entry check and would overflow here.
    if total.checked_add(pos).is_none() {
        return Err(herr(
            file,
            format!(
                "the data section ({pos} bytes after a {total}-byte header) ends past 2^64 bytes"
            ),
        ));
    }
    Ok(pos)
}

fn parse_entry(file: &str, name: &str, entry: &Value) -> Result<TensorInfo> {
    let e = entry
        .as_object()
        .ok_or_else(|| herr(file, format!("entry '{name}' is not an object")))?;
    let dtype_s = e
        .get("dtype")
        .and_then(|d| d.as_str())
        .ok_or_else(|| herr(file, format!("entry '{name}' has no dtype string")))?;
    let dtype = StDtype::parse(dtype_s).ok_or_else(|| Error::UnsupportedDtype {
        name: name.to_owned(),
        dtype: dtype_s.to_owned(),
    })?;
    let shape_v = e
        .get("shape")
        .and_then(|s| s.as_array())
        .ok_or_else(|| herr(file, format!("entry '{name}' has no shape list")))?;
    if shape_v.len() > 8 {
        return Err(herr(
            file,
            format!("entry '{name}' has rank {}", shape_v.len()),
        ));
    }
    let mut shape = Vec::with_capacity(shape_v.len());
    let mut numel: u64 = 1;
    for d in shape_v {
        let d = d
            .as_u64()
            .ok_or_else(|| herr(file, format!("entry '{name}' has a bad dimension {d}")))?;
        // Checked in u64 before any cast: on 32-bit targets a dimension (even beside a zero one, which
        // keeps the element count small) must fit usize too.
        let d_usize = usize::try_from(d)
            .map_err(|_| herr(file, format!("entry '{name}': dimension {d} is too large")))?;
        numel = numel
            .checked_mul(d)
            .filter(|&n| usize::try_from(n).is_ok())
            .ok_or_else(|| herr(file, format!("entry '{name}': element count overflows")))?;
        shape.push(d_usize);
    }
    let offs = e
        .get("data_offsets")
        .and_then(|o| o.as_array())
        .filter(|o| o.len() == 2)
        .ok_or_else(|| {
            herr(
                file,
                format!("entry '{name}' has no [start, end] data_offsets"),
            )
        })?;
    let (Some(start), Some(end)) = (offs[0].as_u64(), offs[1].as_u64()) else {
        return Err(herr(file, format!("entry '{name}' has bad data_offsets")));
    };
    if end < start {
        return Err(herr(
            file,
            format!("entry '{name}': data_offsets [{start}, {end}] run backwards"),
        ));
    }
    let want = numel
        .checked_mul(dtype.size() as u64)
        .ok_or_else(|| herr(file, format!("entry '{name}': byte size overflows")))?;
    if end - start != want {
        return Err(herr(
            file,
            format!(
                "entry '{name}': {} bytes for {dtype_s} {shape:?} (needs {want})",
                end - start
            ),
        ));
    }
    Ok(TensorInfo {
        name: name.to_owned(),
        dtype,
        shape,
        start,
        end,
    })
}

impl Header {
    /// Check the header against the file's total length: the data section must fit (else
    /// [`Error::Truncated`]) and end exactly at the end of the file (trailing bytes are a header error).
    pub fn check_file_len(&self, file: &str, file_len: u64) -> Result<()> {
        // Cannot overflow for a parsed header (checked there); checked again for hand-built ones.
        let need = self
            .data_start
            .checked_add(self.data_len)
            .ok_or_else(|| herr(file, "the data section ends past 2^64 bytes"))?;
        if file_len < need {
            return Err(Error::Truncated {
                file: file.to_owned(),
                expected: need,
                got: file_len,
            });
        }
        if file_len > need {
            return Err(herr(
                file,
                format!(
                    "{} bytes after the last tensor's data (file is {file_len} bytes, tensors end at {need})",
                    file_len - need
                ),
            ));
        }
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}
