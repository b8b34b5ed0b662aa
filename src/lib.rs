//! florence2-wasm: Microsoft's Florence-2 vision-language model on WebGPU (wgpu + WGSL compute shaders),
//! natively (Vulkan/Metal/DX12) and in the browser (wasm32 + WebGPU).
//!
//! Layout: `quant` (the q8/q4 block formats, host side, for every backend), `gpu` (device, tensors,
//! kernels, recording, readback), `ops` (one typed launcher per WGSL kernel), `cpu` (the same ops on the
//! CPU), `config` (config.json and the tensors it implies), `weights` (checkpoint sources and
//! layouts), `hub` + `hub_cache` (model ids: URLs in the browser, the Hugging Face cache natively), `model` (DaViT, projector, BART, generation), `processor` (image, tokenizer, prompts),
//! `postprocess` + `render` (task answers), `pipeline` (the whole sequence of a task, for every front
//! end), `wasm` (JS facade).

pub mod annotate;
pub mod config;
pub mod cpu;
pub mod error;
pub mod estimate;
#[cfg(not(target_arch = "wasm32"))]
pub mod files;
pub mod gpu;
pub mod hub;
#[cfg(not(target_arch = "wasm32"))]
pub mod hub_cache;
pub mod json;
pub mod model;
/// The Node.js native addon (napi-rs), only with the `node` feature, natively.
#[cfg(all(feature = "node", not(target_arch = "wasm32")))]
pub mod node;
pub mod opdef;
pub mod ops;
pub mod pipeline;
pub mod postprocess;
pub mod processor;
pub mod quant;
pub mod render;
#[cfg(target_arch = "wasm32")]
pub mod wasm;
pub mod weights;

pub use error::{Error, Result};
