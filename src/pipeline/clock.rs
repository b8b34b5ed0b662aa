//! Stage timings. Natively a stage is timed after waiting for the GPU to finish it (so each stage's
//! figure is its own work); in the browser `std::time::Instant` panics and waiting is impossible, so
//! the clock is `performance.now()` and a stage's figure is the time to record and submit it (the GPU
//! finishes it asynchronously; the decode stage, which awaits readbacks, absorbs the rest).

use crate::error::Result;
use crate::gpu::Gpu;

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

    /// Milliseconds since start once the GPU has finished what was submitted (natively; in the
    /// browser: now). Also surfaces a device loss or an uncaptured GPU error.
    pub fn ms_after_gpu(self, gpu: &Gpu) -> Result<f64> {
        gpu.wait_idle()?;
        Ok(self.ms())
    }
}
