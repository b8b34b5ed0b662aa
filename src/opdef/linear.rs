//! What a linear layer is, on every backend: `out (M, N) = act(x (M, K) @ w (N, K)^T + bias) (+ residual)`,
//! its options ([`LinearArgs`]), its epilogue ([`Act`]), its shape rule ([`linear_shapes`]) and the
//! kernel choices the WGSL backend offers for it ([`LinearVariant`]; what each supports stays with the
//! kernels in [`crate::ops::matmul`]).

use crate::error::{Error, Result};
use crate::gpu::Tensor;
use crate::opdef::check;

const OP: &str = "linear";

/// Epilogue applied after the bias (both backends' linear and convolution kernels).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Act {
    #[default]
    None,
    /// Exact (erf-based) GELU, as PyTorch's `nn.GELU()` / `F.gelu` default.
    Gelu,
}

/// Which kernel runs a [`crate::ops::matmul::linear`]: the registry's choice or [`crate::ops::matmul::choose_linear_variant_for`], unless
/// [`LinearArgs::variant`] forces one (tests, benchmarks and the tuner compare them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinearVariant {
    /// `matmul.wgsl`: 4x4 register blocks, scalar loads. Any shape; the fallback for K % 8 != 0.
    Scalar,
    /// `matmul_sg.wgsl`: 8x8 register blocks, x loaded once per subgroup and shared by
    /// `subgroupBroadcast`.
    /// K % 8 == 0, SUBGROUP feature with subgroups of >= 8 lanes.
    Subgroup,
    /// `matmul_sg.wgsl` `linear_sg_c4`: as `Subgroup` with 8x4 register blocks.
    SubgroupC4,
    /// `matmul_sg.wgsl` `linear_sg_r16`: as `Subgroup` with 16x4 register blocks.
    SubgroupR16,
    /// `matmul_gemv.wgsl`: one output column per invocation, M <= 4 (decode). K % 8 == 0.
    Gemv,
    /// `matmul_gemv.wgsl` `linear_gemv_wg`: multi-row GEMV for GPUs, M <= 4, K % 8 == 0. A workgroup
    /// computes 4 output columns with its lanes splitting K (coalesced weight reads) and reduces in
    /// workgroup memory.
    GemvWorkgroup,
    /// `matmul.wgsl` `linear_tiled` with RM = 4: 64x64 output tiles, 4x4 per invocation, K slices in
    /// workgroup memory (register double-buffered). Any shape. The GPU-class GEMM.
    Tiled64,
    /// `linear_tiled` with RM = 8: 128x64 output tiles, 8x4 per invocation. Any shape.
    Tiled128,
    /// `matmul_sg.wgsl` `linear_gemv_sg`: the GEMV with x shared by `subgroupBroadcast`. K % 32 == 0,
    /// subgroups of >= 8 lanes.
    GemvSubgroup,
    /// `matmul_rb.wgsl` `linear_rb` with RM = 4: 4x4 output blocks per invocation, x and w read as vec4
    /// along K, no subgroups, no workgroup memory; consecutive workgroups walk N. K % 8 == 0.
    Reg4x4,
    /// `linear_rb` with RM = 8, RN = 8: 8x8 blocks (fewer loads per multiply-add than 16x4: each x quad
    /// serves 8 columns).
    Reg8x8,
    /// `linear_rb` with RM = 16, RN = 8: 16x8 blocks.
    Reg16x8,
    /// `linear_rb` with RM = 16, RN = 16: 16x16 blocks (for CPU adapters, where loads cost more than
    /// spilled accumulators).
    Reg16x16,
    /// `matmul_gemv.wgsl` `linear_gemv_blk`: the decode GEMV for CPU adapters, M <= 4, K % 32 == 0: each
    /// lane computes 8 consecutive output columns one after the other (one long weight stream per lane,
    /// which the CPU's prefetcher follows; 8 or 32 lanes per workgroup by N), walking K in 32-weight blocks with every loaded weight word
    /// used whole (f32 8, f16 4, q8 2, q4 1 vec4<u32> per block), q8/q4 scales loaded once per 8 blocks
    /// and applied per block. x read by every lane.
    GemvBlock,
    /// `linear_gemv_blk` with SG: x's k-quads shared through `subgroupBroadcast` (subgroups of >= 8).
    GemvBlockSubgroup,
}

/// The options of one [`crate::ops::matmul::linear`] call: what it adds to x @ w^T and which kernel runs it.
/// `LinearArgs::default()` is the plain product on the registry's kernel; the builder methods set one
/// field each (`LinearArgs::default().bias(b).act(Act::Gelu)`).
#[derive(Clone, Copy, Debug, Default)]
pub struct LinearArgs<'a> {
    /// Bias (N), added first.
    pub bias: Option<&'a Tensor>,
    /// Applied after the bias.
    pub act: Act,
    /// Residual (M, N), added last in the kernel's epilogue (a transformer block's `x + sublayer(x)`,
    /// saving a separate elementwise pass: one dispatch, one read and one write of (M, N); the same f32
    /// addition). It must not be `out` (one dispatch cannot read and write a buffer through two bindings).
    pub residual: Option<&'a Tensor>,
    /// The kernel; `None`: the registry's choice for the call's shape class, else
    /// [`crate::ops::matmul::choose_linear_variant_for`]. A forced variant fails with [`Error::Shape`] if it cannot run the
    /// shape (K % 8 != 0 for the vec4 kernels; the GEMV runs any M, in row groups) and with
    /// [`Error::Limit`] if the device lacks what it needs (subgroups of >= 8 lanes).
    pub variant: Option<LinearVariant>,
    /// Compute every row as a one-row call would: the kernel is the one chosen for M = 1 (unless
    /// `variant` forces one) and runs all M rows, the GEMV in row groups of [`crate::ops::matmul::GEMV_MAX_ROWS`]; on the CPU
    /// backend the GEMV path takes every M. A row's result then does not depend on M or on the other
    /// rows, which the batched decoder ([`crate::model::bart::Decoder::step_batch`]) relies on for
    /// answers bit-identical to unbatched runs.
    pub per_row: bool,
}

impl<'a> LinearArgs<'a> {
    pub fn bias(self, bias: Option<&'a Tensor>) -> Self {
        LinearArgs { bias, ..self }
    }

    pub fn act(self, act: Act) -> Self {
        LinearArgs { act, ..self }
    }

    pub fn residual(self, residual: Option<&'a Tensor>) -> Self {
        LinearArgs { residual, ..self }
    }

    pub fn variant(self, variant: LinearVariant) -> Self {
        LinearArgs {
            variant: Some(variant),
            ..self
        }
    }

    pub fn per_row(self) -> Self {
        LinearArgs {
            per_row: true,
            ..self
        }
    }
}

/// The shapes of a linear call on any backend: x (M, K) and out (M, N) f32, w (N, K). Returns
/// (M, N, K).
pub(crate) fn linear_shapes(x: &Tensor, w: &Tensor, out: &Tensor) -> Result<(usize, usize, usize)> {
    check::f32(OP, "x", x)?;
    check::f32(OP, "out", out)?;
    if x.rank() != 2 || w.rank() != 2 || out.rank() != 2 {
        return Err(Error::shape(
            OP,
            format!(
                "expected x (M, K), w (N, K), out (M, N); got {:?}, {:?}, {:?}",
                x.shape(),
                w.shape(),
                out.shape()
            ),
        ));
    }
    let (m, k, n) = (x.dim(0), x.dim(1), w.dim(0));
    if w.dim(1) != k || out.dim(0) != m || out.dim(1) != n {
        return Err(Error::shape(
            OP,
            format!(
                "x {:?} @ w {:?}^T does not give out {:?}",
                x.shape(),
                w.shape(),
                out.shape()
            ),
        ));
    }
    Ok((m, n, k))
}
