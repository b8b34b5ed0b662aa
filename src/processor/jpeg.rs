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

/// What [`headers`] reads from the segments before the first scan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Headers {
    /// The EXIF data (the TIFF structure after `Exif\0\0`) of the APP1 segments, concatenated as Pillow
    /// concatenates them (`info["exif"]`); `None` when there is no EXIF APP1 segment.
    pub exif: Option<Vec<u8>>,
    /// The frame header (SOFn), when one comes before the first scan.
    pub frame: Option<Frame>,
    /// How many components the first scan codes (its SOS header).
    pub first_scan_components: Option<u8>,
}

/// A frame header (SOFn): size and per-component sampling factors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The SOF marker code (`0xC0` baseline, `0xC2` progressive, ...).
    pub marker: u8,
    pub width: u16,
    pub height: u16,
    /// `(horizontal, vertical)` sampling factor of each component, in frame order.
    pub sampling: Vec<(u8, u8)>,
}

impl Frame {
    /// SOF2, SOF6, SOF10, SOF14: progressive DCT.
    pub fn progressive(&self) -> bool {
        matches!(self.marker, 0xC2 | 0xC6 | 0xCA | 0xCE)
    }

    /// The largest sampling factor `pick` takes from a component's `(h, v)`, at least 1.
    fn max_factor(&self, pick: impl Fn(&(u8, u8)) -> u8) -> u64 {
        self.sampling
            .iter()
            .map(|s| u64::from(pick(s)))
            .max()
            .unwrap_or(1)
            .max(1)
    }

    /// Bytes of the whole-image coefficient buffer a libjpeg decoder allocates for a file it cannot
    /// decode in one pass (progressive, or whose first scan does not hold every component): for each
    /// component, its blocks (the image size scaled by its sampling factors, rounded up to whole MCUs)
    /// times 64 coefficients of 2 bytes. Saturates rather than overflows.
    pub fn coefficient_bytes(&self) -> u64 {
        let hmax = self.max_factor(|s| s.0);
        let vmax = self.max_factor(|s| s.1);
        let blocks = |size: u16, f: u64, max: u64| {
            let b = (u64::from(size) * f).div_ceil(8 * max);
            b.div_ceil(f) * f
        };
        self.sampling
            .iter()
            .map(|&(h, v)| {
                let (h, v) = (u64::from(h).max(1), u64::from(v).max(1));
                blocks(self.width, h, hmax)
                    .saturating_mul(blocks(self.height, v, vmax))
                    .saturating_mul(128)
            })
            .fold(0u64, u64::saturating_add)
    }
}

/// Reads the segments from SOI up to the first scan's header: the EXIF APP1 data, the frame header and
/// the first scan's component count. Stops quietly at anything it cannot read (the decoder reports
/// malformed headers); no decoding, linear in the header bytes.
pub fn headers(b: &[u8]) -> Headers {
    let mut out = Headers::default();
    if b.get(..2) != Some(&[0xFF, 0xD8]) {
        return out;
    }
    let mut i = 2;
    while b.get(i) == Some(&0xFF) {
        while b.get(i) == Some(&0xFF) {
            i += 1;
        }
        let Some(&code) = b.get(i) else { break };
        i += 1;
        if matches!(code, 0x01 | 0xD0..=0xD7) {
            continue;
        }
        if matches!(code, 0x00 | 0xD8 | 0xD9) {
            break;
        }
        let Some(len) = b
            .get(i..i + 2)
            .map(|l| usize::from(u16::from_be_bytes([l[0], l[1]])))
        else {
            break;
        };
        let Some(body) = len.checked_sub(2).and_then(|n| b.get(i + 2..i + 2 + n)) else {
            break;
        };
        i += len;
        match code {
            0xE1 => {
                if let Some(tiff) = body.strip_prefix(b"Exif\0\0") {
                    out.exif
                        .get_or_insert_with(Vec::new)
                        .extend_from_slice(tiff);
                }
            }
            0xC0..=0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF if out.frame.is_none() => {
                if let [_precision, h0, h1, w0, w1, n, rest @ ..] = body {
                    let sampling = rest
                        .chunks_exact(3)
                        .take(usize::from(*n))
                        .map(|c| (c[1] >> 4, c[1] & 0x0F))
                        .collect();
                    out.frame = Some(Frame {
                        marker: code,
                        width: u16::from_be_bytes([*w0, *w1]),
                        height: u16::from_be_bytes([*h0, *h1]),
                        sampling,
                    });
                }
            }
            0xDA => {
                out.first_scan_components = body.first().copied();
                break;
            }
            _ => {}
        }
    }
    out
}

/// One pixel of libjpeg's CMYK output (Adobe-inverted samples) to RGB as Pillow does it: the `CMYK;I`
/// unpacker inverts each sample, then `cmyk2rgb` computes `nk - nk * c / 255` with `nk = 255 - k`
/// (the division rounded the way Pillow's `MULDIV255` rounds).
pub(crate) fn inverted_cmyk_to_rgb(raw: [u8; 4]) -> [u8; 3] {
    // Inverting k gives k' = 255 - raw_k, so nk = 255 - k' = raw_k.
    let nk = u32::from(raw[3]);
    let ch = |raw_c: u8| {
        let c = 255 - u32::from(raw_c);
        let t = c * nk + 128;
        let m = ((t >> 8) + t) >> 8;
        nk.saturating_sub(m) as u8
    };
    [ch(raw[0]), ch(raw[1]), ch(raw[2])]
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

    /// Two EXIF APP1 segments are concatenated (as Pillow's `info["exif"]`), other APP1 data is skipped;
    /// the frame header and the first scan's component count are read; nothing after the first scan is.
    #[test]
    fn headers_reads_exif_frame_and_first_scan() {
        let mut v = vec![0xFF, 0xD8];
        v.extend([0xFF, 0xE1, 0x00, 0x0A]);
        v.extend(b"Exif\0\0MM");
        v.extend([0xFF, 0xE1, 0x00, 0x06, b'h', b't', b't', b'p']);
        v.extend([0xFF, 0xE1, 0x00, 0x0A]);
        v.extend(b"Exif\0\0ab");
        // SOF2: 8 bits, 23 rows, 37 columns, 3 components (2x2, 1x1, 1x1).
        v.extend([0xFF, 0xC2, 0x00, 0x11, 8, 0, 23, 0, 37, 3]);
        v.extend([1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1]);
        v.extend([0xFF, 0xDA, 0x00, 0x08, 1, 1, 0, 0, 63, 0]);
        v.extend([0xFF, 0xE1, 0x00, 0x0A]);
        v.extend(b"Exif\0\0zz");
        let h = super::headers(&v);
        assert_eq!(h.exif.as_deref(), Some(&b"MMab"[..]));
        assert_eq!(h.first_scan_components, Some(1));
        let f = h.frame.unwrap();
        assert_eq!((f.marker, f.width, f.height), (0xC2, 37, 23));
        assert_eq!(f.sampling, vec![(2, 2), (1, 1), (1, 1)]);
        assert!(f.progressive());
        // Luma: ceil(37/8) = 5 -> 6 (whole 2x2 MCUs) by ceil(23/8) = 3 -> 4 blocks; chroma: 3 by 2.
        assert_eq!(f.coefficient_bytes(), (6 * 4 + 2 * 3 * 2) * 128);
        assert_eq!(super::headers(&v[..20]).frame, None);
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
