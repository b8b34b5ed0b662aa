//! The Florence-2 model (configured by [`crate::config`]): DaViT vision tower, projector, BART
//! encoder-decoder, generation.

pub mod davit;
pub mod davit_plan;
pub mod layers;
pub mod projector;
pub mod workloads;

pub use crate::config::{Florence2Config, TextConfig, VisionConfig};
pub mod bart;
pub mod florence2;
pub mod generate;
