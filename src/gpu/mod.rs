//! The GPU runtime: one device ([`Device`]), typed buffers ([`Tensor`]), WGSL variants by preprocessing
//! ([`preprocess`]: `#if NAME` / `#else` / `#endif`, `#include NAME`), a kernel cache keyed by shader,
//! defines, entry point and override constants ([`KernelCache`]), a recorder that encodes many dispatches into one
//! command buffer and submits once ([`Recorder`]), and readback ([`readback`]). Ops with several
//! kernels look up the variant for a shape class in the device's [`registry`], which the on-device
//! tuner ([`tune`]) fills.
//!
//! Binding convention shared by every WGSL kernel in `shaders/`: `@group(0) @binding(0)` is the
//! `var<uniform> p: Params`, and storage buffers follow at bindings 1, 2, ... in the order the launcher
//! passes them to [`Recorder::dispatch`].

mod context;
pub(crate) mod declare;
pub mod host;
mod kernel;
pub mod preprocess;
pub mod profile;
pub mod readback;
mod recorder;
pub mod registry;
mod staging;
mod tensor;
mod timing;
pub mod tune;

pub use crate::quant::QFormat;
pub use context::{Backend, Caps, Device, DeviceOptions, Wgpu};
pub(crate) use declare::{shader, uniform};
pub use kernel::{include, Kernel, KernelCache, Shader, INCLUDES};
pub use recorder::{Plan, Recorder};
#[cfg(target_arch = "wasm32")]
pub use staging::next_task;
pub use staging::{staging_buffer, Pending, Staging};
pub use tensor::{DType, MemCounter, MemKind, MemReport, RowChunk, Tensor};

/// Largest workgroup count allowed in one grid dimension (WebGPU's guaranteed minimum, 65535).
pub const MAX_GRID_DIM: u32 = 65535;

/// Split `n` workgroups into an (x, y, 1) grid with x <= 65535, for kernels that index a flat range.
/// Shaders recover the flat workgroup index as `wid.x + wid.y * nwg.x` and must ignore indices >= n
/// (the grid may overshoot by up to x - 1 workgroups).
pub fn grid_1d(n: u32) -> [u32; 3] {
    if n <= MAX_GRID_DIM {
        [n.max(1), 1, 1]
    } else {
        let y = n.div_ceil(MAX_GRID_DIM);
        let x = n.div_ceil(y);
        [x, y, 1]
    }
}

/// Ceil-divide helper used when sizing grids.
pub fn ceil_div(a: usize, b: usize) -> u32 {
    a.div_ceil(b) as u32
}
