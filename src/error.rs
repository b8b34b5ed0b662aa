//! The crate's one error type. Every fallible path returns `Result<T>`; `JsError` appears only at the wasm
//! boundary (`src/wasm.rs`), which maps each variant to a named JS error via [`Error::name`].

use thiserror::Error;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Error)]
pub enum Error {
    // ---- GPU runtime -------------------------------------------------------------------------------
    /// No adapter (browser: no `navigator.gpu`, or it returned no adapter; natively: no Vulkan, Metal or
    /// DX12 driver).
    #[error("no GPU adapter available: {0}")]
    NoAdapter(String),
    /// `request_device` failed.
    #[error("could not create the GPU device: {0}")]
    Device(String),
    /// The device was lost (driver reset or crash, GPU process restart, `device.destroy()`): everything
    /// on it is gone; the model must be loaded again (the browser facade does so from its cache).
    #[error("the GPU device was lost: {0}")]
    DeviceLost(String),
    /// A GPU allocation failed (caught by an out-of-memory error scope or reported by the driver).
    #[error("the GPU is out of memory: {0}")]
    OutOfMemory(String),
    /// A validation or internal error reported by wgpu for a submitted operation.
    #[error("GPU error: {0}")]
    Gpu(String),
    /// A WGSL source's preprocessing directives are malformed, name an unknown snippet, or a kernel asked
    /// for a variant its shader does not have (`src/gpu/preprocess.rs`).
    #[error("shader preprocessing: {0}")]
    Shader(String),
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

    // ---- checkpoints (src/weights) -----------------------------------------------------------------
    /// A tensor the model needs is absent from the checkpoint.
    #[error("checkpoint is missing tensor '{name}'")]
    MissingTensor { name: String },
    /// A tensor has a different shape than the config implies.
    #[error("tensor '{name}' has shape {got:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    /// A tensor's dtype is not F32, F16 or BF16 (or not a safetensors dtype at all).
    #[error("tensor '{name}' has unsupported dtype {dtype} (F32, F16, BF16 are supported)")]
    UnsupportedDtype { name: String, dtype: String },
    /// A safetensors header is malformed (length, JSON, offsets, overlaps, ...).
    /// A quantized checkpoint tensor (`NAME.qweight`, see `weights::quantized`) that does not match the
    /// config's `quantization` entry or its documented layout.
    #[error("quantized tensor '{name}': {msg}")]
    QuantizedTensor { name: String, msg: String },

    /// `expected`: the names accepted where it was given.
    #[error("unknown weight dtype '{got}' (expected {expected})")]
    UnknownDType { got: String, expected: &'static str },
    /// A per-module `dtype` named a part the model does not have ([`crate::weights::dtype_plan`]).
    #[error("unknown model part '{got}' in dtype (expected {expected})")]
    UnknownModelPart { got: String, expected: &'static str },
    /// `dtype: "auto"` found no weight format whose estimate fits the device (the message names the
    /// closest format and by how much it misses: [`crate::estimate::choose_dtype`]).
    #[error("{0}")]
    NoFittingDType(String),

    #[error("bad safetensors header in {file}: {msg}")]
    SafetensorsHeader { file: String, msg: String },
    /// A file ended before the bytes its header promises.
    #[error("{file} is truncated: expected {expected} bytes, got {got}")]
    Truncated {
        file: String,
        expected: u64,
        got: u64,
    },
    /// `model.safetensors.index.json` is malformed or names a bad shard.
    #[error("bad checkpoint index {file}: {msg}")]
    CheckpointIndex { file: String, msg: String },
    /// A PyTorch pickle (`data.pkl`, a legacy checkpoint's pickles) is malformed, truncated or exceeds a
    /// bound of the restricted reader (`weights::pickle`).
    #[error("bad pickle in {file}: {msg}")]
    Pickle { file: String, msg: String },
    /// A pickle names a global outside the reader's allow-list (tensor and storage rebuilding,
    /// `collections.OrderedDict`): refused before anything could use it; nothing is executed.
    #[error("{file}: the pickle refers to '{name}', which is not allowed (only tensor rebuilding, storages and OrderedDict are)")]
    PickleGlobal { file: String, name: String },
    /// A pickle uses an opcode the restricted reader refuses (class instantiation, extension registry,
    /// out-of-band buffers).
    #[error("{file}: the pickle uses {what}, which is not allowed")]
    PickleRefused { file: String, what: String },
    /// A PyTorch checkpoint's container (zip archive, legacy stream, storages) is malformed, or a tensor
    /// cannot be read from it (non-contiguous strides, outside its storage, big-endian data).
    #[error("bad PyTorch checkpoint {file}: {msg}")]
    TorchCheckpoint { file: String, msg: String },
    /// A model file could not be read (missing file, I/O error, HTTP error in the browser).
    #[error("cannot read {file}: {msg}")]
    FileRead { file: String, msg: String },

    /// Writing a converted checkpoint (`florence2 convert`) failed.
    #[error("cannot write {file}: {msg}")]
    FileWrite { file: String, msg: String },

    /// A downloaded file's bytes do not hash to the checksum the hub announced (its ETag); the file is
    /// not kept.
    #[error("checksum mismatch for {file}: the hub announced {expected}, the bytes hash to {got}")]
    Checksum {
        file: String,
        expected: String,
        got: String,
    },

    // ---- tasks -------------------------------------------------------------------------------------
    /// A task prompt failed validation (unknown marker, missing/unexpected input, bad region, ...).
    #[error("invalid task prompt: {0}")]
    Prompt(String),

    // ---- processor ---------------------------------------------------------------------------------
    /// Image bytes could not be decoded (unknown format, truncated or corrupt data, decoder limits) or a
    /// pixel buffer is malformed.
    #[error("image error: {0}")]
    Image(String),
    /// The image header announces more pixels than the configured limit; nothing was decoded.
    #[error("image of {width}x{height} pixels exceeds the limit of {max_pixels} pixels")]
    ImageTooLarge {
        width: u64,
        height: u64,
        max_pixels: u64,
    },
    /// tokenizer.json could not be loaded, or encoding/decoding failed.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),

    // ---- generation (src/model) --------------------------------------------------------------------
    /// The caller's cancellation hook asked generation to stop.
    #[error("generation was cancelled")]
    Cancelled,
    /// The caller's `AbortSignal` fired (browser: a download, an image decode or a generation was aborted).
    #[error("aborted: {0}")]
    Aborted(String),

    // ---- the JS facade (src/wasm.rs) ---------------------------------------------------------------
    /// The model was disposed (`dispose()`); it cannot run anymore.
    #[error("the model was disposed")]
    Disposed,
    /// Model inputs the model cannot take (token id outside the vocabulary, prompt longer than the
    /// position table, image-token count not matching the image features, ...).
    #[error("invalid model input: {0}")]
    InvalidInput(String),
}

/// Every value [`Error::name`] can return: the JS `Error.name`s of the browser facade and the names the
/// CLI prints.
pub const ERROR_NAMES: &[&str] = &[
    "WebGPUUnavailableError",
    "DeviceLostError",
    "GpuOutOfMemoryError",
    "Florence2GpuError",
    "Florence2LimitError",
    "Florence2ShapeError",
    "Florence2LoadError",
    "Florence2PromptError",
    "Florence2ImageError",
    "Florence2ImageTooLargeError",
    "Florence2TokenizerError",
    "Florence2CancelledError",
    "AbortError",
    "Florence2DisposedError",
    "Florence2InputError",
];

/// Names of the errors the package's JavaScript raises itself (never a Rust [`Error`]):
/// `Florence2InitError` (a static method that needs the wasm module called before `init()`) and
/// `Florence2WorkerError` (the `florence2-wasm/worker` worker failed). The TypeScript union and
/// `isFlorence2Error` include them.
pub const JS_ERROR_NAMES: &[&str] = &["Florence2InitError", "Florence2WorkerError"];

impl Error {
    /// A stable name for the error kind, used as the JS `Error.name` at the wasm boundary.
    /// Every name is in [`ERROR_NAMES`] (and in the TypeScript union `Florence2ErrorName`).
    pub fn name(&self) -> &'static str {
        match self {
            Error::NoAdapter(_) => "WebGPUUnavailableError",
            Error::DeviceLost(_) => "DeviceLostError",
            Error::OutOfMemory(_) => "GpuOutOfMemoryError",
            Error::Device(_) | Error::Gpu(_) | Error::Readback(_) | Error::Shader(_) => {
                "Florence2GpuError"
            }
            Error::Limit { .. } => "Florence2LimitError",
            Error::Shape { .. } => "Florence2ShapeError",
            Error::Config(_)
            | Error::MissingTensor { .. }
            | Error::TensorShape { .. }
            | Error::UnsupportedDtype { .. }
            | Error::QuantizedTensor { .. }
            | Error::SafetensorsHeader { .. }
            | Error::Truncated { .. }
            | Error::CheckpointIndex { .. }
            | Error::Pickle { .. }
            | Error::PickleGlobal { .. }
            | Error::PickleRefused { .. }
            | Error::TorchCheckpoint { .. }
            | Error::FileRead { .. }
            | Error::FileWrite { .. }
            | Error::Checksum { .. }
            | Error::NoFittingDType(_) => "Florence2LoadError",
            Error::Prompt(_) => "Florence2PromptError",
            Error::Image(_) => "Florence2ImageError",
            Error::ImageTooLarge { .. } => "Florence2ImageTooLargeError",
            Error::Tokenizer(_) => "Florence2TokenizerError",
            Error::Cancelled => "Florence2CancelledError",
            Error::Aborted(_) => "AbortError",
            Error::Disposed => "Florence2DisposedError",
            Error::InvalidInput(_)
            | Error::UnknownDType { .. }
            | Error::UnknownModelPart { .. } => "Florence2InputError",
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

#[cfg(test)]
mod tests {
    use super::*;

    /// One value of every variant (a new variant fails to compile here until it is added, and then
    /// must have a name listed in ERROR_NAMES and in the TypeScript union).
    fn one_of_each() -> Vec<Error> {
        let all: Vec<Error> = [device_errors(), weight_errors(), task_errors()]
            .into_iter()
            .flatten()
            .collect();
        assert_exhaustive(&all);
        all
    }

    fn s() -> String {
        String::from("x")
    }

    /// Adapter, device, kernel and limit errors.
    fn device_errors() -> Vec<Error> {
        vec![
            Error::NoAdapter(s()),
            Error::Device(s()),
            Error::DeviceLost(s()),
            Error::OutOfMemory(s()),
            Error::Gpu(s()),
            Error::Shader(s()),
            Error::Readback(s()),
            Error::Limit {
                what: s(),
                requested: 2,
                max: 1,
            },
            Error::shape("op", "m"),
        ]
    }

    /// Config, checkpoint and file errors.
    fn weight_errors() -> Vec<Error> {
        vec![
            Error::Config(s()),
            Error::MissingTensor { name: s() },
            Error::TensorShape {
                name: s(),
                expected: vec![1],
                got: vec![2],
            },
            Error::UnsupportedDtype {
                name: s(),
                dtype: s(),
            },
            Error::QuantizedTensor {
                name: s(),
                msg: s(),
            },
            Error::SafetensorsHeader {
                file: s(),
                msg: s(),
            },
            Error::Truncated {
                file: s(),
                expected: 2,
                got: 1,
            },
            Error::CheckpointIndex {
                file: s(),
                msg: s(),
            },
            Error::Pickle {
                file: s(),
                msg: s(),
            },
            Error::PickleGlobal {
                file: s(),
                name: s(),
            },
            Error::PickleRefused {
                file: s(),
                what: s(),
            },
            Error::TorchCheckpoint {
                file: s(),
                msg: s(),
            },
            Error::FileRead {
                file: s(),
                msg: s(),
            },
            Error::FileWrite {
                file: s(),
                msg: s(),
            },
            Error::Checksum {
                file: s(),
                expected: s(),
                got: s(),
            },
        ]
    }

    /// Task, input and format-choice errors.
    fn task_errors() -> Vec<Error> {
        vec![
            Error::Prompt(s()),
            Error::Image(s()),
            Error::ImageTooLarge {
                width: 1,
                height: 1,
                max_pixels: 0,
            },
            Error::Tokenizer(s()),
            Error::Cancelled,
            Error::Aborted(s()),
            Error::Disposed,
            Error::InvalidInput(s()),
            Error::UnknownDType {
                got: s(),
                expected: "",
            },
            Error::UnknownModelPart {
                got: s(),
                expected: "",
            },
            Error::NoFittingDType(s()),
        ]
    }

    /// Exhaustiveness: adding a variant breaks this match until one_of_each lists it.
    fn assert_exhaustive(all: &[Error]) {
        for e in all {
            match e {
                Error::NoAdapter(_)
                | Error::Device(_)
                | Error::DeviceLost(_)
                | Error::OutOfMemory(_)
                | Error::Gpu(_)
                | Error::Shader(_)
                | Error::Readback(_)
                | Error::Limit { .. }
                | Error::Shape { .. }
                | Error::Config(_)
                | Error::MissingTensor { .. }
                | Error::TensorShape { .. }
                | Error::UnsupportedDtype { .. }
                | Error::QuantizedTensor { .. }
                | Error::SafetensorsHeader { .. }
                | Error::Truncated { .. }
                | Error::CheckpointIndex { .. }
                | Error::Pickle { .. }
                | Error::PickleGlobal { .. }
                | Error::PickleRefused { .. }
                | Error::TorchCheckpoint { .. }
                | Error::FileRead { .. }
                | Error::FileWrite { .. }
                | Error::Checksum { .. }
                | Error::Prompt(_)
                | Error::Image(_)
                | Error::ImageTooLarge { .. }
                | Error::Tokenizer(_)
                | Error::Cancelled
                | Error::Aborted(_)
                | Error::Disposed
                | Error::InvalidInput(_)
                | Error::UnknownDType { .. }
                | Error::UnknownModelPart { .. }
                | Error::NoFittingDType(_) => {}
            }
        }
    }

    #[test]
    fn every_name_is_listed_and_every_listed_name_is_used() {
        let used: Vec<&str> = one_of_each().iter().map(Error::name).collect();
        for n in &used {
            assert!(ERROR_NAMES.contains(n), "{n} missing from ERROR_NAMES");
        }
        for n in ERROR_NAMES {
            assert!(used.contains(n), "{n} is listed but no variant has it");
        }
    }

    #[test]
    fn gpu_failures_have_distinct_names() {
        assert_eq!(
            Error::NoAdapter("x".into()).name(),
            "WebGPUUnavailableError"
        );
        assert_eq!(Error::OutOfMemory("x".into()).name(), "GpuOutOfMemoryError");
        assert_eq!(Error::DeviceLost("x".into()).name(), "DeviceLostError");
    }

    /// The TypeScript union the npm package ships (src/wasm/errors.rs) lists exactly ERROR_NAMES and
    /// JS_ERROR_NAMES.
    #[test]
    fn typescript_union_lists_every_name() {
        let src = include_str!("wasm/errors.rs");
        let start = src
            .find("export type Florence2ErrorName =")
            .expect("union in src/wasm/errors.rs");
        let end = start + src[start..].find(';').expect("end of the union");
        let union = &src[start..end];
        let mut in_ts: Vec<&str> = union.split('"').skip(1).step_by(2).collect();
        in_ts.sort_unstable();
        let mut names = [ERROR_NAMES, JS_ERROR_NAMES].concat();
        names.sort_unstable();
        assert_eq!(in_ts, names);
        // The package's JavaScript raises exactly its names.
        for (n, file) in [
            ("Florence2InitError", include_str!("npm/index.js")),
            ("Florence2WorkerError", include_str!("npm/client.js")),
        ] {
            assert!(
                file.contains(&format!("\"{n}\"")),
                "{n} is not raised where it is documented"
            );
        }
    }
}
