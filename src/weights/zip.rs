//! The zip records a PyTorch checkpoint needs, read in file order: local file headers until the central
//! directory begins, and data descriptors. Entries are stored (uncompressed); torch 2.x writes every
//! local header with its sizes deferred to a data descriptor after the data (flag bit 3, sizes 0), older
//! versions put them in the header (zip64 sizes in its extra field). Nothing is decompressed: a
//! compressed or encrypted entry is refused by name.

use crate::error::{Error, Result};

const LOCAL_SIG: u32 = 0x0403_4b50;
const CENTRAL_SIG: u32 = 0x0201_4b50;
const EOCD_SIG: u32 = 0x0605_4b50;
const ZIP64_EOCD_SIG: u32 = 0x0606_4b50;
/// Fixed part of a local file header.
pub const LOCAL_FIXED: usize = 30;
/// Longest entry name we accept.
const MAX_NAME: usize = 4096;

/// One entry's local header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalEntry {
    pub name: String,
    /// Bytes of the header (fixed part, name, extra field): the data follows.
    pub header_len: usize,
    /// Bytes of data (stored: the file itself); `None` when the header defers them to a descriptor.
    pub data_len: Option<u64>,
    /// A data descriptor follows the data (flag bit 3).
    pub descriptor: bool,
}

/// What a prefix of the remaining bytes holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Local {
    /// At least this many bytes are needed.
    NeedMore(usize),
    Entry(LocalEntry),
    /// The central directory (or the end record) begins: no more entries.
    End,
}

fn bad(file: &str, msg: impl Into<String>) -> Error {
    Error::TorchCheckpoint {
        file: file.to_owned(),
        msg: msg.into(),
    }
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from(u32_at(b, i)) | (u64::from(u32_at(b, i + 4)) << 32)
}

/// Parse the local header at the start of `b` (the bytes after the previous entry's data).
pub fn parse_local(b: &[u8], file: &str) -> Result<Local> {
    if b.len() < 4 {
        return Ok(Local::NeedMore(4));
    }
    match u32_at(b, 0) {
        LOCAL_SIG => {}
        CENTRAL_SIG | EOCD_SIG | ZIP64_EOCD_SIG => return Ok(Local::End),
        sig => {
            return Err(bad(
                file,
                format!("expected a zip entry, found signature 0x{sig:08x}"),
            ))
        }
    }
    if b.len() < LOCAL_FIXED {
        return Ok(Local::NeedMore(LOCAL_FIXED));
    }
    let (flags, method) = (u16_at(b, 6), u16_at(b, 8));
    let (comp, plain) = (u32_at(b, 18), u32_at(b, 22));
    let (name_len, extra_len) = (usize::from(u16_at(b, 26)), usize::from(u16_at(b, 28)));
    let header_len = LOCAL_FIXED + name_len + extra_len;
    if b.len() < header_len {
        return Ok(Local::NeedMore(header_len));
    }
    if name_len > MAX_NAME {
        return Err(bad(file, format!("a {name_len}-byte entry name")));
    }
    let name = std::str::from_utf8(&b[LOCAL_FIXED..LOCAL_FIXED + name_len])
        .map_err(|_| bad(file, "an entry name is not UTF-8"))?
        .to_owned();
    let refuse = |what: &str| {
        bad(
            file,
            format!("entry '{name}' is {what}; only stored entries load"),
        )
    };
    if flags & 1 != 0 {
        return Err(refuse("encrypted"));
    }
    if method != 0 {
        return Err(refuse(&format!("compressed (method {method})")));
    }
    let extra = &b[LOCAL_FIXED + name_len..header_len];
    let (comp, plain) =
        zip64_sizes(extra, comp, plain).map_err(|m| bad(file, format!("entry '{name}': {m}")))?;
    let descriptor = flags & 8 != 0;
    if comp != plain {
        return Err(bad(
            file,
            format!("entry '{name}' is stored with {comp} bytes for {plain} bytes of data"),
        ));
    }
    Ok(Local::Entry(LocalEntry {
        name,
        header_len,
        data_len: (!descriptor || plain != 0).then_some(plain),
        descriptor,
    }))
}

/// The sizes, replaced by the zip64 extra field's where the header holds 0xFFFFFFFF.
fn zip64_sizes(mut extra: &[u8], comp: u32, plain: u32) -> std::result::Result<(u64, u64), String> {
    let (mut c, mut p) = (u64::from(comp), u64::from(plain));
    if comp != u32::MAX && plain != u32::MAX {
        return Ok((c, p));
    }
    while extra.len() >= 4 {
        let (id, len) = (u16_at(extra, 0), usize::from(u16_at(extra, 2)));
        let body = extra.get(4..4 + len).ok_or("a truncated extra field")?;
        if id == 1 {
            // Uncompressed size, then compressed size, each only where the header says 0xFFFFFFFF.
            let mut at = 0;
            for (field, full) in [(&mut p, plain), (&mut c, comp)] {
                if full == u32::MAX {
                    if body.len() < at + 8 {
                        return Err("a short zip64 extra field".into());
                    }
                    *field = u64_at(body, at);
                    at += 8;
                }
            }
            return Ok((c, p));
        }
        extra = &extra[4 + len..];
    }
    Err("sizes of 0xFFFFFFFF without a zip64 extra field".into())
}

/// The data descriptor signature (`PK\x07\x08`).
pub const DESCRIPTOR_SIG: u32 = 0x0807_4b50;

/// What a prefix of the bytes after an entry's `len` data bytes says about its data descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Descriptor {
    NeedMore(usize),
    /// A descriptor of this many bytes (16, or 24 with zip64 sizes) confirms `len`.
    Len(usize),
}

/// Parse the data descriptor (with its signature, as torch writes it) after an entry of `len` bytes:
/// both sizes must equal `len`.
pub fn parse_descriptor(b: &[u8], len: u64, name: &str, file: &str) -> Result<Descriptor> {
    if b.len() < 16 {
        return Ok(Descriptor::NeedMore(16));
    }
    if u32_at(b, 0) != DESCRIPTOR_SIG {
        return Err(bad(
            file,
            format!("entry '{name}': no data descriptor after its {len} bytes"),
        ));
    }
    if u64::from(u32_at(b, 8)) == len && u64::from(u32_at(b, 12)) == len {
        return Ok(Descriptor::Len(16));
    }
    if b.len() < 24 {
        return Ok(Descriptor::NeedMore(24));
    }
    if u64_at(b, 8) == len && u64_at(b, 16) == len {
        return Ok(Descriptor::Len(24));
    }
    Err(bad(
        file,
        format!("entry '{name}': its data descriptor disagrees with its {len} bytes"),
    ))
}

/// Where a size-less entry of a few bytes ends: the first `p` with a 16-byte descriptor at `p` whose
/// sizes both say `p` (searching positions from `from`). Returns `(p, next_from)`.
pub fn find_descriptor(b: &[u8], from: usize) -> (Option<usize>, usize) {
    let last = b.len().saturating_sub(15);
    for p in from..last {
        if u32_at(b, p) == DESCRIPTOR_SIG
            && u64::from(u32_at(b, p + 8)) == p as u64
            && u64::from(u32_at(b, p + 12)) == p as u64
        {
            return (Some(p), p);
        }
    }
    (None, last.max(from))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(name: &str, len: u32, extra: &[u8], method: u16, flags: u16) -> Vec<u8> {
        let mut h = Vec::new();
        h.extend(LOCAL_SIG.to_le_bytes());
        h.extend(20u16.to_le_bytes());
        h.extend(flags.to_le_bytes());
        h.extend(method.to_le_bytes());
        h.extend([0u8; 8]); // time, date, crc
        h.extend(len.to_le_bytes());
        h.extend(len.to_le_bytes());
        h.extend((name.len() as u16).to_le_bytes());
        h.extend((extra.len() as u16).to_le_bytes());
        h.extend(name.as_bytes());
        h.extend(extra);
        h
    }

    #[test]
    fn stored_entry_with_padding() {
        let h = header("archive/data/0", 12, &[0x46, 0x42, 2, 0, 0, 0], 0, 0);
        for n in 0..h.len() {
            assert!(matches!(parse_local(&h[..n], "f").unwrap(), Local::NeedMore(k) if k > n));
        }
        let Local::Entry(e) = parse_local(&h, "f").unwrap() else {
            panic!()
        };
        assert_eq!(
            (e.name.as_str(), e.header_len, e.data_len),
            ("archive/data/0", h.len(), Some(12))
        );
    }

    #[test]
    fn zip64_sizes_come_from_the_extra_field() {
        let mut extra = vec![1, 0, 16, 0];
        extra.extend((5u64 << 32).to_le_bytes());
        extra.extend((5u64 << 32).to_le_bytes());
        let h = header("a/data/1", u32::MAX, &extra, 0, 0);
        let Local::Entry(e) = parse_local(&h, "f").unwrap() else {
            panic!()
        };
        assert_eq!(e.data_len, Some(5 << 32));
        let h = header("a/data/1", u32::MAX, &[], 0, 0);
        assert!(parse_local(&h, "f").is_err());
    }

    #[test]
    fn compressed_and_encrypted_entries_are_refused() {
        for (method, flags, word) in [(8, 0, "compressed"), (0, 1, "encrypted")] {
            let e = parse_local(&header("a/data.pkl", 3, &[], method, flags), "f").unwrap_err();
            assert!(e.to_string().contains(word), "{e}");
        }
    }

    #[test]
    fn deferred_sizes_and_descriptors() {
        let Local::Entry(e) = parse_local(&header("a/data.pkl", 0, &[], 0, 0x808), "f").unwrap()
        else {
            panic!()
        };
        assert_eq!((e.data_len, e.descriptor), (None, true));
        let mut d = DESCRIPTOR_SIG.to_le_bytes().to_vec();
        d.extend([1, 2, 3, 4]);
        d.extend(7u32.to_le_bytes());
        d.extend(7u32.to_le_bytes());
        assert_eq!(
            parse_descriptor(&d[..15], 7, "e", "f").unwrap(),
            Descriptor::NeedMore(16)
        );
        assert_eq!(
            parse_descriptor(&d, 7, "e", "f").unwrap(),
            Descriptor::Len(16)
        );
        assert_eq!(
            parse_descriptor(&d, 8, "e", "f").unwrap(),
            Descriptor::NeedMore(24)
        );
        assert!(parse_descriptor(&[0; 16], 7, "e", "f").is_err());
        let mut rec = b"little".to_vec();
        rec.extend(DESCRIPTOR_SIG.to_le_bytes());
        rec.extend([9; 4]);
        rec.extend(6u32.to_le_bytes());
        rec.extend(6u32.to_le_bytes());
        assert_eq!(find_descriptor(&rec[..21], 0), (None, 6));
        assert_eq!(find_descriptor(&rec, 6), (Some(6), 6));
    }

    #[test]
    fn central_directory_ends_the_entries() {
        assert_eq!(
            parse_local(&CENTRAL_SIG.to_le_bytes(), "f").unwrap(),
            Local::End
        );
        assert!(parse_local(b"junk", "f").is_err());
    }
}
