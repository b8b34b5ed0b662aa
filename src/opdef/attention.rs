//! What an attention call is, on every backend: its options ([`AttnOpts`]) and the kernel choices the
//! WGSL backend offers for it ([`AttnVariant`]; what each supports stays with the kernels in
//! [`crate::ops::attention`]).

use crate::gpu::Tensor;

/// Which kernel runs an [`crate::ops::attention::attention`] call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnVariant {
    /// `attention.wgsl`: one workgroup per (batch row, head, block of query rows), K/V tiles staged in
    /// workgroup memory, barriers per tile; Tq = 1 with kv_len <= 2048 takes its `attention_decode`
    /// entry. Any head dim up to 768. The default for GPUs and the browser.
    Tiled,
    /// `attention_rows.wgsl`: one invocation per (batch row, head, 4 query rows), rows and outputs in
    /// registers, no workgroup memory or barriers. Head dim a multiple of 4 up to 80. Fast on CPU adapters.
    Rows,
    /// `attention_flash.wgsl`: one workgroup per (batch row, head, block of up to 64 query rows), K/V
    /// tiles staged in workgroup memory with vec4 loads and shared by the block's rows, each row's query,
    /// output and online-softmax state in one invocation's registers (few rows: split over several
    /// invocations and merged). Head dim a multiple of 4 up to 64. For GPUs.
    Flash,
    /// The flash kernel with blocks of up to 16 query rows, each row's keys split over (at least 4)
    /// invocations and merged: 4x the workgroups of [`AttnVariant::Flash`] on long sequences, for GPUs
    /// with more cores than the encoder's (heads x row blocks) fill. Same head dims.
    FlashSplit,
}

/// Options of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnOpts<'a> {
    /// Number of heads H; the column count H*D must be divisible by it.
    pub heads: usize,
    /// Multiplier applied to q before q k^T (usually head_dim^-0.5).
    pub scale: f32,
    /// Key j is visible to query row i only if j <= q_offset + i.
    pub causal: bool,
    /// Rows of k/v that are valid (KV-cache fill); `None` = all Tk.
    pub kv_len: Option<u32>,
    /// Absolute position of query row 0 (for the causal rule).
    pub q_offset: u32,
    /// Additive mask (Tq, Tk), shared by every batch row and head.
    pub mask: Option<&'a Tensor>,
    /// When set, the kernel reads the key count and the query position at run time from this U32 buffer
    /// (at least 2 elements: [kv_len, q_offset]) instead of `kv_len` / `q_offset`: a recorded decode
    /// step ([`crate::gpu::Plan`]) replays the same bind group at every position and only rewrites it.
    /// The shader clamps kv_len to Tk. Same kernels (their `DYN_LEN` variant), same arithmetic.
    pub dyn_len: Option<&'a Tensor>,
    /// The kernel; `None`: the registry's choice for the call's [`crate::gpu::registry::ShapeClass::attention`] when the tuner made
    /// one (and it supports the head dim), else [`crate::ops::attention::choose_attention_variant`]. A forced variant that does
    /// not support the head dim ([`crate::ops::attention::variant_supports`]) is an `Error::Shape`.
    pub variant: Option<AttnVariant>,
}

impl Default for AttnOpts<'_> {
    fn default() -> Self {
        AttnOpts {
            heads: 1,
            scale: 1.0,
            causal: false,
            kv_len: None,
            q_offset: 0,
            mask: None,
            dyn_len: None,
            variant: None,
        }
    }
}
