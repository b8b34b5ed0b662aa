//! PNG/JPEG decoding on arbitrary bytes with the default limits scaled down (1 Mpixel, 64 MiB decoder
//! allocation): no panic; an accepted image is inside the pixel limit; truncated JPEGs are refused. JPEGs
//! also go through the crate's own decoder (the wasm build's fallback), under the same bounds.
//! Allocation bound: 128 MiB + 16 n (the decoder's cap, plus the RGB conversion of at most 1 Mpixel).
#![no_main]

#[path = "common.rs"]
mod common;

use florence2_wasm::processor::image::{decode_image, decode_jpeg_portable, AlphaMode, ImageLimits};
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: common::Counting = common::Counting;

fuzz_target!(|data: &[u8]| {
    let limits = ImageLimits {
        max_pixels: 1 << 20,
        max_alloc_bytes: 64 << 20,
    };
    let (_, peak) = common::peak_during(|| {
        if let Ok(img) = decode_image(data, &limits) {
            assert!(u64::from(img.width()) * u64::from(img.height()) <= limits.max_pixels);
        }
        if data.starts_with(&[0xFF, 0xD8]) {
            if let Ok(Some(img)) = decode_jpeg_portable(data, &limits, AlphaMode::default()) {
                assert!(u64::from(img.width()) * u64::from(img.height()) <= limits.max_pixels);
            }
        }
    });
    common::check_bound("image", data.len(), peak, 16, 128 << 20);
});
