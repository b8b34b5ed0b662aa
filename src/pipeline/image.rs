//! Stage 1, image -> pixels, and what an encoded image keeps: the input image kinds, the image
//! processor run on them, and [`EncodedImage`] (the projected image features on the GPU).

use image::RgbImage;

use crate::error::Result;
use crate::gpu::Tensor;
use crate::processor::image::{
    decode_image, preprocess, preprocess_rgba, ImageLimits, ImageProcessorConfig,
};

/// An input image.
#[derive(Clone, Copy, Debug)]
pub enum Image<'a> {
    /// The bytes of a PNG, JPEG, WebP, GIF or BMP file (decoded by the package itself, under the
    /// pipeline's limits; the browser build decodes PNG and JPEG).
    Encoded(&'a [u8]),
    /// Decoded RGB8 pixels.
    Rgb(&'a RgbImage),
    /// Decoded RGBA8 pixels, row-major (`width * height * 4` bytes; a browser `ImageData`); alpha is
    /// composited onto white as for a transparent file.
    Rgba {
        data: &'a [u8],
        width: u32,
        height: u32,
    },
}

/// The image processor's `pixel_values` (1, 3, H, W) on the CPU, and the original image size.
pub(crate) struct Pixels {
    pub values: Vec<f32>,
    /// (width, height) of the original image.
    pub size: (u32, u32),
}

impl Image<'_> {
    /// Decode (when needed), resize, rescale, normalise.
    pub(crate) fn pixels(
        &self,
        pre: &ImageProcessorConfig,
        limits: &ImageLimits,
    ) -> Result<Pixels> {
        match *self {
            Image::Encoded(bytes) => {
                let rgb = decode_image(bytes, limits)?;
                Image::Rgb(&rgb).pixels(pre, limits)
            }
            Image::Rgb(rgb) => Ok(Pixels {
                values: preprocess(rgb, pre)?,
                size: (rgb.width(), rgb.height()),
            }),
            Image::Rgba {
                data,
                width,
                height,
            } => Ok(Pixels {
                values: preprocess_rgba(data, width, height, pre, limits)?,
                size: (width, height),
            }),
        }
    }
}

/// One image, encoded once: the vision tower + projector output, resident on the GPU, ready for any
/// number of tasks ([`crate::pipeline::Pipeline::run_task`] skips DaViT and the projector for it).
/// Dropping it frees the GPU memory (~1.8 MB for a base model at 768 px). It belongs to the pipeline
/// that made it; another pipeline refuses it.
#[derive(Clone, Debug)]
pub struct EncodedImage {
    /// (1, N, D) projected image features.
    pub(crate) features: Tensor,
    /// (width, height) of the original image: post-processing scales coordinates to it.
    pub(crate) image_size: (u32, u32),
    /// Which pipeline made it.
    pub(crate) owner: u64,
    pub(crate) preprocess_ms: f64,
    pub(crate) vision_ms: f64,
}

impl EncodedImage {
    /// (width, height) of the original image.
    pub fn image_size(&self) -> (u32, u32) {
        self.image_size
    }

    /// Image feature tokens (577 for a base model at 768 px).
    pub fn tokens(&self) -> usize {
        self.features.dim(1)
    }

    /// The projected image features (1, N, D) on the GPU.
    pub fn features(&self) -> &Tensor {
        &self.features
    }

    /// GPU bytes held.
    pub fn byte_size(&self) -> u64 {
        self.features.byte_size()
    }

    /// Milliseconds spent on image -> pixels when it was encoded.
    pub fn preprocess_ms(&self) -> f64 {
        self.preprocess_ms
    }

    /// Milliseconds spent on DaViT + projector when it was encoded (natively waited for).
    pub fn vision_ms(&self) -> f64 {
        self.vision_ms
    }
}

/// What a task runs on: an image (encoded for this task only) or an image encoded before.
#[derive(Clone, Copy, Debug)]
pub enum TaskInput<'a> {
    Image(Image<'a>),
    Encoded(&'a EncodedImage),
}

impl<'a> From<Image<'a>> for TaskInput<'a> {
    fn from(i: Image<'a>) -> Self {
        TaskInput::Image(i)
    }
}

impl<'a> From<&'a EncodedImage> for TaskInput<'a> {
    fn from(e: &'a EncodedImage) -> Self {
        TaskInput::Encoded(e)
    }
}
