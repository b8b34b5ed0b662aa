//! The weight loader: safetensors headers, every checkpoint layout and format, streaming and its errors.
#![cfg(not(target_arch = "wasm32"))]

#[path = "../weights_util/mod.rs"]
mod weights_util;

mod convert;
mod errors;
mod fixtures;
mod header;
mod load;
mod pickle;
mod stream;
