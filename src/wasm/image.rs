//! JS images to the pipeline's [`Image`]: a file's bytes (decoded by the pipeline, exactly as the native
//! CLI decodes a file) or RGBA8 pixels.
//!
//! - `Blob`/`File`, or a file's bytes (`Uint8Array`, a Node `Buffer`, `ArrayBuffer`): a PNG goes through
//!   our own decoder, exactly as the native CLI decodes a file (EXIF orientation applied). A JPEG is
//!   decoded by the browser (`createImageBitmap` with `colorSpaceConversion: "none"`, EXIF orientation
//!   from the image): Chromium's decoder is libjpeg-turbo, as Pillow's is, and gives Pillow's pixels
//!   exactly (scripts/npm/images_test.mjs measures it); where the browser cannot decode it, or there is
//!   no `createImageBitmap` (Node.js), ours is used ([`crate::processor::jpeg_decoder`], matched to
//!   libjpeg-turbo: Pillow's pixels too). Any other type the browser decodes (WebP, AVIF, GIF's first frame, BMP, ...)
//!   goes through `createImageBitmap`.
//! - A `string` or `URL`: fetched, then read as a `Blob` (an HTML answer is refused).
//! - Decoded images (`ImageData`, `ImageBitmap`, `HTMLImageElement`, `HTMLCanvasElement`,
//!   `OffscreenCanvas`) are read as RGBA8 (drawn onto an `OffscreenCanvas` where needed); an
//!   `HTMLVideoElement` (its current frame), a `VideoFrame` or any other `createImageBitmap` source
//!   becomes an `ImageBitmap` first. Transparent pixels are composited onto white like a transparent file.
//! - `{data, width, height}` (RGBA8 in a `Uint8Array` or `Uint8ClampedArray`): `ImageData`'s shape where
//!   there is no `ImageData` (Node.js).

use js_sys::{Function, Object, Promise, Reflect, Uint8Array};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use web_sys::{
    Blob, HtmlCanvasElement, HtmlImageElement, HtmlVideoElement, ImageBitmap, ImageData,
    OffscreenCanvas, OffscreenCanvasRenderingContext2d, RequestInit, Response,
};

use crate::error::{Error, Result};
use crate::pipeline::Image;
use crate::processor::image::ImageLimits;
use crate::wasm::js::{describe_js, set};
use crate::wasm::{fetch::global_fetch, looks_like_html};

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

/// The encoded formats we tell apart by their first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Png,
    Jpeg,
    Other,
}

fn sniff(b: &[u8]) -> Kind {
    if b.starts_with(b"\x89PNG\r\n\x1a\n") {
        Kind::Png
    } else if b.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Kind::Jpeg
    } else {
        Kind::Other
    }
}

/// `createImageBitmap(source, options)` of the global scope (windows and workers).
async fn create_image_bitmap(source: &JsValue, options: Option<&Object>) -> Result<ImageBitmap> {
    let f = Reflect::get(&js_sys::global(), &JsValue::from_str("createImageBitmap"))
        .ok()
        .and_then(|f| f.dyn_into::<Function>().ok())
        .ok_or_else(|| Error::Image("this browser has no createImageBitmap".into()))?;
    let p = match options {
        Some(o) => f.call2(&JsValue::NULL, source, o),
        None => f.call1(&JsValue::NULL, source),
    }
    .map_err(|e| js_img_err("createImageBitmap", &e))?;
    let p: Promise = p
        .dyn_into()
        .map_err(|_| Error::Image("createImageBitmap did not return a Promise".into()))?;
    let bm = JsFuture::from(p)
        .await
        .map_err(|e| js_img_err("the browser could not decode the image", &e))?;
    bm.dyn_into::<ImageBitmap>()
        .map_err(|_| Error::Image("createImageBitmap did not return an ImageBitmap".into()))
}

/// Options that keep a file's own pixel values: no colour-space conversion (Pillow ignores embedded
/// ICC profiles too), no premultiplication; EXIF orientation is applied by default ("from-image").
fn raw_decode_options() -> Object {
    let o = Object::new();
    set(&o, "colorSpaceConversion", &JsValue::from_str("none"));
    set(&o, "premultiplyAlpha", &JsValue::from_str("none"));
    o
}

/// RGBA8 pixels of a drawable of size `w` x `h`, drawn onto an `OffscreenCanvas`.
fn draw_rgba(img: &JsValue, w: u32, h: u32) -> Result<Vec<u8>> {
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
        return Err(Error::Image("not a drawable image".into()));
    };
    drawn.map_err(|e| js_img_err("drawImage", &e))?;
    let data = ctx
        .get_image_data(0.0, 0.0, f64::from(w), f64::from(h))
        .map_err(|e| js_img_err("getImageData (a cross-origin image taints the canvas)", &e))?;
    Ok(data.data().0)
}

/// An `ImageBitmap`'s RGBA8 pixels (the bitmap is closed afterwards).
fn from_bitmap(bm: &ImageBitmap, limits: &ImageLimits) -> Result<JsImage> {
    let (w, h) = (bm.width(), bm.height());
    let res = check_pixels(w, h, limits).and_then(|()| draw_rgba(bm, w, h));
    bm.close();
    Ok(JsImage::Rgba {
        data: res?,
        width: w,
        height: h,
    })
}

/// The URL a string or `URL` image names.
fn image_url(img: &JsValue) -> Option<String> {
    img.as_string()
        .or_else(|| img.dyn_ref::<web_sys::Url>().map(|u| u.href()))
}

/// Fetch an image URL as a `Blob`.
async fn fetch_blob(url: &str, abort: &dyn Fn() -> Result<()>) -> Result<Blob> {
    let what = format!("fetching the image {url}");
    let resp = JsFuture::from(global_fetch(url, &RequestInit::new()))
        .await
        .map_err(|e| js_img_err(&what, &e))?;
    abort()?;
    let resp: Response = resp
        .dyn_into()
        .map_err(|_| Error::Image(format!("{what}: fetch did not return a Response")))?;
    if !resp.ok() {
        return Err(Error::Image(format!(
            "{what}: HTTP {} {}",
            resp.status(),
            resp.status_text()
        )));
    }
    if crate::wasm::js::is_html(&resp) {
        return Err(Error::Image(format!(
            "{what}: the server answered with an HTML page, not an image"
        )));
    }
    let p = resp
        .blob()
        .map_err(|e| js_img_err(&format!("{what}: body"), &e))?;
    let b = JsFuture::from(p)
        .await
        .map_err(|e| js_img_err(&format!("{what}: body"), &e))?;
    abort()?;
    b.dyn_into::<Blob>()
        .map_err(|_| Error::Image(format!("{what}: the body is not a Blob")))
}

/// An encoded image file.
async fn from_blob(
    blob: &Blob,
    limits: &ImageLimits,
    abort: &dyn Fn() -> Result<()>,
) -> Result<JsImage> {
    check_file_size(blob.size(), limits)?;
    let buf = JsFuture::from(blob.array_buffer())
        .await
        .map_err(|e| js_img_err("reading the Blob", &e))?;
    abort()?;
    let bytes = Uint8Array::new(&buf).to_vec();
    drop(buf);
    from_bytes(bytes, Some(blob), limits, abort).await
}

fn check_file_size(bytes: f64, limits: &ImageLimits) -> Result<()> {
    if bytes > limits.max_alloc_bytes as f64 {
        return Err(Error::Image(format!(
            "image file of {bytes} bytes exceeds the {}-byte limit",
            limits.max_alloc_bytes
        )));
    }
    Ok(())
}

/// Whether the global scope has `createImageBitmap` (browsers do; Node.js does not).
fn has_create_image_bitmap() -> bool {
    Reflect::get(&js_sys::global(), &JsValue::from_str("createImageBitmap"))
        .is_ok_and(|f| f.is_function())
}

/// A file's bytes as a `Blob` for `createImageBitmap`.
fn blob_of(bytes: &[u8]) -> Result<Blob> {
    let parts = js_sys::Array::of1(&Uint8Array::from(bytes));
    Blob::new_with_u8_array_sequence(&parts).map_err(|e| js_img_err("Blob", &e))
}

/// An encoded image file's bytes (`blob`: the file they came from, if any). PNG: our decoder. JPEG: the
/// browser's decoder where there is one (see the module docs), else ours. Other types: the browser's.
async fn from_bytes(
    bytes: Vec<u8>,
    blob: Option<&Blob>,
    limits: &ImageLimits,
    abort: &dyn Fn() -> Result<()>,
) -> Result<JsImage> {
    let kind = sniff(&bytes);
    if kind == Kind::Png {
        return Ok(JsImage::File(bytes));
    }
    if looks_like_html(&bytes[..bytes.len().min(64)]) {
        return Err(Error::Image(
            "the image is an HTML page (a wrong URL answered by a fallback page?)".into(),
        ));
    }
    if kind == Kind::Jpeg {
        return jpeg_from_bytes(bytes, blob, limits, abort).await;
    }
    if !has_create_image_bitmap() {
        return Err(Error::Image(
            "cannot decode this image: PNG and JPEG always work, other types need a browser's \
             createImageBitmap (absent here); pass {data, width, height} RGBA pixels instead"
                .into(),
        ));
    }
    let blob = blob_or_own(blob, &bytes)?;
    drop(bytes);
    let bm = create_image_bitmap(&blob, Some(&raw_decode_options()))
        .await
        .map_err(|e| {
            Error::Image(format!(
                "cannot decode this {} file ({e}); PNG and JPEG always work, other types need the \
                 browser to decode them",
                if blob.type_().is_empty() {
                    "image".to_owned()
                } else {
                    blob.type_()
                }
            ))
        })?;
    abort()?;
    from_bitmap(&bm, limits)
}

/// A JPEG file's bytes: refused when truncated or too large (from its header), then the browser's
/// decoder where there is one, else ours.
async fn jpeg_from_bytes(
    bytes: Vec<u8>,
    blob: Option<&Blob>,
    limits: &ImageLimits,
    abort: &dyn Fn() -> Result<()>,
) -> Result<JsImage> {
    // A truncated JPEG is refused, as the reference refuses it (browsers decode what is there).
    crate::processor::jpeg::check_complete(&bytes).map_err(Error::Image)?;
    // Size from the header before anything is decoded.
    if let Ok((w, h)) = ::image::ImageReader::with_format(
        std::io::Cursor::new(&bytes[..]),
        ::image::ImageFormat::Jpeg,
    )
    .into_dimensions()
    {
        check_pixels(w, h, limits)?;
    }
    if !has_create_image_bitmap() {
        return Ok(JsImage::File(bytes));
    }
    let blob = blob_or_own(blob, &bytes)?;
    match create_image_bitmap(&blob, Some(&raw_decode_options())).await {
        Ok(bm) => {
            abort()?;
            from_bitmap(&bm, limits)
        }
        Err(e) => {
            web_sys::console::warn_1(&JsValue::from_str(&format!(
                "florence2-wasm: {e}; decoding the JPEG with the package's decoder"
            )));
            Ok(JsImage::File(bytes))
        }
    }
}

/// The size of a drawable image (ImageBitmap, a loaded `<img>`, a canvas); `None` for anything else.
fn drawable_size(img: &JsValue) -> Result<Option<(u32, u32)>> {
    Ok(if let Some(b) = img.dyn_ref::<ImageBitmap>() {
        Some((b.width(), b.height()))
    } else if let Some(el) = img.dyn_ref::<HtmlImageElement>() {
        if !el.complete() {
            return Err(Error::Image(
                "the <img> has not finished loading (await img.decode() first)".into(),
            ));
        }
        Some((el.natural_width(), el.natural_height()))
    } else if let Some(c) = img.dyn_ref::<HtmlCanvasElement>() {
        Some((c.width(), c.height()))
    } else {
        img.dyn_ref::<OffscreenCanvas>()
            .map(|c| (c.width(), c.height()))
    })
}

/// `blob` when the bytes came from one, else a Blob of `bytes`.
fn blob_or_own(blob: Option<&Blob>, bytes: &[u8]) -> Result<Blob> {
    match blob {
        Some(b) => Ok(b.clone()),
        None => blob_of(bytes),
    }
}

/// Encoded file bytes given as a `Uint8Array` (a Node `Buffer` is one) or an `ArrayBuffer`.
fn bytes_of(img: &JsValue) -> Option<Uint8Array> {
    if let Some(a) = img.dyn_ref::<Uint8Array>() {
        return Some(a.clone());
    }
    img.dyn_ref::<js_sys::ArrayBuffer>()
        .map(|b| Uint8Array::new(b))
}

/// `{data, width, height}` with RGBA8 `data` (`Uint8Array` or `Uint8ClampedArray`, `4 * width * height`
/// bytes): `ImageData`'s shape, for runtimes without `ImageData`. `None` when `img` has no `data`.
fn rgba_object(img: &JsValue, limits: &ImageLimits) -> Result<Option<JsImage>> {
    if !img.is_object() {
        return Ok(None);
    }
    let data = Reflect::get(img, &JsValue::from_str("data")).unwrap_or(JsValue::UNDEFINED);
    if data.is_undefined() {
        return Ok(None);
    }
    let dim = |k: &str| {
        Reflect::get(img, &JsValue::from_str(k))
            .ok()
            .and_then(|v| v.as_f64())
            .filter(|v| v.fract() == 0.0 && *v >= 0.0 && *v <= f64::from(u32::MAX))
            .map(|v| v as u32)
            .ok_or_else(|| {
                Error::Image(format!(
                    "{{data, width, height}}: {k} must be a whole number"
                ))
            })
    };
    let (w, h) = (dim("width")?, dim("height")?);
    check_pixels(w, h, limits)?;
    let bytes = if let Some(a) = data.dyn_ref::<Uint8Array>() {
        a.to_vec()
    } else if let Some(a) = data.dyn_ref::<js_sys::Uint8ClampedArray>() {
        a.to_vec()
    } else {
        return Err(Error::Image(
            "{data, width, height}: data must be a Uint8Array or Uint8ClampedArray of RGBA8 pixels"
                .into(),
        ));
    };
    let want = u64::from(w) * u64::from(h) * 4;
    if bytes.len() as u64 != want {
        return Err(Error::Image(format!(
            "{{data, width, height}}: data has {} bytes, RGBA8 {w}x{h} needs {want}",
            bytes.len()
        )));
    }
    Ok(Some(JsImage::Rgba {
        data: bytes,
        width: w,
        height: h,
    }))
}

/// Read any supported JS image (the pipeline decodes and preprocesses it). `abort` is checked after
/// every await.
pub async fn image_from_js(
    img: &JsValue,
    limits: &ImageLimits,
    abort: &dyn Fn() -> Result<()>,
) -> Result<JsImage> {
    if let Some(url) = image_url(img) {
        let blob = fetch_blob(&url, abort).await?;
        return from_blob(&blob, limits, abort).await;
    }
    if let Some(blob) = img.dyn_ref::<Blob>() {
        return from_blob(blob, limits, abort).await;
    }
    if let Some(a) = bytes_of(img) {
        check_file_size(f64::from(a.length()), limits)?;
        return from_bytes(a.to_vec(), None, limits, abort).await;
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
    let size = drawable_size(img)?;
    if let Some((w, h)) = size {
        check_pixels(w, h, limits)?;
        return Ok(JsImage::Rgba {
            data: draw_rgba(img, w, h)?,
            width: w,
            height: h,
        });
    }
    if let Some(rgba) = rgba_object(img, limits)? {
        return Ok(rgba);
    }
    if let Some(v) = img.dyn_ref::<HtmlVideoElement>() {
        // HAVE_CURRENT_DATA: a frame is there to read.
        if v.ready_state() < 2 {
            return Err(Error::Image(
                "the <video> has no current frame yet (wait for its loadeddata or seeked event)"
                    .into(),
            ));
        }
        check_pixels(v.video_width(), v.video_height(), limits)?;
    }
    // HTMLVideoElement (current frame), VideoFrame, SVGImageElement, ...: anything createImageBitmap takes.
    if img.is_object() && !img.is_function() {
        let bm = create_image_bitmap(img, None).await.map_err(|e| {
            let why = e.to_string();
            Error::Image(format!(
                "unsupported image: pass a Blob/File, file bytes (Uint8Array, ArrayBuffer), an \
                 image URL, ImageBitmap, ImageData, {{data, width, height}}, HTMLImageElement, \
                 HTMLCanvasElement, OffscreenCanvas, HTMLVideoElement or VideoFrame ({})",
                why.trim_start_matches("image error: ")
            ))
        })?;
        abort()?;
        return from_bitmap(&bm, limits);
    }
    Err(Error::Image(
        "unsupported image: pass a Blob/File, file bytes (Uint8Array, ArrayBuffer), an image URL, \
         ImageBitmap, ImageData, {data, width, height}, HTMLImageElement, HTMLCanvasElement, \
         OffscreenCanvas, HTMLVideoElement or VideoFrame"
            .into(),
    ))
}
