//! JS images to the pipeline's [`Image`]. A `Blob` (an image file's bytes) goes through our own PNG/JPEG
//! decoder in the pipeline, exactly as the native CLI decodes a file (same pixels, so the same answers). Decoded images
//! (`ImageData`, `ImageBitmap`, `HTMLImageElement`, `HTMLCanvasElement`, `OffscreenCanvas`) are read as
//! RGBA8 (drawn onto an `OffscreenCanvas` where needed) and composited onto white like a transparent file.

use js_sys::Uint8Array;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use web_sys::{
    Blob, HtmlCanvasElement, HtmlImageElement, ImageBitmap, ImageData, OffscreenCanvas,
    OffscreenCanvasRenderingContext2d,
};

use crate::error::{Error, Result};
use crate::pipeline::Image;
use crate::processor::image::ImageLimits;
use crate::wasm::js::describe_js;

/// A JS image read into wasm memory: a file's bytes or decoded RGBA8 pixels.
pub enum JsImage {
    File(Vec<u8>),
    Rgba {
        data: Vec<u8>,
        width: u32,
        height: u32,
    },
}

impl JsImage {
    pub fn as_image(&self) -> Image<'_> {
        match self {
            JsImage::File(bytes) => Image::Encoded(bytes),
            JsImage::Rgba {
                data,
                width,
                height,
            } => Image::Rgba {
                data,
                width: *width,
                height: *height,
            },
        }
    }
}

fn js_img_err(what: &str, e: &JsValue) -> Error {
    let (n, m) = describe_js(e);
    if n == "AbortError" {
        Error::Aborted(format!("{what}: {m}"))
    } else {
        Error::Image(format!("{what}: {n}: {m}"))
    }
}

fn check_pixels(w: u32, h: u32, limits: &ImageLimits) -> Result<()> {
    if w == 0 || h == 0 {
        return Err(Error::Image(format!(
            "image has no pixels ({w}x{h}; not loaded yet?)"
        )));
    }
    if u64::from(w) * u64::from(h) > limits.max_pixels {
        return Err(Error::ImageTooLarge {
            width: u64::from(w),
            height: u64::from(h),
            max_pixels: limits.max_pixels,
        });
    }
    Ok(())
}

/// Read any supported JS image (the pipeline decodes and preprocesses it). `abort` is checked after
/// every await.
pub async fn image_from_js(
    img: &JsValue,
    limits: &ImageLimits,
    abort: &dyn Fn() -> Result<()>,
) -> Result<JsImage> {
    if let Some(blob) = img.dyn_ref::<Blob>() {
        if blob.size() > limits.max_alloc_bytes as f64 {
            return Err(Error::Image(format!(
                "image file of {} bytes exceeds the {}-byte limit",
                blob.size(),
                limits.max_alloc_bytes
            )));
        }
        let buf = JsFuture::from(blob.array_buffer())
            .await
            .map_err(|e| js_img_err("reading the Blob", &e))?;
        abort()?;
        return Ok(JsImage::File(Uint8Array::new(&buf).to_vec()));
    }
    if let Some(data) = img.dyn_ref::<ImageData>() {
        let (w, h) = (data.width(), data.height());
        check_pixels(w, h, limits)?;
        return Ok(JsImage::Rgba {
            data: data.data().0,
            width: w,
            height: h,
        });
    }
    // Drawables: size first (the pixel limit is checked before anything is allocated).
    let (w, h) = if let Some(b) = img.dyn_ref::<ImageBitmap>() {
        (b.width(), b.height())
    } else if let Some(el) = img.dyn_ref::<HtmlImageElement>() {
        if !el.complete() {
            return Err(Error::Image(
                "the <img> has not finished loading (await img.decode() first)".into(),
            ));
        }
        (el.natural_width(), el.natural_height())
    } else if let Some(c) = img.dyn_ref::<HtmlCanvasElement>() {
        (c.width(), c.height())
    } else if let Some(c) = img.dyn_ref::<OffscreenCanvas>() {
        (c.width(), c.height())
    } else {
        return Err(Error::Image(
            "unsupported image: pass an ImageBitmap, ImageData, HTMLImageElement, HTMLCanvasElement, \
             OffscreenCanvas or Blob"
                .into(),
        ));
    };
    check_pixels(w, h, limits)?;
    let canvas = OffscreenCanvas::new(w, h).map_err(|e| js_img_err("OffscreenCanvas", &e))?;
    let ctx = canvas
        .get_context("2d")
        .map_err(|e| js_img_err("getContext('2d')", &e))?
        .and_then(|c| c.dyn_into::<OffscreenCanvasRenderingContext2d>().ok())
        .ok_or_else(|| Error::Image("no 2d context on an OffscreenCanvas".into()))?;
    let drawn = if let Some(b) = img.dyn_ref::<ImageBitmap>() {
        ctx.draw_image_with_image_bitmap(b, 0.0, 0.0)
    } else if let Some(el) = img.dyn_ref::<HtmlImageElement>() {
        ctx.draw_image_with_html_image_element(el, 0.0, 0.0)
    } else if let Some(c) = img.dyn_ref::<HtmlCanvasElement>() {
        ctx.draw_image_with_html_canvas_element(c, 0.0, 0.0)
    } else if let Some(c) = img.dyn_ref::<OffscreenCanvas>() {
        ctx.draw_image_with_offscreen_canvas(c, 0.0, 0.0)
    } else {
        Ok(())
    };
    drawn.map_err(|e| js_img_err("drawImage", &e))?;
    let data = ctx
        .get_image_data(0.0, 0.0, f64::from(w), f64::from(h))
        .map_err(|e| js_img_err("getImageData (a cross-origin image taints the canvas)", &e))?;
    Ok(JsImage::Rgba {
        data: data.data().0,
        width: w,
        height: h,
    })
}
