//! Native JPEG decoding through libjpeg-turbo (its TurboJPEG API, linked from the system `libturbojpeg`;
//! see scripts/build/link_libjpeg_turbo.rs), the decoder Pillow uses: the TurboJPEG defaults are libjpeg's
//! accurate integer IDCT (`JDCT_ISLOW`) and fancy (triangle-filter) chroma upsampling, which is what
//! Pillow's `Image.open(f).convert("RGB")` gets, so the pixels are Pillow's exactly (the fixtures of
//! scripts/fixtures/make_jpeg_fixtures.py: 4:2:0, 4:2:2, 4:4:4, grey, progressive, restart markers, partial MCUs,
//! CMYK). Built only with the `libjpeg-turbo` feature (on by default) and never for wasm32.
//!
//! Only the TurboJPEG 2.x functions are used (`tjInitDecompress`, `tjDecompressHeader3`,
//! `tjDecompress2`), which libjpeg-turbo 3 keeps, so Debian 12's 2.1 and newer libraries both work.
//! libjpeg's errors longjmp back inside those functions; nothing unwinds through Rust frames.
//!
//! Colour: YCbCr, RGB and grey files are decoded to RGB by libjpeg (grey replicated, as Pillow's
//! `L -> RGB`). CMYK and YCCK files are decoded to libjpeg's CMYK, inverted (Pillow's `CMYK;I` raw mode,
//! which assumes Adobe's inverted samples for every CMYK JPEG) and converted with Pillow's `CMYK -> RGB`
//! formula (`cmyk2rgb` in Convert.c).
//!
//! Warnings (libjpeg's recoveries: extraneous bytes before a marker, an unknown JFIF revision, ...) are
//! ignored, in the header as in the data, as Pillow ignores them; truncated files never get here ([`super::jpeg::check_complete`] refuses them first).
//! Files with more than 500 scans are refused (TurboJPEG's `TJFLAG_LIMITSCANS`): no camera writes them,
//! and each scan can cost a pass over the whole image.

use std::ffi::{c_char, c_int, c_uchar, c_ulong, c_void, CStr};

use super::jpeg::{inverted_cmyk_to_rgb, Headers};
use super::limits::ImageLimits;
use crate::error::{Error, Result};
use ::image::RgbImage;

type TjHandle = *mut c_void;

// TurboJPEG's constants (turbojpeg.h).
const TJPF_RGB: c_int = 0;
const TJPF_CMYK: c_int = 11;
const TJCS_RGB: c_int = 0;
const TJCS_YCBCR: c_int = 1;
const TJCS_GRAY: c_int = 2;
const TJCS_CMYK: c_int = 3;
const TJCS_YCCK: c_int = 4;
const TJERR_WARNING: c_int = 0;
const TJFLAG_LIMITSCANS: c_int = 32768;

// Linked by scripts/build/link_libjpeg_turbo.rs (pkg-config's `libturbojpeg`).
extern "C" {
    fn tjInitDecompress() -> TjHandle;
    fn tjDecompressHeader3(
        handle: TjHandle,
        jpeg_buf: *const c_uchar,
        jpeg_size: c_ulong,
        width: *mut c_int,
        height: *mut c_int,
        jpeg_subsamp: *mut c_int,
        jpeg_colorspace: *mut c_int,
    ) -> c_int;
    fn tjDecompress2(
        handle: TjHandle,
        jpeg_buf: *const c_uchar,
        jpeg_size: c_ulong,
        dst_buf: *mut c_uchar,
        width: c_int,
        pitch: c_int,
        height: c_int,
        pixel_format: c_int,
        flags: c_int,
    ) -> c_int;
    fn tjGetErrorStr2(handle: TjHandle) -> *mut c_char;
    fn tjGetErrorCode(handle: TjHandle) -> c_int;
    fn tjDestroy(handle: TjHandle) -> c_int;
}

/// A decompressor instance, destroyed on drop.
struct Decompressor(TjHandle);

impl Decompressor {
    fn new() -> Result<Self> {
        // SAFETY: no arguments; returns NULL on failure, checked.
        let h = unsafe { tjInitDecompress() };
        if h.is_null() {
            return Err(Error::Image(
                "libjpeg-turbo: cannot create a JPEG decompressor".into(),
            ));
        }
        Ok(Decompressor(h))
    }

    /// Whether a call's return value `r` means failure: -1 with a fatal error. -1 after a warning (the
    /// call completed; libjpeg recovered from something, such as an unknown JFIF revision or extraneous
    /// bytes before a marker) is success, as Pillow ignores libjpeg's warnings.
    fn failed(&self, r: c_int) -> bool {
        // SAFETY: a live handle.
        r != 0 && unsafe { tjGetErrorCode(self.0) } != TJERR_WARNING
    }

    /// The message of the last error on this instance.
    fn error(&self, what: &str) -> Error {
        // SAFETY: a live handle; the returned string belongs to the handle (or is static) and is copied
        // before the handle can change.
        let msg = unsafe {
            let p = tjGetErrorStr2(self.0);
            if p.is_null() {
                "unknown error".to_string()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Error::Image(format!("JPEG {what}: {}", msg.trim()))
    }
}

impl Drop for Decompressor {
    fn drop(&mut self) {
        // SAFETY: a live handle, destroyed once.
        unsafe {
            tjDestroy(self.0);
        }
    }
}

/// Decodes JPEG `bytes` (already checked complete) to RGB8 as Pillow's `convert("RGB")` does, before any
/// EXIF orientation. The header is read first: the pixel limit ([`Error::ImageTooLarge`]) is checked
/// before any pixel data is decoded, and the memory the decode needs (the output buffer, plus libjpeg's
/// whole-image coefficient buffer for progressive and multi-scan files, from `headers`) against
/// `limits.max_alloc_bytes`.
pub(crate) fn decode(bytes: &[u8], headers: &Headers, limits: &ImageLimits) -> Result<RgbImage> {
    let size = c_ulong::try_from(bytes.len())
        .map_err(|_| Error::Image(format!("JPEG of {} bytes is too large", bytes.len())))?;
    let tj = Decompressor::new()?;
    let (w, h, colorspace) = tj.header(bytes, size)?;
    let (width, height) = match (u32::try_from(w), u32::try_from(h)) {
        (Ok(width), Ok(height)) if width > 0 && height > 0 => (width, height),
        _ => return Err(Error::Image(format!("JPEG has size {w}x{h}"))),
    };
    let pixels = u64::from(width) * u64::from(height);
    if pixels > limits.max_pixels {
        return Err(Error::ImageTooLarge {
            width: u64::from(width),
            height: u64::from(height),
            max_pixels: limits.max_pixels,
        });
    }
    let (format, channels) = output_format(colorspace)?;
    let out_bytes = pixels * channels;
    check_alloc(headers, (width, height), out_bytes, limits)?;
    let n = usize::try_from(out_bytes)
        .map_err(|_| Error::Image("JPEG output buffer too large".into()))?;
    let mut buf: Vec<u8> = Vec::new();
    buf.try_reserve_exact(n)
        .map_err(|e| Error::Image(format!("JPEG output buffer of {n} bytes: {e}")))?;
    buf.resize(n, 0);
    // SAFETY: a live handle; `buf` holds width * height * channels bytes, which is what `format` at
    // pitch 0 (tightly packed rows) writes for a `w` x `h` image.
    let r = unsafe {
        tjDecompress2(
            tj.0,
            bytes.as_ptr(),
            size,
            buf.as_mut_ptr(),
            w,
            0,
            h,
            format,
            TJFLAG_LIMITSCANS,
        )
    };
    if tj.failed(r) {
        return Err(tj.error("decode"));
    }
    if format == TJPF_CMYK {
        cmyk_to_rgb_in_place(&mut buf);
    }
    RgbImage::from_raw(width, height, buf)
        .ok_or_else(|| Error::Image("JPEG pixel buffer size mismatch".into()))
}

impl Decompressor {
    /// The (width, height, colour space) of the JPEG `bytes` (`size` bytes), from its header alone.
    fn header(&self, bytes: &[u8], size: c_ulong) -> Result<(c_int, c_int, c_int)> {
        let (mut w, mut h, mut subsamp, mut colorspace): (c_int, c_int, c_int, c_int) =
            (0, 0, 0, 0);
        // SAFETY: a live handle, `bytes` valid for `size` bytes, four valid out-pointers.
        let r = unsafe {
            tjDecompressHeader3(
                self.0,
                bytes.as_ptr(),
                size,
                &mut w,
                &mut h,
                &mut subsamp,
                &mut colorspace,
            )
        };
        if self.failed(r) {
            return Err(self.error("header"));
        }
        Ok((w, h, colorspace))
    }
}

/// The pixel format libjpeg-turbo decodes colour space `colorspace` to, and its bytes per pixel.
fn output_format(colorspace: c_int) -> Result<(c_int, u64)> {
    match colorspace {
        TJCS_RGB | TJCS_YCBCR | TJCS_GRAY => Ok((TJPF_RGB, 3u64)),
        TJCS_CMYK | TJCS_YCCK => Ok((TJPF_CMYK, 4u64)),
        other => Err(Error::Image(format!(
            "JPEG colour space {other} is not supported"
        ))),
    }
}

/// Checks the memory a decode needs against `limits.max_alloc_bytes`: the output buffer of
/// `out_bytes`, plus libjpeg's whole-image coefficient buffer for progressive and multi-scan files.
fn check_alloc(
    headers: &Headers,
    (width, height): (u32, u32),
    out_bytes: u64,
    limits: &ImageLimits,
) -> Result<()> {
    let coefficients = match &headers.frame {
        Some(f)
            if f.progressive()
                || headers
                    .first_scan_components
                    .is_some_and(|n| usize::from(n) < f.sampling.len()) =>
        {
            f.coefficient_bytes()
        }
        _ => 0,
    };
    let need = out_bytes.saturating_add(coefficients);
    if need > limits.max_alloc_bytes {
        return Err(Error::Image(format!(
            "decoding this {width}x{height} JPEG needs {need} bytes, over the limit of {}",
            limits.max_alloc_bytes
        )));
    }
    Ok(())
}

/// Converts `buf`'s inverted CMYK pixels to RGB, in place, and drops the freed tail.
fn cmyk_to_rgb_in_place(buf: &mut Vec<u8>) {
    // Front to back: pixel i's RGB (bytes 3i..3i+3) never overwrites an unread CMYK sample (bytes
    // 4i.. onwards).
    let count = buf.len() / 4;
    for i in 0..count {
        let Some(&[c, m, y, k]) = buf.get(4 * i..4 * i + 4) else {
            break;
        };
        if let Some(dst) = buf.get_mut(3 * i..3 * i + 3) {
            dst.copy_from_slice(&inverted_cmyk_to_rgb([c, m, y, k]));
        }
    }
    buf.truncate(count * 3);
}

#[cfg(test)]
mod tests {
    use super::super::jpeg::inverted_cmyk_to_rgb;

    /// Endpoints of Pillow's formula: no ink is white, full black is black, full cyan zeroes red only.
    #[test]
    fn cmyk_endpoints() {
        // Raw (inverted) samples: 255 means no ink.
        assert_eq!(inverted_cmyk_to_rgb([255, 255, 255, 255]), [255, 255, 255]);
        assert_eq!(inverted_cmyk_to_rgb([255, 255, 255, 0]), [0, 0, 0]);
        assert_eq!(inverted_cmyk_to_rgb([0, 255, 255, 255]), [0, 255, 255]);
        // Half black, no colour: nk = 128.
        assert_eq!(inverted_cmyk_to_rgb([255, 255, 255, 128]), [128, 128, 128]);
    }
}
