//! Stage timings. A stage is timed until the GPU has finished it, so each stage's figure is its own
//! work: natively by waiting for the device, in the browser by awaiting the queue's
//! `onSubmittedWorkDone()` (the clock is `performance.now()` there: `std::time::Instant` panics).

use crate::error::Result;
use crate::gpu::Device;

#[cfg(target_arch = "wasm32")]
mod js {
    use wasm_bindgen::prelude::*;

    #[wasm_bindgen]
    extern "C" {
        /// `performance.now()` (windows and workers).
        #[wasm_bindgen(js_namespace = performance, js_name = now)]
        pub fn perf_now() -> f64;
    }
}

/// Milliseconds since an arbitrary origin.
fn now_ms() -> f64 {
    #[cfg(target_arch = "wasm32")]
    {
        js::perf_now()
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        use std::sync::OnceLock;
        use std::time::Instant;
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        ORIGIN.get_or_init(Instant::now).elapsed().as_secs_f64() * 1e3
    }
}

/// A running stopwatch.
#[derive(Clone, Copy, Debug)]
pub struct Stopwatch(f64);

impl Stopwatch {
    pub fn start() -> Self {
        Stopwatch(now_ms())
    }

    /// Milliseconds since [`Stopwatch::start`].
    pub fn ms(self) -> f64 {
        (now_ms() - self.0).max(0.0)
    }

    /// Milliseconds since start once the GPU has finished what was submitted ([`Device::finished`]). Also
    /// surfaces a device loss or an uncaptured GPU error.
    pub async fn ms_after_gpu(self, gpu: &Device) -> Result<f64> {
        gpu.finished().await?;
        Ok(self.ms())
    }
}
