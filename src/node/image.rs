//! The images `runTask` takes, copied off the JS heap so the task can run on another thread.

use napi::bindgen_prelude::{Buffer, Either3};
use napi_derive::napi;

use crate::files;
use crate::pipeline::Image;
use crate::Result;

/// `{data, width, height}`: RGBA8 pixels, row-major (an `ImageData`).
#[napi(object)]
pub struct RgbaPixels {
    pub data: Buffer,
    pub width: u32,
    pub height: u32,
}

/// An image owned by a task.
pub enum Owned {
    Path(String),
    Encoded(Vec<u8>),
    Rgba {
        data: Vec<u8>,
        width: u32,
        height: u32,
    },
}

impl Owned {
    pub fn from_js(image: Either3<String, Buffer, RgbaPixels>) -> Self {
        match image {
            Either3::A(path) => Owned::Path(path),
            Either3::B(bytes) => Owned::Encoded(bytes.to_vec()),
            Either3::C(p) => Owned::Rgba {
                data: p.data.to_vec(),
                width: p.width,
                height: p.height,
            },
        }
    }

    /// The file's bytes for a path (read under `max_bytes`, as the CLI reads), else the bytes held.
    pub fn read(&self, max_bytes: u64) -> Result<Option<Vec<u8>>> {
        match self {
            Owned::Path(p) => files::read_capped(std::path::Path::new(p), max_bytes).map(Some),
            _ => Ok(None),
        }
    }

    /// The pipeline's view of the image; `file` is what [`Owned::read`] returned.
    pub fn view<'a>(&'a self, file: Option<&'a [u8]>) -> Image<'a> {
        match (self, file) {
            (_, Some(bytes)) => Image::Encoded(bytes),
            (Owned::Encoded(b), None) => Image::Encoded(b),
            (
                Owned::Rgba {
                    data,
                    width,
                    height,
                },
                None,
            ) => Image::Rgba {
                data,
                width: *width,
                height: *height,
            },
            (Owned::Path(_), None) => Image::Encoded(&[]),
        }
    }
}
