//! Checkpoint loading: safetensors files (f32/f16/bf16, single or sharded) in any of the three Florence-2
//! layouts (HF-native, original Microsoft, mlx-community) become GPU tensors under their canonical
//! HF-native names: matrix weights in the resident dtype chosen by [`LoadOptions::dtype`] (fp32, fp16,
//! q8, q4; default fp16), everything else f32. What to expect comes from the config
//! ([`crate::config::tensors`]).
//!
//! - [`header`]: our own validated, incremental safetensors header parser.
//! - [`source`]: where bytes come from ([`ModelSource`]: small files whole, weights files into an
//!   [`Assembler`]; any [`ModelFiles`] of [`ByteSource`] ranges is one: native files, memory).
//! - [`names`]: layout detection and the original -> HF-native naming rules.
//! - [`dtype_plan`]: a weight format per part of the model ([`DTypePlan`]) and the part of each tensor.
//! - [`expected`]: the loader's rules per tensor (which the resident dtype applies to) and the temporal
//!   cosine table.
//! - [`plan`]: the [`plan::Planner`] (no GPU): what each source tensor becomes (canonical name and shape,
//!   layout fix-up, or ignored).
//! - [`sink`]: where the readers put tensors ([`sink::TensorSink`]: the [`Assembler`], or the converter).
//! - [`export`] (native): `florence2 convert`, any checkpoint into the package's format for one dtype.
//! - [`assemble`]: the planned tensors' fix-ups (mlx channels-last convs, original transposed
//!   `image_projection`, permuted on the GPU), chunked f32 conversion into GPU buffers, final checks
//!   (missing tensors, tied LM head).
//! - [`load`]: which files make a checkpoint ([`load::load_checkpoint`], for every source) and the
//!   ranged reader of one file (`load_dir` natively, `load_files` for any [`ModelSource`]).
//! - [`stream`]: the push-style streaming loader (browser `fetch()` bodies), one [`StreamLoader`] per file.
//! - [`store`]: [`Weights`] and [`WeightsView`].
//! - [`pickle`], [`torch`], [`zip`], [`torch_reader`] (and its legacy half), [`torch_load`]: PyTorch checkpoints
//!   (`pytorch_model.bin`, zip or legacy): a restricted pickle reader that executes nothing and allows
//!   only the globals that rebuild tensors, the state dict's tensor descriptors, the containers read in
//!   file order, and the sink that streams storages into the [`Assembler`].
//! - [`quantized`]: quantized checkpoints on disk (`NAME.qweight` U8 tensors in the engine's q8/q4 row
//!   layout plus a `quantization` entry in `config.json`): copied straight into GPU buffers when loaded
//!   in their own format, dequantized (and requantized) row by row into any other resident dtype.
//!
//! Optional tensors: `lm_head.weight` (aliased to `model.language_model.shared.weight` when absent) and
//! `final_logits_bias` `(1, V)` (original checkpoints only; HF-native conversions drop it; the loader keeps
//! it only when non-zero, and then the model must add it to the logits).
//!
//! Browser streaming (no whole file in memory): the browser's source loads each file by feeding a
//! [`StreamLoader`] (`expect_names(index.names_in(shard))`) with the `fetch()` body's chunks and
//! `finish`ing it; [`load::load_checkpoint`] sets the layout from the index names for shards, and
//! `Assembler::finish` gives the [`Weights`].

pub mod assemble;
pub mod convert;
pub mod dtype;
pub mod dtype_plan;
pub mod expected;
#[cfg(not(target_arch = "wasm32"))]
pub mod export;
pub mod header;
pub mod load;
pub mod names;
pub mod pickle;
pub mod plan;
pub mod quantized;
pub mod sink;
pub mod source;
pub mod store;
pub mod stream;
pub mod torch;
mod torch_legacy;
pub mod torch_load;
pub mod torch_reader;
#[cfg(test)]
mod torch_tests;
pub mod zip;

pub use assemble::{Assembler, LoadOptions, MemStats};
pub use dtype::WeightDType;
pub use dtype_plan::{part_of, DTypePlan, Part};
pub use expected::{is_dense_conv_weight, is_matrix_weight, temporal_cosine_table};
pub use header::{parse_header, Header, HeaderState, StDtype, TensorInfo};
pub use load::ModelSource;
pub use load::{load_config, load_files, load_weights, CheckpointIndex};
#[cfg(not(target_arch = "wasm32"))]
pub use load::{load_dir, load_dir_with};
pub use names::{detect_layout, Layout, FINAL_LOGITS_BIAS};
pub use source::{ByteSource, MemFiles, MemSource, ModelFiles};
#[cfg(not(target_arch = "wasm32"))]
pub use source::{DirFiles, FileSource};
pub use store::{Weights, WeightsView};
pub use stream::StreamLoader;
pub use torch::{StateDict, StorageRef, TorchTensor};
pub use torch_load::{load_torch_source, TorchStreamLoader};
pub use torch_reader::{StorageSink, TorchReader};
