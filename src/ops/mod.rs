//! One typed launcher per WGSL kernel. A launcher checks shapes and dtypes (returning
//! [`crate::Error::Shape`] on a mismatch), fills the kernel's `#[repr(C)]` `Params`, and records the
//! dispatch into a [`crate::gpu::Recorder`]. Launchers never submit: the caller decides when a stage ends.
//! Each launcher dispatches on the device's backend in one `match` ([`crate::gpu::Backend`]): the WGSL
//! kernel on a wgpu device, its [`crate::cpu::host`] twin (the `crate::cpu` kernel on host memory, at
//! once) on the CPU backend. The ops' options and shape rules live below both, in [`crate::opdef`].

pub mod attention;
pub mod cast;
pub mod channel_attn;
pub mod conv;
pub mod decode_step;
pub mod elementwise;
pub mod embedding;
pub mod layout;
pub mod linear_tune;
pub mod matmul;
pub mod norm;
pub mod pos_embed;
pub mod reduce;
pub mod softmax;
pub mod window;
pub mod window_attn;

use crate::gpu::Shader;

/// Every shader the launchers compile, for checks that cover all of them and all their variants
/// (`tests/kernels/shader_variants.rs` on the native compiler, `scripts/ci/check_wgsl.mjs` on the browser's).
pub static SHADERS: &[&Shader] = &[
    &attention::SHADER,
    &attention::ROWS_SHADER,
    &attention::FLASH_SHADER,
    &cast::SHADER,
    &channel_attn::SHADER,
    &conv::SHADER,
    &decode_step::SHADER,
    &elementwise::SHADER,
    &embedding::SHADER,
    &layout::SHADER,
    &matmul::SHADER,
    &matmul::SHADER_RB,
    &matmul::SHADER_SG,
    &matmul::SHADER_GEMV,
    &matmul::SHADER_BATCHED,
    &norm::SHADER,
    &pos_embed::SHADER,
    &reduce::SHADER,
    &softmax::SHADER,
    &window::SHADER,
    &window_attn::SHADER,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Every declared `Params` uniform, for the layout test.
    const UNIFORMS: &[crate::gpu::declare::UniformLayout] = &[
        attention::ATTN_PARAMS_LAYOUT,
        cast::PARAMS_LAYOUT,
        channel_attn::PARAMS_LAYOUT,
        conv::IM2COL_PARAMS_LAYOUT,
        conv::DW_PARAMS_LAYOUT,
        decode_step::PARAMS_LAYOUT,
        elementwise::PARAMS_LAYOUT,
        embedding::PARAMS_LAYOUT,
        layout::PARAMS_LAYOUT,
        matmul::LINEAR_PARAMS_LAYOUT,
        matmul::BMM_PARAMS_LAYOUT,
        norm::PARAMS_LAYOUT,
        pos_embed::PARAMS_LAYOUT,
        reduce::PARAMS_LAYOUT,
        softmax::PARAMS_LAYOUT,
        window::PARAMS_LAYOUT,
        window_attn::PARAMS_LAYOUT,
    ];

    #[test]
    fn every_uniform_mirrors_its_wgsl_struct_field_by_field_and_to_the_byte() {
        for u in UNIFORMS {
            let wgsl = u.wgsl_fields().unwrap();
            let names: Vec<&str> = wgsl.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(names, u.fields, "{} / {}", u.file, u.name);
            let size: usize = wgsl.iter().map(|f| f.1).sum();
            assert_eq!(size, u.size, "{} / {}: WGSL bytes vs Rust", u.file, u.name);
        }
    }
}
