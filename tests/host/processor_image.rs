//! Image processor vs the reference (Pillow + transformers), on golden data made by
//! `scripts/fixtures/make_image_golden.py` (tests/fixtures/processor/).
#![cfg(not(target_arch = "wasm32"))]

use florence2_wasm::processor::image::{
    decode_image, decode_image_with, decode_jpeg_portable, preprocess, preprocess_bytes,
    preprocess_rgba, resize_pil, AlphaMode, Filter, ImageLimits, ImageProcessorConfig,
};
use florence2_wasm::Error;
use image::RgbImage;
use serde_json::Value;

const FIX: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/processor");

fn read(rel: &str) -> Vec<u8> {
    std::fs::read(format!("{FIX}/{rel}")).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn json(rel: &str) -> Value {
    serde_json::from_slice(&read(rel)).unwrap()
}

/// Golden RGB8 PNGs are decoded with the image crate directly (lossless, 8-bit RGB: no conversion).
fn golden_rgb(rel: &str) -> RgbImage {
    image::load_from_memory_with_format(&read(rel), image::ImageFormat::Png)
        .unwrap()
        .into_rgb8()
}

/// (number of differing values, max abs difference).
fn diff_u8(a: &RgbImage, b: &RgbImage) -> (usize, u8) {
    assert_eq!(a.dimensions(), b.dimensions());
    let mut n = 0;
    let mut m = 0u8;
    for (x, y) in a.as_raw().iter().zip(b.as_raw()) {
        let d = x.abs_diff(*y);
        if d > 0 {
            n += 1;
            m = m.max(d);
        }
    }
    (n, m)
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// PIL's `Image.resize((w, h), BICUBIC)` is integer arithmetic on top of f64 coefficients computed the
/// same way, so the resized uint8 must match exactly: tolerance 0 differing values.
#[test]
fn resize_matches_pil_bicubic_exactly() {
    let cases = json("resize/cases.json");
    let cases = cases.as_array().unwrap();
    assert!(cases.len() >= 14);
    let mut total_values = 0usize;
    let mut total_diff = 0usize;
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let ow = c["out"][0].as_u64().unwrap() as u32;
        let oh = c["out"][1].as_u64().unwrap() as u32;
        let input = golden_rgb(&format!("resize/{name}.in.png"));
        assert_eq!(input.width() as u64, c["in"][0].as_u64().unwrap());
        assert_eq!(input.height() as u64, c["in"][1].as_u64().unwrap());
        let want = golden_rgb(&format!("resize/{name}.out.png"));
        let got = resize_pil(&input, ow, oh, Filter::Bicubic).unwrap();
        let (n, m) = diff_u8(&got, &want);
        println!(
            "{name}: {}x{} -> {ow}x{oh}: {n} of {} values differ (max {m})",
            input.width(),
            input.height(),
            want.as_raw().len()
        );
        total_values += want.as_raw().len();
        total_diff += n;
    }
    println!("resize total: {total_diff} of {total_values} values differ");
    assert_eq!(total_diff, 0);
}

/// Decoded + converted pixels vs what `transformers.image_transforms.convert_to_rgb(Image.open(f))`
/// gives (composited onto white), and vs Pillow's plain `convert("RGB")` for `AlphaMode::Drop`. PNG
/// decoding is lossless and the conversions are integer formulas: exact.
#[test]
fn png_colour_types_convert_like_the_reference() {
    let cases = json("convert/cases.json");
    let cases = cases.as_array().unwrap();
    assert!(cases.len() >= 13);
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let bytes = read(&format!("convert/{name}.png"));
        let got = decode_image(&bytes, &ImageLimits::default()).unwrap();
        let (n, m) = diff_u8(&got, &golden_rgb(&format!("convert/{name}.rgb.png")));
        println!(
            "{name} (PIL mode {}): composite: {n} values differ (max {m})",
            c["mode"]
        );
        assert_eq!(n, 0, "{name}: composite onto white");
        let got = decode_image_with(&bytes, &ImageLimits::default(), AlphaMode::Drop).unwrap();
        let (n, m) = diff_u8(&got, &golden_rgb(&format!("convert/{name}.drop.png")));
        println!("{name}: drop alpha: {n} values differ (max {m})");
        assert_eq!(n, 0, "{name}: convert(\"RGB\")");
    }
}

/// Every JPEG fixture with what Pillow decodes from it: the JPEG fixtures of
/// scripts/fixtures/make_jpeg_fixtures.py (tests/fixtures/images/jpeg/: 4:2:0, 4:2:2, 4:4:4, greyscale,
/// progressive, restart markers, odd sizes with partial MCUs, CMYK, EXIF orientation 8),
/// scripts/fixtures/make_image_formats.py's scene.jpg and scene_exif6.jpg (vs `Image.open(f).convert("RGB")`,
/// after `ImageOps.exif_transpose` for the EXIF ones), and the processor's golden JPEGs
/// (scripts/fixtures/make_image_golden.py).
fn pillow_jpegs() -> Vec<(String, Vec<u8>, RgbImage)> {
    let images = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/images");
    let load = |rel: &str| {
        std::fs::read(format!("{images}/{rel}")).unwrap_or_else(|e| panic!("{rel}: {e}"))
    };
    let png = |bytes: Vec<u8>| {
        image::load_from_memory_with_format(&bytes, image::ImageFormat::Png)
            .unwrap()
            .into_rgb8()
    };
    let names: Vec<String> = serde_json::from_slice(&load("jpeg/cases.json")).unwrap();
    assert!(names.len() >= 13, "{names:?}");
    let mut pairs: Vec<(String, String)> = names
        .iter()
        .map(|n| (format!("jpeg/{n}.jpg"), format!("jpeg/{n}.png")))
        .collect();
    pairs.push(("scene.jpg".into(), "formats/scene.jpg.png".into()));
    pairs.push((
        "formats/scene_exif6.jpg".into(),
        "formats/scene_exif6.png".into(),
    ));
    let mut out: Vec<(String, Vec<u8>, RgbImage)> = pairs
        .iter()
        .map(|(jpg, want)| (jpg.clone(), load(jpg), png(load(want))))
        .collect();
    for c in json("jpeg/cases.json").as_array().unwrap() {
        let name = c.as_str().unwrap();
        out.push((
            format!("processor/jpeg/{name}.jpg"),
            read(&format!("jpeg/{name}.jpg")),
            golden_rgb(&format!("jpeg/{name}.rgb.png")),
        ));
    }
    out
}

/// Every JPEG fixture through [`decode_image`], value for value against Pillow (with libjpeg-turbo).
#[test]
fn jpeg_decodes_exactly_like_pillow() {
    let mut worst = 0u8;
    for (jpg, bytes, want) in pillow_jpegs() {
        let got =
            decode_image(&bytes, &ImageLimits::default()).unwrap_or_else(|e| panic!("{jpg}: {e}"));
        assert_eq!(got.dimensions(), want.dimensions(), "{jpg}");
        let (n, m) = diff_u8(&got, &want);
        println!(
            "{jpg}: {n} of {} values differ from Pillow (max {m})",
            want.as_raw().len()
        );
        worst = worst.max(m);
    }
    // libjpeg-turbo natively; the crate's own decoder without the feature: equal either way.
    assert_eq!(worst, 0, "max diff {worst}");
}

/// The crate's own JPEG decoder (what the wasm build uses outside the browser) gives Pillow's pixels
/// on every fixture: baseline and progressive, every subsampling, restart intervals, partial MCUs,
/// CMYK and EXIF-rotated files. None of them is left to the fallback decoder.
#[test]
fn portable_jpeg_decoder_equals_pillow() {
    for (jpg, bytes, want) in pillow_jpegs() {
        let got = decode_jpeg_portable(&bytes, &ImageLimits::default(), AlphaMode::default())
            .unwrap_or_else(|e| panic!("{jpg}: {e}"))
            .unwrap_or_else(|| panic!("{jpg}: not covered by the portable decoder"));
        assert_eq!(got.dimensions(), want.dimensions(), "{jpg}");
        let (n, m) = diff_u8(&got, &want);
        assert_eq!(n, 0, "{jpg}: {n} values differ from Pillow (max {m})");
    }
}

fn pipeline_cfg() -> (Value, ImageProcessorConfig) {
    let p = json("pipeline.json");
    let cfg_bytes = serde_json::to_vec(&p["preprocessor_config"]).unwrap();
    (
        p,
        ImageProcessorConfig::from_json_bytes(&cfg_bytes).unwrap(),
    )
}

/// Full `pixel_values` vs transformers' `CLIPImageProcessorPil` (Florence-2's processor) output. The
/// rescale (f64 multiply, cast to f32) and normalise (f32 subtract, f32 divide) are the same IEEE
/// operations as numpy's, so the tolerance 1e-6 is only a guard; the measured difference is printed.
#[test]
fn pixel_values_match_transformers() {
    let (p, cfg) = pipeline_cfg();
    assert_eq!((cfg.height, cfg.width), (24, 32));
    let st_bytes = read("pipeline.safetensors");
    let st = safetensors::SafeTensors::deserialize(&st_bytes).unwrap();
    let inputs = p["inputs"].as_object().unwrap();
    for (name, rel) in inputs {
        let t = st.tensor(name).unwrap();
        assert_eq!(t.shape(), &[1, 3, 24, 32]);
        let want = f32s(t.data());
        let got =
            preprocess_bytes(&read(rel.as_str().unwrap()), &cfg, &ImageLimits::default()).unwrap();
        let d = max_abs(&got, &want);
        println!("{name}: max |ours - transformers| = {d:e}");
        // JPEGs too: decoded to Pillow's pixels (libjpeg-turbo, or the crate's own decoder).
        assert!(d <= 1e-6, "{name}: {d}");
    }
}

/// The browser path: raw RGBA (ImageData) through `preprocess_rgba` equals the file path.
#[test]
fn preprocess_rgba_matches_file_path() {
    let (_, cfg) = pipeline_cfg();
    let st_bytes = read("pipeline.safetensors");
    let st = safetensors::SafeTensors::deserialize(&st_bytes).unwrap();
    let want = f32s(st.tensor("rgba8").unwrap().data());
    let rgba = image::load_from_memory(&read("convert/rgba8.png"))
        .unwrap()
        .into_rgba8();
    let (w, h) = rgba.dimensions();
    let got = preprocess_rgba(rgba.as_raw(), w, h, &cfg, &ImageLimits::default()).unwrap();
    let d = max_abs(&got, &want);
    println!("rgba8 via ImageData: max diff {d:e}");
    assert!(d <= 1e-6);
    // Opaque RGBA equals the RGB path.
    let rgb = golden_rgb("resize/up_both.in.png");
    let opaque: Vec<u8> = rgb
        .as_raw()
        .chunks_exact(3)
        .flat_map(|p| [p[0], p[1], p[2], 255])
        .collect();
    let a = preprocess_rgba(
        &opaque,
        rgb.width(),
        rgb.height(),
        &cfg,
        &ImageLimits::default(),
    )
    .unwrap();
    let b = preprocess(&rgb, &cfg).unwrap();
    assert_eq!(a, b);
    // Malformed buffers and oversize.
    assert!(matches!(
        preprocess_rgba(
            &opaque[1..],
            rgb.width(),
            rgb.height(),
            &cfg,
            &ImageLimits::default()
        ),
        Err(Error::Image(_))
    ));
    assert!(matches!(
        preprocess_rgba(&[], 0, 0, &cfg, &ImageLimits::default()),
        Err(Error::Image(_))
    ));
    let small = ImageLimits {
        max_pixels: 100,
        ..ImageLimits::default()
    };
    assert!(matches!(
        preprocess_rgba(&opaque, rgb.width(), rgb.height(), &cfg, &small),
        Err(Error::ImageTooLarge {
            max_pixels: 100,
            ..
        })
    ));
}

fn crc32(data: &[u8]) -> u32 {
    let mut c = 0xFFFF_FFFFu32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
    }
    !c
}

fn png_chunk(png: &mut Vec<u8>, tag: &[u8], data: &[u8]) {
    let mut body = tag.to_vec();
    body.extend_from_slice(data);
    png.extend_from_slice(&(data.len() as u32).to_be_bytes());
    png.extend_from_slice(&body);
    png.extend_from_slice(&crc32(&body).to_be_bytes());
}

/// A PNG whose IHDR claims `w`x`h` RGB8 followed by an IDAT of junk (not a zlib stream) and IEND:
/// decoding it fails with a decode error, so an `ImageTooLarge` proves the check came before decoding.
fn header_only_png(w: u32, h: u32) -> Vec<u8> {
    let mut ihdr = b"IHDR".to_vec();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png_chunk(&mut png, b"IHDR", &ihdr[4..]);
    png_chunk(&mut png, b"IDAT", b"this is not zlib data");
    png_chunk(&mut png, b"IEND", b"");
    png
}

#[test]
fn oversized_images_are_rejected_before_decoding() {
    let png = header_only_png(20000, 20000);
    let limits = ImageLimits::default();
    match decode_image(&png, &limits) {
        Err(Error::ImageTooLarge {
            width: 20000,
            height: 20000,
            max_pixels,
        }) => {
            assert_eq!(max_pixels, limits.max_pixels)
        }
        other => panic!("expected ImageTooLarge, got {other:?}"),
    }
    let e = decode_image(&png, &limits).unwrap_err();
    assert_eq!(e.name(), "Florence2ImageTooLargeError");
    // The same header within the limit reaches the decoder, which fails on the missing data.
    let small = header_only_png(20, 20);
    assert!(matches!(
        decode_image(&small, &limits),
        Err(Error::Image(_))
    ));

    // A JPEG whose SOF0 claims 20000x20000 (patched header of a real JPEG).
    let mut jpg = read("jpeg/color420.jpg");
    let sof = jpg
        .windows(2)
        .position(|w| w == [0xFF, 0xC0])
        .expect("baseline SOF0");
    jpg[sof + 5..sof + 9].copy_from_slice(&[0x4E, 0x20, 0x4E, 0x20]);
    assert!(matches!(
        decode_image(&jpg, &limits),
        Err(Error::ImageTooLarge {
            width: 20000,
            height: 20000,
            ..
        })
    ));

    // The limit is configurable and inclusive: a 7x5 image has 35 pixels.
    let bytes = read("convert/rgb8.png");
    let l34 = ImageLimits {
        max_pixels: 34,
        ..limits
    };
    let l35 = ImageLimits {
        max_pixels: 35,
        ..limits
    };
    assert!(matches!(
        decode_image(&bytes, &l34),
        Err(Error::ImageTooLarge {
            width: 7,
            height: 5,
            ..
        })
    ));
    assert_eq!(decode_image(&bytes, &l35).unwrap().dimensions(), (7, 5));
    // The decoder allocation limit is enforced too.
    let tiny_alloc = ImageLimits {
        max_alloc_bytes: 16,
        ..limits
    };
    assert!(matches!(
        decode_image(&bytes, &tiny_alloc),
        Err(Error::Image(_))
    ));
}

#[test]
fn corrupt_and_unsupported_inputs_are_named_errors() {
    let png = read("resize/down_both.in.png");
    let jpg = read("jpeg/color420.jpg");
    let limits = ImageLimits::default();
    let mut flipped = png.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0xFF; // CRC mismatch / corrupt zlib stream
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("garbage", b"hello, this is not an image at all".to_vec()),
        ("gif", b"GIF89a\x01\x00\x01\x00\x00\x00\x00;".to_vec()),
        ("png signature only", png[..8].to_vec()),
        ("truncated png", png[..png.len() / 2].to_vec()),
        ("corrupt png", flipped),
        ("jpeg marker only", jpg[..4].to_vec()),
        ("png zero width", header_only_png(0, 10)),
    ];
    for (what, bytes) in cases {
        match decode_image(&bytes, &limits) {
            Err(e @ Error::Image(_)) => {
                assert_eq!(e.name(), "Florence2ImageError");
                println!("{what}: {e}");
            }
            other => panic!("{what}: expected Error::Image, got {other:?}"),
        }
    }
    // A truncated JPEG: whatever the decoder does, it never panics.
    let r = decode_image(&jpg[..jpg.len() / 2], &limits);
    println!(
        "truncated jpeg: {:?}",
        r.as_ref()
            .map(|i| i.dimensions())
            .map_err(|e| e.to_string())
    );
}

/// 60 random size pairs (1..48 in each of the four sides, noise content) vs Pillow: exact.
#[test]
fn resize_matches_pil_on_random_sizes() {
    let bytes = read("resize/random.safetensors");
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let (mut cases, mut values, mut differ) = (0, 0, 0);
    for i in 0.. {
        let Ok(inp) = st.tensor(&format!("{i}.in")) else {
            break;
        };
        let out = st.tensor(&format!("{i}.out")).unwrap();
        let (ih, iw) = (inp.shape()[0] as u32, inp.shape()[1] as u32);
        let (oh, ow) = (out.shape()[0] as u32, out.shape()[1] as u32);
        let src = RgbImage::from_raw(iw, ih, inp.data().to_vec()).unwrap();
        let want = RgbImage::from_raw(ow, oh, out.data().to_vec()).unwrap();
        let got = resize_pil(&src, ow, oh, Filter::Bicubic).unwrap();
        let (n, m) = diff_u8(&got, &want);
        if n > 0 {
            println!("case {i}: {iw}x{ih} -> {ow}x{oh}: {n} values differ (max {m})");
        }
        cases += 1;
        values += want.as_raw().len();
        differ += n;
    }
    println!("{cases} random cases: {differ} of {values} values differ");
    assert_eq!(cases, 60);
    assert_eq!(differ, 0);
}

/// Mutated and truncated PNG/JPEG bytes never panic: every outcome is Ok or a named error.
#[test]
fn mutated_images_never_panic() {
    let limits = ImageLimits::default();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let (mut ok, mut err) = (0, 0);
    let mut portable = (0, 0, 0);
    for file in [
        "convert/rgba16.png",
        "convert/palette_trns.png",
        "jpeg/color420.jpg",
        "jpeg/grey.jpg",
        "../images/jpeg/progressive420.jpg",
        "../images/jpeg/cmyk.jpg",
        "../images/jpeg/restart_blocks420.jpg",
    ] {
        let orig = read(file);
        for _ in 0..400 {
            let mut b = orig.clone();
            for _ in 0..1 + next() % 4 {
                let i = (next() as usize) % b.len();
                b[i] = next() as u8;
            }
            if next() % 3 == 0 {
                b.truncate((next() as usize) % b.len());
            }
            match decode_image(&b, &limits) {
                Ok(img) => {
                    assert!(img.width() > 0 && img.height() > 0);
                    ok += 1
                }
                Err(Error::Image(_)) | Err(Error::ImageTooLarge { .. }) => err += 1,
                Err(e) => panic!("{file}: unexpected error kind {e:?}"),
            }
            // The crate's own JPEG decoder too (the one the wasm build falls back to).
            if file.ends_with(".jpg") {
                match decode_jpeg_portable(&b, &limits, AlphaMode::default()) {
                    Ok(Some(img)) => {
                        assert!(img.width() > 0 && img.height() > 0);
                        portable.0 += 1
                    }
                    Ok(None) => portable.1 += 1,
                    Err(Error::Image(_)) | Err(Error::ImageTooLarge { .. }) => portable.2 += 1,
                    Err(e) => panic!("{file}: unexpected error kind {e:?}"),
                }
            }
        }
    }
    println!("mutated inputs: {ok} decoded, {err} named errors, 0 panics");
    println!(
        "the portable JPEG decoder: {} decoded, {} left to the fallback, {} named errors, 0 panics",
        portable.0, portable.1, portable.2
    );
}

/// `pixel_values` of the fixtures engineer's reference (`tests/fixtures/reference/<cfg>/pixels.safetensors`,
/// `Florence2Processor.image_processor` on `tests/fixtures/images/*` with each model dir's
/// preprocessor_config.json) vs ours from the file bytes. PNG: bit-exact pipeline, tolerance 1e-6 (guard
/// only; measured 0, including rgba.png, which the reference composites onto white). JPEG (4:4:4): the
/// same, decoded to Pillow's pixels by libjpeg-turbo or by the crate's own decoder (with the image
/// crate's decoder tiny2 had 318 of 12288 values differ, max 2 grey levels, tiny4 481 of 18432, max 3).
#[test]
fn pixel_values_match_fixture_reference() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    for cfg_name in ["tiny2", "tiny4"] {
        let cfg_bytes =
            std::fs::read(format!("{root}/models/{cfg_name}/preprocessor_config.json")).unwrap();
        let cfg = ImageProcessorConfig::from_json_bytes(&cfg_bytes).unwrap();
        let st_bytes =
            std::fs::read(format!("{root}/reference/{cfg_name}/pixels.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&st_bytes).unwrap();
        let mut names = st.names();
        names.sort();
        assert!(names.len() >= 4, "{cfg_name}: {names:?}");
        for name in names {
            let t = st.tensor(name).unwrap();
            assert_eq!(
                t.shape(),
                &[1, 3, cfg.height, cfg.width],
                "{cfg_name}/{name}"
            );
            let want = f32s(t.data());
            let bytes = std::fs::read(format!("{root}/images/{name}")).unwrap();
            let got = preprocess_bytes(&bytes, &cfg, &ImageLimits::default()).unwrap();
            let d = max_abs(&got, &want);
            let plane = cfg.height * cfg.width;
            // Differences in grey levels of the resized uint8 image (undo normalise and rescale).
            let mut n_diff = 0;
            let mut max_levels = 0f32;
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                let levels = (a - b).abs() * cfg.image_std[i / plane] / cfg.rescale_factor as f32;
                if levels > 0.01 {
                    n_diff += 1;
                    max_levels = max_levels.max(levels);
                }
            }
            println!(
                "{cfg_name}/{name}: max |ours - reference| = {d:e}; {n_diff} of {} values differ (max {max_levels:.2} grey levels)",
                got.len()
            );
            assert!(
                d <= 1e-6,
                "{cfg_name}/{name}: {d} ({max_levels} grey levels)"
            );
        }
    }
}

/// Truncated JPEGs are refused like the reference refuses them (Pillow: `OSError: image file is
/// truncated`); the decoder alone returned the decoded rows and filled the rest. Bytes after the
/// end-of-image marker are ignored, as Pillow ignores them. PNGs cut inside their image data fail in the
/// decoder already (a cut inside the final IEND chunk is not checked here).
#[test]
fn truncated_images_are_refused_like_the_reference() {
    let images = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/images");
    let jpg = std::fs::read(format!("{images}/scene.jpg")).unwrap();
    let full = decode_image(&jpg, &ImageLimits::default()).unwrap();
    let mut trailing = jpg.clone();
    trailing.extend_from_slice(b"trailing bytes");
    assert_eq!(
        decode_image(&trailing, &ImageLimits::default()).unwrap(),
        full
    );
    // Cuts inside the scan data (the decoder's partial-image case), just before EOI, and in the headers.
    for cut in [
        jpg.len() - 1,
        jpg.len() - 2,
        jpg.len() * 3 / 4,
        jpg.len() / 2,
        700,
        3,
    ] {
        match decode_image(&jpg[..cut], &ImageLimits::default()) {
            Err(Error::Image(m)) => assert!(m.contains("truncated"), "cut {cut}: {m}"),
            Err(e) => panic!("cut {cut}: {e:?}"),
            Ok(_) => panic!("cut {cut} of {}: decoded", jpg.len()),
        }
    }
    let png = std::fs::read(format!("{images}/scene.png")).unwrap();
    for cut in [png.len() * 3 / 4, png.len() / 2] {
        assert!(
            matches!(
                decode_image(&png[..cut], &ImageLimits::default()),
                Err(Error::Image(_))
            ),
            "png cut {cut}"
        );
    }
}

/// WebP (lossless), BMP and GIF decode natively to the pixels Pillow sees (`Image.open(f).convert("RGB")`,
/// scripts/fixtures/make_image_formats.py): scene.webp and scene.bmp are scene.png's pixels, scene.gif's first
/// frame is scene.gif.png. Exact.
#[test]
fn webp_bmp_and_gif_decode_to_pillows_pixels() {
    let images = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/images");
    let decode = |rel: &str| {
        let bytes = std::fs::read(format!("{images}/{rel}")).unwrap();
        decode_image(&bytes, &ImageLimits::default()).unwrap_or_else(|e| panic!("{rel}: {e}"))
    };
    let scene = decode("scene.png");
    assert_eq!(decode("formats/scene.webp"), scene, "webp");
    assert_eq!(decode("formats/scene.bmp"), scene, "bmp");
    assert_eq!(
        decode("formats/scene.gif"),
        decode("formats/scene.gif.png"),
        "gif"
    );
    // The pixel limit is checked from these headers too.
    let small = ImageLimits {
        max_pixels: u64::from(scene.width()) * u64::from(scene.height()) - 1,
        ..ImageLimits::default()
    };
    for rel in [
        "formats/scene.webp",
        "formats/scene.bmp",
        "formats/scene.gif",
    ] {
        let bytes = std::fs::read(format!("{images}/{rel}")).unwrap();
        assert!(
            matches!(
                decode_image(&bytes, &small),
                Err(Error::ImageTooLarge { .. })
            ),
            "{rel}"
        );
    }
}

fn image_fixture(rel: &str) -> Vec<u8> {
    let images = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/images");
    std::fs::read(format!("{images}/{rel}")).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// `jpg` with the size in its frame header (the first SOFn `marker`) replaced by `w`x`h`.
fn with_frame_size(mut jpg: Vec<u8>, marker: u8, w: u16, h: u16) -> Vec<u8> {
    let sof = jpg
        .windows(2)
        .position(|p| p == [0xFF, marker])
        .unwrap_or_else(|| panic!("no SOF marker FF{marker:02X}"));
    jpg[sof + 5..sof + 7].copy_from_slice(&h.to_be_bytes());
    jpg[sof + 7..sof + 9].copy_from_slice(&w.to_be_bytes());
    jpg
}

/// Progressive and CMYK JPEGs whose frame header claims 60000x50000: `ImageTooLarge`, from the header,
/// before any decoding (the scan data cannot fill that size). The same files at their own size decode.
#[test]
fn oversized_progressive_and_cmyk_jpegs_are_rejected_before_decoding() {
    let limits = ImageLimits::default();
    for (rel, marker) in [
        ("jpeg/progressive420.jpg", 0xC2),
        ("jpeg/cmyk.jpg", 0xC0),
        ("jpeg/restart_rows422.jpg", 0xC0),
    ] {
        let jpg = image_fixture(rel);
        assert_eq!(
            decode_image(&jpg, &limits).unwrap().dimensions(),
            (64, 48),
            "{rel}"
        );
        match decode_image(&with_frame_size(jpg, marker, 60000, 50000), &limits) {
            Err(
                e @ Error::ImageTooLarge {
                    width: 60000,
                    height: 50000,
                    ..
                },
            ) => assert_eq!(e.name(), "Florence2ImageTooLargeError"),
            other => panic!("{rel}: expected ImageTooLarge, got {other:?}"),
        }
    }
}

/// The allocation limit covers what the JPEG decode needs: the RGB output (64x48x3 = 9216 bytes) and,
/// for a progressive file, libjpeg's whole-image coefficient buffer (4:2:0, 64x48: 48 + 2 x 12 blocks of
/// 128 bytes = 9216 more). A limit between the two refuses the progressive file only.
#[test]
fn jpeg_decoding_respects_the_allocation_limit() {
    let base = image_fixture("jpeg/s420.jpg");
    let prog = image_fixture("jpeg/progressive420.jpg");
    let limit = |bytes: u64| ImageLimits {
        max_alloc_bytes: bytes,
        ..ImageLimits::default()
    };
    if cfg!(feature = "libjpeg-turbo") {
        assert!(decode_image(&base, &limit(9216)).is_ok());
        match decode_image(&prog, &limit(9216)) {
            Err(Error::Image(m)) => assert!(m.contains("18432 bytes"), "{m}"),
            other => panic!("expected Error::Image, got {other:?}"),
        }
        assert!(decode_image(&prog, &limit(18432)).is_ok());
        match decode_image(&base, &limit(9215)) {
            Err(Error::Image(m)) => assert!(m.contains("limit"), "{m}"),
            other => panic!("expected Error::Image, got {other:?}"),
        }
    } else {
        for jpg in [&base, &prog] {
            assert!(matches!(
                decode_image(jpg, &limit(16)),
                Err(Error::Image(_))
            ));
        }
    }
}

/// Truncated progressive and CMYK JPEGs are refused like the baseline one (Pillow: "image file is
/// truncated"); bytes between the last scan and the end-of-image marker and an unknown JFIF revision
/// (libjpeg warnings) are ignored, as Pillow ignores them (checked with Pillow 13: same pixels).
#[test]
fn truncated_and_padded_jpegs_behave_like_pillow() {
    let limits = ImageLimits::default();
    for rel in [
        "jpeg/progressive420.jpg",
        "jpeg/cmyk.jpg",
        "jpeg/odd420.jpg",
    ] {
        let jpg = image_fixture(rel);
        for cut in [jpg.len() - 2, jpg.len() * 2 / 3, jpg.len() / 3] {
            match decode_image(&jpg[..cut], &limits) {
                Err(Error::Image(m)) => assert!(m.contains("truncated"), "{rel} cut {cut}: {m}"),
                other => panic!("{rel} cut {cut}: expected Error::Image, got {other:?}"),
            }
        }
    }
    let jpg = image_fixture("jpeg/s420.jpg");
    assert_eq!(&jpg[jpg.len() - 2..], &[0xFF, 0xD9]);
    let mut padded = jpg[..jpg.len() - 2].to_vec();
    padded.extend_from_slice(&[0x12, 0x34, 0x56, 0xFF, 0xD9]);
    let want = decode_image(&jpg, &limits).unwrap();
    assert_eq!(decode_image(&padded, &limits).unwrap(), want);
    // A header warning (libjpeg: "unknown JFIF revision number 3.01") is ignored too (Pillow 13: same
    // pixels).
    assert_eq!(&jpg[6..13], b"JFIF\0\x01\x01");
    let mut jfif3 = jpg.clone();
    jfif3[11] = 3;
    assert_eq!(decode_image(&jfif3, &limits).unwrap(), want);
}
