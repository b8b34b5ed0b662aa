//! The crate's one error type. Every fallible path returns `Result<T>`; `JsError` appears only at the wasm
//! boundary (`src/wasm.rs`), which maps each variant to a named JS error via [`Error::name`].

use thiserror::Error;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Error)]
pub enum Error {
    // ---- GPU runtime -------------------------------------------------------------------------------
    /// No adapter (WebGPU unavailable, no Vulkan driver, ...).
    #[error("no GPU adapter available: {0}")]
    NoAdapter(String),
    /// `request_device` failed.
    #[error("could not create the GPU device: {0}")]
    Device(String),
    /// The device was lost (driver reset, tab backgrounded, `dispose()` called).
    #[error("the GPU device was lost: {0}")]
    DeviceLost(String),
    /// A validation or out-of-memory error reported by wgpu for a submitted operation.
    #[error("GPU error: {0}")]
    Gpu(String),
    /// Mapping a buffer for readback failed.
    #[error("GPU readback failed: {0}")]
    Readback(String),
    /// A request exceeds a device limit (buffer size, binding size, workgroup count).
    #[error("{what} needs {requested} but the device allows at most {max}")]
    Limit {
        what: String,
        requested: u64,
        max: u64,
    },

    // ---- kernels -----------------------------------------------------------------------------------
    /// A launcher was handed tensors whose shapes or dtypes do not fit the kernel.
    #[error("{op}: {msg}")]
    Shape { op: &'static str, msg: String },

    // ---- model files -------------------------------------------------------------------------------
    /// config.json (or another model JSON file) is invalid.
    #[error("invalid model config: {0}")]
    Config(String),
}

impl Error {
    /// A stable name for the error kind, used as the JS `Error.name` at the wasm boundary.
    pub fn name(&self) -> &'static str {
        match self {
            Error::NoAdapter(_) | Error::Device(_) | Error::DeviceLost(_) | Error::Gpu(_) => {
                "Florence2GpuError"
            }
            Error::Readback(_) => "Florence2GpuError",
            Error::Limit { .. } => "Florence2LimitError",
            Error::Shape { .. } => "Florence2ShapeError",
            Error::Config(_) => "Florence2LoadError",
        }
    }

    /// Shorthand for a launcher's shape error.
    pub fn shape(op: &'static str, msg: impl Into<String>) -> Self {
        Error::Shape {
            op,
            msg: msg.into(),
        }
    }
}
