//! Answers drawn on their images (`florence2 run --annotate`): boxes with labels, OCR quadrilaterals
//! with their text, polygons (segmentation) outlined over a translucent fill, and a caption strip for
//! text answers. The drawing is deterministic (no anti-aliasing, a bitmap font): the same answer on the
//! same image gives the same bytes on every machine, so golden tests can pin it.
//!
//! `raster`: the RGBA canvas and its primitives (clipped lines, outlines, even-odd fills); `text`: the
//! labels; `draw`: one drawing per kind of answer. Every primitive takes the answer's float pixel
//! coordinates as they are and clips or skips hostile values (NaN, infinities, huge numbers, empty
//! polygons) instead of panicking.

pub mod draw;
pub mod raster;
pub mod text;

pub use draw::{colour_of, draw_result};
pub use raster::{Canvas, Rgba};

use crate::error::{Error, Result};
use crate::postprocess::TaskResult;
use crate::processor::image::RgbImage;

/// `image` with `result` drawn on it.
pub fn annotate(image: &RgbImage, result: &TaskResult) -> Canvas {
    let mut canvas = Canvas::from_rgb(image.width(), image.height(), image.as_raw());
    draw_result(&mut canvas, result);
    canvas
}

/// The canvas as an RGB PNG (the images are opaque; alpha is dropped).
pub fn encode_png(canvas: &Canvas) -> Result<Vec<u8>> {
    use ::image::ImageEncoder;
    let rgb: Vec<u8> = canvas
        .pixels()
        .chunks_exact(4)
        .flat_map(|p| [p[0], p[1], p[2]])
        .collect();
    let mut out = Vec::new();
    ::image::codecs::png::PngEncoder::new(&mut out)
        .write_image(
            &rgb,
            canvas.width(),
            canvas.height(),
            ::image::ExtendedColorType::Rgb8,
        )
        .map_err(|e| Error::Image(format!("PNG encoding: {e}")))?;
    Ok(out)
}
