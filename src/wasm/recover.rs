//! GPU failures in the browser: lost devices and failed allocations.
//!
//! - Every GPU stage of a request runs in [`gpu_step`]: validation and out-of-memory error scopes around
//!   it ([`Device::scoped`]), so a failed allocation rejects that request with `GpuOutOfMemoryError` and
//!   leaves nothing behind (the request's buffers are dropped with it; the model's are untouched).
//! - A lost device (driver reset, GPU process crash, `device.destroy()`) fails the request in flight with
//!   `DeviceLostError`. The next call, or `reload()`, loads the model again on a new device through the
//!   same fetch path as `Florence2.load`: with the Cache API on (the default) the files come from the cache
//!   and nothing is downloaded. `autoRecover: false` leaves the reload to the page.
//!
//! Test hooks (`debug_*`, Rust only, not exported to JS) force both failures.

use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;

use js_sys::Promise;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use crate::error::{Error, Result};
use crate::gpu::{DType, Device, MemReport, Tensor};
use crate::pipeline::Pipeline;
use crate::wasm::js::{js_error, next_task, opt_fn, opt_signal};
use crate::wasm::{open_pipeline, Inner, JsFlorence2};

/// Event-loop tasks to wait for a lost device's `lost` promise after a GPU failure: Chromium rejects the
/// pending `mapAsync` first and resolves `device.lost` a few tasks later (measured: under 1 ms).
const LOST_WAIT_TASKS: usize = 20;

/// Run one GPU stage of a request inside error scopes; a failure that a lost device caused is reported
/// as `DeviceLost`, whichever symptom surfaced first.
pub(super) async fn gpu_step<T>(gpu: &Device, work: impl Future<Output = Result<T>>) -> Result<T> {
    let result = gpu.scoped(work).await;
    match result {
        Err(Error::Gpu(_) | Error::Readback(_)) => {
            for _ in 0..LOST_WAIT_TASKS {
                if gpu.is_lost() {
                    break;
                }
                next_task().await;
            }
            match gpu.lost_message() {
                Some(msg) => Err(Error::DeviceLost(msg)),
                None => result,
            }
        }
        r => r,
    }
}

/// The model a request runs on, called with the queue's lock held: the current one (the one the call
/// was made with if the model was disposed since: calls made before `dispose()` complete); after a lost
/// device, loaded again now (`autoRecover`) or `DeviceLost`.
pub(super) async fn current(inner: &Inner, captured: Rc<Pipeline>) -> Result<Rc<Pipeline>> {
    let now = inner.pipeline.borrow().clone();
    let disposed = now.is_none();
    let p = now.unwrap_or(captured);
    let Some(msg) = p.gpu().lost_message() else {
        return Ok(p);
    };
    if disposed {
        return Err(Error::DeviceLost(msg));
    }
    if !inner.auto_recover {
        return Err(Error::DeviceLost(format!(
            "{msg} (autoRecover is off: call reload() to load the model again)"
        )));
    }
    reload_locked(inner, None, None).await
}

/// Load the model again on a new device and make it current; the previous device is destroyed (its
/// buffers freed) and the `EncodedImage`s made on it are marked stale. Called with the queue's lock held.
async fn reload_locked(
    inner: &Inner,
    signal: Option<web_sys::AbortSignal>,
    on_progress: Option<js_sys::Function>,
) -> Result<Rc<Pipeline>> {
    let (new, tuning_table) = open_pipeline(&inner.args, signal, on_progress).await?;
    let new = Rc::new(new);
    let gpu = new.gpu().clone();
    let old = {
        let mut slot = inner.pipeline.borrow_mut();
        if slot.is_none() {
            // Disposed while loading.
            drop(slot);
            drop(new);
            gpu.destroy();
            return Err(Error::Disposed);
        }
        slot.replace(new.clone())
    };
    *inner.gpu.borrow_mut() = gpu;
    *inner.tuning_table.borrow_mut() = tuning_table;
    {
        let mut images = inner.images.borrow_mut();
        inner.stale_images.borrow_mut().extend(images.keys());
        images.clear();
    }
    if let Some(old) = old {
        old.gpu().destroy();
    }
    Ok(new)
}

/// The test hook's extra allocation for this request (see [`JsFlorence2::debug_allocate_in_next_call`]).
pub(super) fn debug_allocation(inner: &Inner, gpu: &Device) -> Result<Option<Tensor>> {
    let bytes = inner.debug_extra_bytes.take();
    if bytes == 0 {
        return Ok(None);
    }
    let n = usize::try_from(bytes / 4).map_err(|_| Error::Limit {
        what: "debug allocation".into(),
        requested: bytes,
        max: usize::MAX as u64,
    })?;
    Tensor::zeros(gpu, &[n], DType::F32, "debug-extra-activations").map(Some)
}

#[wasm_bindgen(js_class = Florence2)]
impl JsFlorence2 {
    /// Load the model again from its source (the Cache API first, so normally without a download) on a
    /// new GPU device, after the calls made before this one have settled. For a lost device
    /// (`DeviceLostError`) when `autoRecover` is off, or to move to a new device.
    #[wasm_bindgen(unchecked_return_type = "Promise<void>")]
    pub fn reload(
        &self,
        #[wasm_bindgen(unchecked_optional_param_type = "ReloadOptions")] options: JsValue,
    ) -> Promise {
        let inner = self.inner.clone();
        future_to_promise(async move {
            let run = async {
                let signal = opt_signal(&options, "signal")?;
                let on_progress = opt_fn(&options, "onProgress")?;
                if inner.pipeline.borrow().is_none() {
                    return Err(Error::Disposed);
                }
                let _guard = inner.lock.acquire().await;
                reload_locked(&inner, signal, on_progress).await.map(drop)
            };
            run.await
                .map(|()| JsValue::UNDEFINED)
                .map_err(|e| js_error(&e))
        })
    }
}

/// Test hooks (not exported to JS).
impl JsFlorence2 {
    /// Destroy the current GPU device now, as a driver reset would lose it.
    #[doc(hidden)]
    pub fn debug_lose_device(&self) {
        self.inner.gpu.borrow().destroy();
    }

    /// Make the next request allocate `bytes` more GPU memory with its activations (one buffer, held
    /// until its encoder stage ends): a request whose activations do not fit.
    #[doc(hidden)]
    pub fn debug_allocate_in_next_call(&self, bytes: u64) {
        self.inner.debug_extra_bytes.set(bytes);
    }

    /// The engine's GPU memory (tensors) on the current device.
    #[doc(hidden)]
    pub fn debug_gpu_memory(&self) -> MemReport {
        self.inner.gpu.borrow().mem.report()
    }

    /// The current device (for its limits).
    #[doc(hidden)]
    pub fn debug_gpu(&self) -> Arc<Device> {
        self.inner.gpu.borrow().clone()
    }
}
