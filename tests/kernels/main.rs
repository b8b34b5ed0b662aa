//! Every GPU kernel (`src/ops/`) against plain f64 references on the host, one module per op family, plus
//! the shader-variant compile check. One test binary: one link, one device for the modules that share it.
#![cfg(not(target_arch = "wasm32"))]

#[path = "../common/mod.rs"]
mod common;

mod activation;
mod attention;
mod cast;
mod channel_attn;
mod conv;
mod core_chain;
mod elementwise;
mod embedding;
mod layout;
mod matmul;
mod norm;
mod pos_embed;
mod reduce;
mod shader_variants;
mod softmax;
mod window;
mod window_attn;
