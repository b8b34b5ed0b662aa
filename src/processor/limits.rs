//! The limits every image decoder applies to untrusted bytes.

/// Limits applied to untrusted image bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageLimits {
    /// Largest accepted `width * height` of the encoded image, checked from the header BEFORE decoding.
    pub max_pixels: u64,
    /// Upper bound on what the decoder may allocate (image crate `Limits::max_alloc`).
    pub max_alloc_bytes: u64,
}

impl Default for ImageLimits {
    /// 50 megapixels; 512 MiB of decoder allocations (a 50 MP 16-bit RGBA PNG needs 400 MB).
    fn default() -> Self {
        ImageLimits {
            max_pixels: 50_000_000,
            max_alloc_bytes: 512 * 1024 * 1024,
        }
    }
}
