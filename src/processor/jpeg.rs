//! Truncated JPEGs are refused, as the reference refuses them: Pillow raises `OSError: image file is
//! truncated` when a JPEG's data ends before its end-of-image marker (unless the global
//! `ImageFile.LOAD_TRUNCATED_IMAGES` is set), while the image crate's decoder returns the rows it could
//! decode and fills the rest. [`check_complete`] walks the marker structure (no decoding) and requires an
//! EOI marker after the last scan; bytes after EOI are ignored, as Pillow ignores them.
//!
//! Structure: `FFD8` (SOI), then segments `FF xx` + a 2-byte big-endian length (which counts itself) for
//! every marker except the standalone ones (`FF01`, `FFD0..FFD7`); after a `FFDA` (SOS) segment comes
//! entropy-coded data, in which `FF00` is a stuffed `FF` and `FFD0..FFD7` are restart markers, up to the
//! next real marker (another table or scan in progressive files, or `FFD9`, EOI). Fill bytes `FF` may
//! precede any marker. Linear in the input length, no allocation.

/// `Ok(())` when the stream reaches EOI; otherwise a description of where it ends.
pub fn check_complete(b: &[u8]) -> Result<(), String> {
    if b.get(..2) != Some(&[0xFF, 0xD8]) {
        return Err("no JPEG start-of-image marker".into());
    }
    let truncated = |at: usize, what: &str| {
        Err(format!(
            "image file is truncated: {} bytes end {what} (at byte {at}) before the end-of-image marker",
            b.len()
        ))
    };
    let mut i = 2;
    loop {
        // A marker: one or more 0xFF, then the code.
        if b.get(i) != Some(&0xFF) {
            if i >= b.len() {
                return truncated(i, "between segments");
            }
            return Err(format!("expected a JPEG marker at byte {i}"));
        }
        while b.get(i) == Some(&0xFF) {
            i += 1;
        }
        let Some(&code) = b.get(i) else {
            return truncated(i, "inside a marker");
        };
        i += 1;
        match code {
            0xD9 => return Ok(()),
            0x01 | 0xD0..=0xD7 => continue,
            0x00 | 0xD8 => {
                return Err(format!(
                    "invalid JPEG marker FF{code:02X} at byte {}",
                    i - 2
                ))
            }
            _ => {}
        }
        let Some(len) = b
            .get(i..i + 2)
            .map(|l| usize::from(u16::from_be_bytes([l[0], l[1]])))
        else {
            return truncated(i, "inside a segment length");
        };
        if len < 2 {
            return Err(format!("JPEG segment FF{code:02X} has length {len}"));
        }
        i += len;
        if i > b.len() {
            return truncated(b.len(), "inside a segment");
        }
        if code == 0xDA {
            // Entropy-coded data up to the next marker that is neither a stuffed byte nor a restart.
            loop {
                let Some(k) = b.get(i..).and_then(|r| r.iter().position(|&x| x == 0xFF)) else {
                    return truncated(b.len(), "inside scan data");
                };
                i += k;
                let mut j = i + 1;
                while b.get(j) == Some(&0xFF) {
                    j += 1;
                }
                match b.get(j) {
                    None => return truncated(b.len(), "inside scan data"),
                    Some(0x00) | Some(0xD0..=0xD7) => i = j + 1,
                    Some(_) => {
                        i = j - 1; // the last 0xFF before the code starts the marker
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::check_complete;

    /// SOI, an APP0-like segment, SOS with scan data containing a stuffed byte and a restart, EOI.
    fn tiny() -> Vec<u8> {
        let mut v = vec![0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x04, 1, 2];
        v.extend([0xFF, 0xDA, 0x00, 0x03, 0x01]);
        v.extend([0x12, 0xFF, 0x00, 0x34, 0xFF, 0xD3, 0x56]);
        v.extend([0xFF, 0xFF, 0xD9]);
        v
    }

    #[test]
    fn complete_streams_pass_and_every_cut_fails() {
        let v = tiny();
        check_complete(&v).unwrap();
        let mut trailing = v.clone();
        trailing.extend([0, 1, 2]);
        check_complete(&trailing).unwrap();
        for cut in 0..v.len() {
            assert!(check_complete(&v[..cut]).is_err(), "cut at {cut}");
        }
    }
}
