//! The model and its pipeline: layers, the vision tower, the text model, generation (greedy, beam), the
//! decode plan, weight formats, tuning and device errors, against the reference fixtures.
#![cfg(not(target_arch = "wasm32"))]

#[path = "../weights_util/mod.rs"]
mod weights_util;
// weights_util holds the common helpers as a submodule: one copy of them in this binary.
use weights_util::common;

mod beam_parity;
mod beam_scripted;
mod cli_annotate;
mod cli_batch;
mod cli_contract;
mod custom_tasks;
mod decode_batch;
mod decode_plan;
mod demo_model;
mod dtype_fidelity;
mod dtype_mix;
mod encoder_batch;
mod estimate;
mod gpu_errors;
mod layers;
mod open;
mod pipeline;
mod quantized_checkpoints;
mod text_decoder;
mod text_parity;
mod tiles;
mod tuning;
mod vision_batch;
mod vision_model;
mod vision_parity;
