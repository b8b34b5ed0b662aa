//! What a dense convolution's weight is, on every backend ([`Conv2dWeight`]).

use crate::gpu::Tensor;

/// A dense convolution's weight: as in the checkpoint, or in the GEMM's layout, prepared once.
#[derive(Clone, Copy, Debug)]
pub enum Conv2dWeight<'a> {
    /// (Cout, Cin, kh, kw): padded on every call when its K needs it (a Cout x K copy).
    Checkpoint(&'a Tensor),
    /// (Cout, K padded) from [`crate::ops::conv::prepare_conv2d_weight`], and the kernel's (Cin, kh, kw).
    Prepared(&'a Tensor, (usize, usize, usize)),
}

impl<'a> From<&'a Tensor> for Conv2dWeight<'a> {
    fn from(w: &'a Tensor) -> Self {
        Conv2dWeight::Checkpoint(w)
    }
}
