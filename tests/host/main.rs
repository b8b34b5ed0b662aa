//! What runs without a GPU: image pre-processing, prompts, post-processing, rendering, and the CLI's
//! argument and file handling, and hub ids through the Hugging Face cache.
#![cfg(not(target_arch = "wasm32"))]

#[path = "../common/mod.rs"]
mod common;

mod annotate_golden;
mod cli_files;
mod cli_parse;
mod hub_cache;
mod image_orientation;
mod postprocess_golden;
mod postprocess_props;
mod processor_image;
mod prompt;
mod render;
mod task_markers;
mod tiles;
