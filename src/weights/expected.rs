//! The loader's rules about tensors: the canonical names it treats specially, the synthesized temporal
//! table, and which tensors the resident dtype applies to. The table of tensors a config implies is
//! [`crate::config::tensors`].

/// Canonical name of the temporal cosine table (synthesized when absent).
pub const TEMPORAL_TABLE: &str =
    "model.multi_modal_projector.visual_temporal_embed.pos_idx_to_embed";
/// Canonical name of the shared (tied) token embedding.
pub const SHARED: &str = "model.language_model.shared.weight";
/// Canonical name of the (possibly tied) LM head.
pub const LM_HEAD: &str = "lm_head.weight";
/// Canonical name of the projector's image projection (`(D, C_last)`, applied as a Linear).
pub const IMAGE_PROJECTION: &str = "model.multi_modal_projector.image_projection.weight";

/// The reference's cosine temporal table `(max_len, dim)`: columns `0::2` are `sin(p * w_k)`, columns
/// `1::2` are `cos(p * w_k)`, `w_k = exp(-k * ln(10000) / (dim / 2))`, computed in f32 like the reference
/// (`Florence2VisionPositionalEmbeddingCosine1D`).
pub fn temporal_cosine_table(max_len: usize, dim: usize) -> Vec<f32> {
    let half = dim / 2;
    let mut out = vec![0f32; max_len * dim];
    if half == 0 {
        return out;
    }
    let step = ((10000f64).ln() / half as f64) as f32;
    let freqs: Vec<f32> = (0..half).map(|k| (k as f32 * -step).exp()).collect();
    for (p, row) in out.chunks_exact_mut(dim).enumerate() {
        for (k, f) in freqs.iter().enumerate() {
            let a = p as f32 * f;
            if let Some(x) = row.get_mut(2 * k) {
                *x = a.sin();
            }
            if let Some(x) = row.get_mut(2 * k + 1) {
                *x = a.cos();
            }
        }
    }
    out
}

/// True for the matrices that the resident dtype applies to: Linear weights `(out, in)` of DaViT, the
/// projector and BART, and the shared token embedding / LM head rows. Convolutions, norms, biases and
/// the position tables (learned or sinusoidal) are not matrix weights: dense convolutions follow
/// [`is_dense_conv_weight`], the rest stay f32 (their kernels read f32).
pub fn is_matrix_weight(name: &str, shape: &[usize]) -> bool {
    shape.len() == 2
        && name.ends_with(".weight")
        && !name.contains("embed_positions")
        && !name.contains("image_position_embed")
}

/// True for the weights of DaViT's dense convolutions (the patch embeddings), `(out, in, k, k)` with
/// `in > 1`: they run as im2col + the linear GEMM, which reads f16 weights, so every resident dtype
/// but fp32 keeps them as f16 (issue 10: convolutions stay f16 when the matrices are quantized). The
/// depthwise convolutions (`in` = 1 per group) keep f32: their kernel reads f32.
pub fn is_dense_conv_weight(name: &str, shape: &[usize]) -> bool {
    shape.len() == 4 && shape[1] > 1 && name.ends_with(".weight")
}
