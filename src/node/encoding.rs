//! `encodeImage` on the native engine: the vision tower's output kept for several tasks (the
//! pipeline's [`EncodedImage`], which only the model that made it accepts).

use std::sync::{Arc, Mutex};

use napi::Task;
use napi_derive::napi;

use crate::pipeline::EncodedImage;
use crate::Error;

use super::image::Owned;
use super::{guarded, js_error, Loaded};

/// An image encoded once (`EncodedImage` in JS wraps it); `dispose` frees its memory.
#[napi]
pub struct NativeEncoding {
    encoded: Mutex<Option<Arc<EncodedImage>>>,
    width: u32,
    height: u32,
}

impl NativeEncoding {
    /// The encoding, or `Florence2InputError` once disposed.
    pub fn get(&self) -> napi::Result<Arc<EncodedImage>> {
        let gone = || {
            js_error(&Error::InvalidInput(
                "this EncodedImage was disposed".into(),
            ))
        };
        let guard = self.encoded.lock().map_err(|_| gone())?;
        guard.clone().ok_or_else(gone)
    }
}

#[napi]
impl NativeEncoding {
    /// The original image's width (after its EXIF orientation).
    #[napi(getter)]
    pub fn width(&self) -> u32 {
        self.width
    }

    /// The original image's height (after its EXIF orientation).
    #[napi(getter)]
    pub fn height(&self) -> u32 {
        self.height
    }

    /// Frees the encoding once the tasks running on it end; later tasks on it reject.
    #[napi]
    pub fn dispose(&self) {
        if let Ok(mut g) = self.encoded.lock() {
            g.take();
        }
    }
}

pub struct EncodeTask {
    pub(super) loaded: Arc<Loaded>,
    pub(super) image: Owned,
}

impl Task for EncodeTask {
    type Output = EncodedImage;
    type JsValue = NativeEncoding;

    fn compute(&mut self) -> napi::Result<EncodedImage> {
        guarded("encodeImage", || {
            let pipeline = &self.loaded.pipeline;
            let file = self
                .image
                .read(pipeline.limits().max_alloc_bytes)
                .map_err(|e| js_error(&e))?;
            let view = self.image.view(file.as_deref());
            pipeline.encode_image(view).map_err(|e| js_error(&e))
        })
    }

    fn resolve(&mut self, _env: napi::Env, e: EncodedImage) -> napi::Result<NativeEncoding> {
        let (width, height) = e.image_size();
        Ok(NativeEncoding {
            encoded: Mutex::new(Some(Arc::new(e))),
            width,
            height,
        })
    }
}
