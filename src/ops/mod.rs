//! One typed launcher per WGSL kernel. A launcher checks shapes and dtypes (returning
//! [`crate::Error::Shape`] on a mismatch), fills the kernel's `#[repr(C)]` `Params`, and records the
//! dispatch into a [`crate::gpu::Recorder`]. Launchers never submit: the caller decides when a stage ends.

pub mod activation;
pub mod attention;
pub mod channel_attn;
pub mod conv;
pub mod elementwise;
pub mod embedding;
pub mod layout;
pub mod matmul;
pub mod norm;
pub mod pos_embed;
pub mod reduce;
pub mod softmax;
pub mod window;
pub mod window_attn;

pub(crate) mod check;
