// The params uniform of the attention shaders (attention, attention_rows, attention_flash;
// `#include attn_params`), mirrored by `AttnParams` in src/ops/attention.rs. The strides and offsets
// (in vec4s) are read by the flash kernel only, which can take q, k and v as column ranges of one fused
// qkv tensor; the other kernels read packed (B, T, H*D) rows.

struct Params {
    batch: u32,      // B
    tq: u32,         // query rows per batch row
    tk: u32,         // key rows per K/V batch row (allocated)
    heads: u32,      // H
    bk: u32,         // K/V batch rows: B or 1
    kv_len: u32,     // valid key rows (<= tk)
    q_offset: u32,   // absolute position of query row 0 (causal)
    causal: u32,     // 0 / 1
    has_mask: u32,   // 0 / 1
    n_qblocks: u32,  // ceil(tq / query rows per block): QB (attention, attention_flash), QPI (attention_rows)
    scale: f32,      // multiplies q
    q_stride: u32,   // vec4s per q row (H*D/4, or 3C/4 for the fused qkv)
    kv_stride: u32,  // vec4s per k/v row
    k_off: u32,      // vec4 column offset of k in its row (0, or C/4)
    v_off: u32,      // vec4 column offset of v in its row (0, or 2C/4)
    out_stride: u32, // vec4s per out row (H*D/4)
}

@group(0) @binding(0) var<uniform> p: Params;
