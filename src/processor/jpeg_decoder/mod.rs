//! A JPEG decoder that gives libjpeg-turbo's pixels (hence Pillow's) in pure Rust: the same integer
//! IDCT (`islow`), the same "fancy" chroma upsampling with its edge and context rules, the same
//! fixed-point colour conversion, and libjpeg's handling of corrupt entropy data. It is what the wasm
//! build decodes JPEGs with where the browser's `createImageBitmap` is not there (Node), and what a
//! native build without the `libjpeg-turbo` feature uses.
//!
//! Covered: baseline and extended sequential (8-bit, Huffman), progressive (spectral selection and
//! successive approximation), interleaved and per-component scans, restart intervals, 1 (grey),
//! 3 (YCbCr or RGB, decided as libjpeg decides) and 4 (CMYK, YCCK) components, sampling factors 1-4 in
//! integral ratios. [`decode`] answers `Ok(None)` for what it does not cover (arithmetic coding, 12-bit
//! or lossless frames, a height given by DNL, and progressive files whose AC bands stop short of full
//! precision, where libjpeg smooths the blocks), so that the caller can use another decoder.
//!
//! Every block is kept until the last scan (as libjpeg keeps them for progressive and multi-scan
//! files): the coefficient memory ([`super::jpeg::Frame::coefficient_bytes`]) plus the planes and the
//! output are checked against the caller's allocation limit before any is allocated.

mod entropy;
mod idct;
mod upsample;

use ::image::RgbImage;

use self::entropy::{Band, Bits, Huffman};
use self::upsample::{Plane, YccTables};
use super::jpeg::inverted_cmyk_to_rgb;
use super::limits::ImageLimits;
use crate::error::{Error, Result};

/// One frame component and its coefficients.
struct Component {
    id: u8,
    h: usize,
    v: usize,
    /// The quantisation table slot, and the table latched when the component's first scan began.
    tq: usize,
    quant: Option<[u16; 64]>,
    /// Blocks per row and rows of blocks, whole MCUs.
    bw: usize,
    bh: usize,
    /// Samples that hold image data (libjpeg's downsampled size).
    dw: usize,
    dh: usize,
    coefs: Vec<[i16; 64]>,
    /// Per coefficient, the successive-approximation bit it is known to (-1: not yet sent).
    coef_bits: [i8; 64],
}

struct Frame {
    width: usize,
    height: usize,
    progressive: bool,
    comps: Vec<Component>,
    hmax: usize,
    vmax: usize,
    mcux: usize,
    mcuy: usize,
}

/// What a scan header (SOS) selects.
struct Scan {
    /// (component index, DC table, AC table)
    comps: Vec<(usize, usize, usize)>,
    ss: usize,
    se: usize,
    ah: u32,
    al: u32,
}

/// The tables and markers read so far.
#[derive(Default)]
struct Tables {
    quant: [Option<[u16; 64]>; 4],
    dc: [Option<Huffman>; 4],
    ac: [Option<Huffman>; 4],
    restart: usize,
    jfif: bool,
    adobe: Option<u8>,
}

/// Scans a file may have: each costs a pass over its blocks (libjpeg-turbo's TurboJPEG refuses more,
/// `TJFLAG_LIMITSCANS`, as the native decoder here asks it to).
const MAX_SCANS: usize = 500;

fn bad(what: &str) -> Error {
    Error::Image(format!("JPEG: {what}"))
}

/// Decodes a complete JPEG (see [`super::jpeg::check_complete`]) to RGB8 as Pillow's
/// `convert("RGB")` sees it, before any EXIF orientation; `Ok(None)` for a file this decoder does not
/// cover (see the module docs). The pixel limit is checked ([`Error::ImageTooLarge`]) and the memory
/// the decode needs is checked against `limits.max_alloc_bytes` before anything is allocated.
pub fn decode(bytes: &[u8], limits: &ImageLimits) -> Result<Option<RgbImage>> {
    if bytes.get(..2) != Some(&[0xFF, 0xD8]) {
        return Err(bad("no start-of-image marker"));
    }
    let mut t = Tables::default();
    let mut frame: Option<Frame> = None;
    let mut i = 2;
    let mut scans = 0;
    loop {
        // The next marker (fill bytes and stray data before it are skipped, as libjpeg skips them).
        while bytes.get(i).is_some_and(|&b| b != 0xFF) {
            i += 1;
        }
        while bytes.get(i) == Some(&0xFF) {
            i += 1;
        }
        let Some(&code) = bytes.get(i) else {
            return Err(bad("no end-of-image marker"));
        };
        i += 1;
        if matches!(code, 0x01 | 0xD0..=0xD7) {
            continue;
        }
        if code == 0xD9 {
            break;
        }
        let len = bytes
            .get(i..i + 2)
            .map(|l| usize::from(u16::from_be_bytes([l[0], l[1]])))
            .ok_or_else(|| bad("truncated segment"))?;
        let body = len
            .checked_sub(2)
            .and_then(|n| bytes.get(i + 2..i + 2 + n))
            .ok_or_else(|| bad("truncated segment"))?;
        i += len;
        match code {
            0xC0..=0xC2 => {
                if frame.is_some() {
                    return Err(bad("a second frame header"));
                }
                match read_frame(body, code == 0xC2, limits)? {
                    Some(f) => frame = Some(f),
                    None => return Ok(None),
                }
            }
            // Lossless, hierarchical and arithmetic-coded frames, DNL.
            0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF | 0xDC => return Ok(None),
            0xC4 => read_huffman(body, &mut t)?,
            0xDB => read_quant(body, &mut t)?,
            0xDD => {
                let r = body.get(..2).ok_or_else(|| bad("bad DRI segment"))?;
                t.restart = usize::from(u16::from_be_bytes([r[0], r[1]]));
            }
            0xE0 if body.starts_with(b"JFIF\0") => t.jfif = true,
            0xEE if body.starts_with(b"Adobe") && body.len() >= 12 => t.adobe = Some(body[11]),
            0xDA => {
                scans += 1;
                if scans > MAX_SCANS {
                    return Err(bad(&format!("more than {MAX_SCANS} scans")));
                }
                let f = frame
                    .as_mut()
                    .ok_or_else(|| bad("a scan before the frame header"))?;
                let scan = read_scan(body, f, &t)?;
                i = decode_scan(bytes, i, f, &scan, &t)?;
            }
            _ => {}
        }
    }
    let f = frame.ok_or_else(|| bad("no frame"))?;
    if f.progressive && smoothing_applies(&f) {
        return Ok(None);
    }
    output(&f, &t).map(Some)
}

fn read_frame(b: &[u8], progressive: bool, limits: &ImageLimits) -> Result<Option<Frame>> {
    let [precision, h0, h1, w0, w1, n, rest @ ..] = b else {
        return Err(bad("bad frame header"));
    };
    let (height, width) = (
        usize::from(u16::from_be_bytes([*h0, *h1])),
        usize::from(u16::from_be_bytes([*w0, *w1])),
    );
    if *precision != 8 || height == 0 {
        return Ok(None); // 12-bit samples; a height given by DNL
    }
    if width == 0 {
        return Err(bad("zero width"));
    }
    let n = usize::from(*n);
    if !matches!(n, 1 | 3 | 4) || rest.len() < 3 * n {
        return Err(bad(&format!("{n} components")));
    }
    let pixels = width as u64 * height as u64;
    if pixels > limits.max_pixels {
        return Err(Error::ImageTooLarge {
            width: width as u64,
            height: height as u64,
            max_pixels: limits.max_pixels,
        });
    }
    let spec = component_specs(rest, n)?;
    let hmax = spec.iter().map(|s| s.1).max().unwrap_or(1);
    let vmax = spec.iter().map(|s| s.2).max().unwrap_or(1);
    let (mcux, mcuy) = (width.div_ceil(8 * hmax), height.div_ceil(8 * vmax));
    check_memory(&spec, (mcux, mcuy), (width, height), limits)?;
    let mut comps = Vec::with_capacity(n);
    for (id, h, v, tq) in spec {
        let (bw, bh) = (mcux * h, mcuy * v);
        let mut coefs = Vec::new();
        coefs
            .try_reserve_exact(bw * bh)
            .map_err(|e| Error::Image(format!("JPEG coefficients: {e}")))?;
        coefs.resize(bw * bh, [0i16; 64]);
        comps.push(Component {
            id,
            h,
            v,
            tq,
            quant: None,
            bw,
            bh,
            dw: (width * h).div_ceil(hmax),
            dh: (height * v).div_ceil(vmax),
            coefs,
            coef_bits: [-1; 64],
        });
    }
    Ok(Some(Frame {
        width,
        height,
        progressive,
        comps,
        hmax,
        vmax,
        mcux,
        mcuy,
    }))
}

/// The frame header's `n` component specifications in `rest`: (id, h, v, quantisation table), each
/// sampling factor in 1..=4 and each table in 0..=3.
fn component_specs(rest: &[u8], n: usize) -> Result<Vec<(u8, usize, usize, usize)>> {
    let spec: Vec<(u8, usize, usize, usize)> = rest
        .chunks_exact(3)
        .take(n)
        .map(|c| {
            (
                c[0],
                usize::from(c[1] >> 4),
                usize::from(c[1] & 15),
                usize::from(c[2]),
            )
        })
        .collect();
    if spec
        .iter()
        .any(|&(_, h, v, tq)| !(1..=4).contains(&h) || !(1..=4).contains(&v) || tq > 3)
    {
        return Err(bad("bad sampling factors or quantisation table"));
    }
    Ok(spec)
}

/// Checks the memory the decode needs against `limits.max_alloc_bytes`: coefficients (2 bytes each),
/// the planes, the upsampled planes and the output, for `mcus` (columns, rows) of MCUs.
fn check_memory(
    spec: &[(u8, usize, usize, usize)],
    (mcux, mcuy): (usize, usize),
    (width, height): (usize, usize),
    limits: &ImageLimits,
) -> Result<()> {
    let pixels = width as u64 * height as u64;
    let mut need: u64 = 0;
    for &(_, h, v, _) in spec {
        let blocks = (mcux * h) as u64 * (mcuy * v) as u64;
        need = need.saturating_add(blocks * (128 + 64) + pixels);
    }
    need = need.saturating_add(3 * pixels);
    if need > limits.max_alloc_bytes {
        return Err(Error::Image(format!(
            "decoding this {width}x{height} JPEG needs {need} bytes, over the limit of {}",
            limits.max_alloc_bytes
        )));
    }
    Ok(())
}

fn read_huffman(mut b: &[u8], t: &mut Tables) -> Result<()> {
    while let [tc_th, rest @ ..] = b {
        let counts: [u8; 16] = rest
            .get(..16)
            .and_then(|c| c.try_into().ok())
            .ok_or_else(|| bad("bad Huffman table"))?;
        let n: usize = counts.iter().map(|&c| usize::from(c)).sum();
        let symbols = rest
            .get(16..16 + n)
            .ok_or_else(|| bad("bad Huffman table"))?;
        let (class, slot) = (tc_th >> 4, usize::from(tc_th & 15));
        if slot > 3 || class > 1 {
            return Err(bad("bad Huffman table"));
        }
        let table = Huffman::new(&counts, symbols)?;
        if class == 0 {
            t.dc[slot] = Some(table);
        } else {
            t.ac[slot] = Some(table);
        }
        b = &rest[16 + n..];
    }
    Ok(())
}

fn read_quant(mut b: &[u8], t: &mut Tables) -> Result<()> {
    while let [pq_tq, rest @ ..] = b {
        let (wide, slot) = (pq_tq >> 4 != 0, usize::from(pq_tq & 15));
        let size = if wide { 128 } else { 64 };
        let raw = rest
            .get(..size)
            .ok_or_else(|| bad("bad quantisation table"))?;
        if slot > 3 {
            return Err(bad("bad quantisation table"));
        }
        let mut q = [0u16; 64];
        for (k, &pos) in entropy::NATURAL[..64].iter().enumerate() {
            q[pos] = if wide {
                u16::from_be_bytes([raw[2 * k], raw[2 * k + 1]])
            } else {
                u16::from(raw[k])
            };
        }
        t.quant[slot] = Some(q);
        b = &rest[size..];
    }
    Ok(())
}

fn read_scan(b: &[u8], f: &mut Frame, t: &Tables) -> Result<Scan> {
    let n = usize::from(*b.first().ok_or_else(|| bad("bad scan header"))?);
    let sel = b.get(1..1 + 2 * n).ok_or_else(|| bad("bad scan header"))?;
    let [ss, se, a] = b
        .get(1 + 2 * n..4 + 2 * n)
        .ok_or_else(|| bad("bad scan header"))?
    else {
        return Err(bad("bad scan header"));
    };
    let mut comps = Vec::with_capacity(n);
    for c in sel.chunks_exact(2) {
        let ci = f
            .comps
            .iter()
            .position(|k| k.id == c[0])
            .ok_or_else(|| bad("a scan names an unknown component"))?;
        let comp = &mut f.comps[ci];
        if comp.quant.is_none() {
            // libjpeg latches a component's table when its first scan begins.
            comp.quant = Some(t.quant[comp.tq].ok_or_else(|| bad("a missing quantisation table"))?);
        }
        comps.push((ci, usize::from(c[1] >> 4) & 3, usize::from(c[1] & 15) & 3));
    }
    let blocks: usize = comps
        .iter()
        .map(|&(ci, _, _)| f.comps[ci].h * f.comps[ci].v)
        .sum();
    if n == 0 || n > 4 || (n > 1 && blocks > 10) {
        return Err(bad("bad scan components"));
    }
    let scan = Scan {
        comps,
        ss: usize::from(*ss),
        se: usize::from(*se),
        ah: u32::from(a >> 4),
        al: u32::from(a & 15),
    };
    if f.progressive {
        let dc = scan.ss == 0;
        let band_bad = if dc {
            scan.se != 0
        } else {
            scan.se < scan.ss || scan.se > 63 || n != 1
        };
        if band_bad || (scan.ah != 0 && scan.al + 1 != scan.ah) || scan.al > 13 {
            return Err(bad("invalid progressive parameters"));
        }
    }
    // (A sequential scan's band and approximation bits are ignored, as libjpeg ignores them.)
    Ok(scan)
}

/// Huffman table `k` of a set, which a scan needs.
fn table(set: &[Option<Huffman>; 4], k: usize) -> Result<&Huffman> {
    set[k]
        .as_ref()
        .ok_or_else(|| bad("a missing Huffman table"))
}

/// The DC and AC Huffman tables of each of the scan's components (`None` where the scan does not
/// use that kind).
type ScanTables<'t> = (Vec<Option<&'t Huffman>>, Vec<Option<&'t Huffman>>);

fn scan_tables<'t>(progressive: bool, s: &Scan, t: &'t Tables) -> Result<ScanTables<'t>> {
    let dc_needed = !progressive || (s.ss == 0 && s.ah == 0);
    let ac_needed = !progressive || s.ss > 0;
    let mut dc = Vec::new();
    let mut ac = Vec::new();
    for &(_, td, ta) in &s.comps {
        dc.push(if dc_needed {
            Some(table(&t.dc, td)?)
        } else {
            None
        });
        ac.push(if ac_needed {
            Some(table(&t.ac, ta)?)
        } else {
            None
        });
    }
    Ok((dc, ac))
}

/// The scan's MCU columns and rows, and the blocks of each MCU: (component slot in the scan, block
/// column, block row).
fn mcu_layout(f: &Frame, s: &Scan) -> (usize, usize, Vec<(usize, usize, usize)>) {
    if s.comps.len() == 1 {
        let c = &f.comps[s.comps[0].0];
        (c.dw.div_ceil(8), c.dh.div_ceil(8), vec![(0, 0, 0)])
    } else {
        let mut l = Vec::new();
        for (k, &(ci, _, _)) in s.comps.iter().enumerate() {
            for v in 0..f.comps[ci].v {
                for h in 0..f.comps[ci].h {
                    l.push((k, h, v));
                }
            }
        }
        (f.mcux, f.mcuy, l)
    }
}

/// Decode one scan's entropy data (from `pos`) into the frame's coefficients; returns where its data
/// ends (the next marker).
fn decode_scan(bytes: &[u8], pos: usize, f: &mut Frame, s: &Scan, t: &Tables) -> Result<usize> {
    let (dc, ac) = scan_tables(f.progressive, s, t)?;
    if f.progressive {
        for &(ci, _, _) in &s.comps {
            for k in s.ss..=s.se {
                f.comps[ci].coef_bits[k] = s.al as i8;
            }
        }
    }
    let (mcus_x, mcus_y, layout) = mcu_layout(f, s);
    let mut bits = Bits::new(bytes, pos);
    let mut pred = vec![0i32; s.comps.len()];
    let mut eobrun = 0u32;
    let band = Band {
        ss: s.ss,
        se: s.se,
        al: s.al,
    };
    let total = mcus_x * mcus_y;
    for m in 0..total {
        if t.restart > 0 && m > 0 && m % t.restart == 0 {
            bits.restart();
            pred.iter_mut().for_each(|p| *p = 0);
            eobrun = 0;
        }
        if bits.insufficient {
            continue; // libjpeg leaves the MCUs after the data ran out alone
        }
        let (mx, my) = (m % mcus_x, m / mcus_x);
        for &(k, h, v) in &layout {
            let comp = &mut f.comps[s.comps[k].0];
            let (bx, by) = if s.comps.len() == 1 {
                (mx, my)
            } else {
                (mx * comp.h + h, my * comp.v + v)
            };
            let block = &mut comp.coefs[by * comp.bw + bx];
            match (f.progressive, s.ss == 0) {
                (false, _) => {
                    let (Some(d), Some(a)) = (dc[k], ac[k]) else {
                        continue;
                    };
                    entropy::sequential_block(&mut bits, d, a, &mut pred[k], block);
                }
                (true, true) => {
                    entropy::dc_progressive(&mut bits, dc[k], s.al, &mut pred[k], block)
                }
                (true, false) => {
                    let Some(a) = ac[k] else { continue };
                    if s.ah == 0 {
                        entropy::ac_first(&mut bits, a, band, &mut eobrun, block);
                    } else {
                        entropy::ac_refine(&mut bits, a, band, &mut eobrun, block);
                    }
                }
            }
        }
    }
    Ok(bits.end())
}

/// Whether libjpeg would smooth this progressive file's blocks (`smoothing_ok` in `jdcoefct.c`): every
/// component's DC is known and some of its first 9 AC coefficients are not known to full precision.
fn smoothing_applies(f: &Frame) -> bool {
    let dc_known = f.comps.iter().all(|c| c.coef_bits[0] >= 0);
    // The quantisers of those coefficients (natural order) must be nonzero.
    let used = [0, 1, 8, 16, 9, 2, 3, 10, 17, 24];
    let quant_ok = f
        .comps
        .iter()
        .all(|c| c.quant.is_some_and(|q| used.iter().all(|&k| q[k] != 0)));
    let partial = f
        .comps
        .iter()
        .any(|c| c.coef_bits[1..=9].iter().any(|&b| b != 0));
    dc_known && quant_ok && partial
}

/// Inverse DCT, upsampling and colour conversion of the decoded frame.
fn output(f: &Frame, t: &Tables) -> Result<RgbImage> {
    let (w, h) = (f.width, f.height);
    if f.comps
        .iter()
        .any(|c| !f.hmax.is_multiple_of(c.h) || !f.vmax.is_multiple_of(c.v))
    {
        return Err(bad("fractional sampling ratios"));
    }
    let mut planes = Vec::with_capacity(f.comps.len());
    for c in &f.comps {
        let quant = c.quant.unwrap_or([0; 64]); // never scanned: libjpeg outputs its zero blocks' 128s
        let stride = c.bw * 8;
        let mut p = vec![0u8; stride * c.bh * 8];
        for by in 0..c.bh {
            for bx in 0..c.bw {
                let at = by * 8 * stride + bx * 8;
                idct::idct_islow(&c.coefs[by * c.bw + bx], &quant, &mut p[at..], stride);
            }
        }
        let plane = Plane {
            data: &p,
            stride,
            width: c.dw,
            height: c.dh,
        };
        let up = upsample::upsample(&plane, f.hmax / c.h, f.vmax / c.v, w, h)
            .ok_or_else(|| bad("unsupported sampling ratios"))?;
        planes.push(up);
    }
    let n = w * h;
    let mut out = Vec::new();
    out.try_reserve_exact(3 * n)
        .map_err(|e| Error::Image(format!("JPEG output: {e}")))?;
    let ycc = YccTables::new();
    match planes.as_slice() {
        [g] => g.iter().for_each(|&v| out.extend_from_slice(&[v, v, v])),
        [a, b, c] => {
            let rgb = if t.jfif {
                false
            } else if let Some(tr) = t.adobe {
                tr == 0
            } else {
                f.comps.iter().map(|c| c.id).eq([b'R', b'G', b'B'])
            };
            for i in 0..n {
                if rgb {
                    out.extend_from_slice(&[a[i], b[i], c[i]]);
                } else {
                    out.extend_from_slice(&ycc.rgb(a[i], b[i], c[i]));
                }
            }
        }
        [a, b, c, k] => {
            let ycck = t.adobe.is_some_and(|tr| tr != 0);
            for i in 0..n {
                let cmy = if ycck {
                    ycc.rgb(a[i], b[i], c[i]).map(|v| 255 - v)
                } else {
                    [a[i], b[i], c[i]]
                };
                out.extend_from_slice(&inverted_cmyk_to_rgb([cmy[0], cmy[1], cmy[2], k[i]]));
            }
        }
        _ => return Err(bad("unsupported component count")),
    }
    RgbImage::from_raw(w as u32, h as u32, out).ok_or_else(|| bad("pixel buffer size mismatch"))
}
