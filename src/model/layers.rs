//! The layer family every part of the model is built from (DaViT, the projector, BART): [`Linear`],
//! [`LayerNorm`], [`Conv2d`] (dense, and depthwise with the residual fused) and [`Embedding`], after
//! PyTorch's `nn.*` modules.
//!
//! - Field names are the checkpoint keys under the layer's prefix (`weight`, `bias`), so
//!   `Linear::new(&w.pp("fc1"), 768, 3072, true)` reads `fc1.weight` (3072, 768) and `fc1.bias` (3072).
//! - Shapes are checked at load ([`Error::TensorShape`] names the full key); a checkpoint that loads
//!   runs.
//! - A layer holds its tensors and calls one `ops` launcher. It never chooses a kernel: the weight
//!   tensor's [`crate::gpu::DType`] is its storage format, and the launcher (with the kernel registry)
//!   picks the kernel from that format and the shapes.

use crate::error::{Error, Result};
use crate::gpu::{Recorder, Tensor};
use crate::ops;
use crate::ops::matmul::Act;
use crate::weights::WeightsView;

/// PyTorch's `nn.LayerNorm` default eps, used by every LayerNorm of Florence-2 (DaViT, the projector's
/// `image_proj_norm`, BART).
pub const LN_EPS: f32 = 1e-5;

/// `t` must have `shape` ([`Error::TensorShape`] naming `name` otherwise).
fn expect_shape(name: &str, t: &Tensor, shape: &[usize]) -> Result<()> {
    if t.shape() != shape {
        return Err(Error::TensorShape {
            name: name.into(),
            expected: shape.to_vec(),
            got: t.shape().to_vec(),
        });
    }
    Ok(())
}

/// `nn.Linear`: `weight` (out_features, in_features), optional `bias` (out_features).
#[derive(Clone, Debug)]
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl Linear {
    /// `nn.Linear(in_features, out_features, bias)` stored at `w`.
    pub fn new(
        w: &WeightsView,
        in_features: usize,
        out_features: usize,
        bias: bool,
    ) -> Result<Self> {
        Ok(Linear {
            weight: w.get("weight", &[out_features, in_features])?,
            bias: if bias {
                Some(w.get("bias", &[out_features])?)
            } else {
                None
            },
        })
    }

    /// A Linear over already loaded tensors (a tied weight, e.g. the LM head), checked against
    /// `weight` (out_features, in_features) and `bias` (out_features); `name` names it in the error.
    pub fn from_tensors(
        name: &str,
        weight: Tensor,
        bias: Option<Tensor>,
        in_features: usize,
        out_features: usize,
    ) -> Result<Self> {
        expect_shape(name, &weight, &[out_features, in_features])?;
        if let Some(b) = &bias {
            expect_shape(&format!("{name} bias"), b, &[out_features])?;
        }
        Ok(Linear { weight, bias })
    }

    pub fn in_features(&self) -> usize {
        self.weight.dim(1)
    }

    pub fn out_features(&self) -> usize {
        self.weight.dim(0)
    }

    /// out (R, out_features) = act(x (R, in_features) @ weight^T + bias).
    pub fn forward(&self, rec: &mut Recorder, x: &Tensor, act: Act, out: &Tensor) -> Result<()> {
        self.linear(rec, x, self.args(act), out)
    }

    /// out (R, out_features) = residual + act(x @ weight^T + bias): the Linear and the residual add
    /// after it in one kernel (the add is the linear's epilogue). `residual` must not be `out`.
    pub fn forward_residual(
        &self,
        rec: &mut Recorder,
        x: &Tensor,
        act: Act,
        residual: &Tensor,
        out: &Tensor,
    ) -> Result<()> {
        self.linear(rec, x, self.args(act).residual(Some(residual)), out)
    }

    /// out (R, out_features) = act(x @ weight^T + bias) (+ residual), each row computed as a one-row
    /// call computes it ([`ops::matmul::LinearArgs::per_row`]): a decode step's rows, whose results must
    /// not depend on how many requests share the step.
    pub fn forward_rows(
        &self,
        rec: &mut Recorder,
        x: &Tensor,
        act: Act,
        residual: Option<&Tensor>,
        out: &Tensor,
    ) -> Result<()> {
        self.linear(rec, x, self.args(act).residual(residual).per_row(), out)
    }

    /// This layer's bias and `act` as the linear's epilogue.
    fn args(&self, act: Act) -> ops::matmul::LinearArgs<'_> {
        ops::matmul::LinearArgs::default()
            .bias(self.bias.as_ref())
            .act(act)
    }

    fn linear(
        &self,
        rec: &mut Recorder,
        x: &Tensor,
        args: ops::matmul::LinearArgs,
        out: &Tensor,
    ) -> Result<()> {
        ops::matmul::linear(rec, x, &self.weight, args, out)
    }
}

/// `nn.LayerNorm` over the last dimension: `weight` (C), `bias` (C), `eps`.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    pub weight: Tensor,
    pub bias: Tensor,
    pub eps: f32,
}

impl LayerNorm {
    /// `nn.LayerNorm(c)` (eps [`LN_EPS`]) stored at `w`.
    pub fn new(w: &WeightsView, c: usize) -> Result<Self> {
        Ok(LayerNorm {
            weight: w.get("weight", &[c])?,
            bias: w.get("bias", &[c])?,
            eps: LN_EPS,
        })
    }

    /// out = LayerNorm(x) over the last dim; `out` may be `x`.
    pub fn forward(&self, rec: &mut Recorder, x: &Tensor, out: &Tensor) -> Result<()> {
        ops::norm::layer_norm(rec, x, &self.weight, &self.bias, self.eps, out)
    }
}

/// `nn.Conv2d` with a square kernel: `weight` (out, in / groups, k, k), `bias` (out), over
/// channels-last activations (B, H, W, C).
#[derive(Clone, Debug)]
pub struct Conv2d {
    /// As in the checkpoint, (out, in / groups, k, k), until [`Conv2d::prepare`] puts it in the
    /// layout its kernel reads (`prepared`): (out, K padded) for the im2col GEMM of a dense conv,
    /// (k*k, C) taps for a depthwise one.
    pub weight: Tensor,
    pub bias: Tensor,
    pub stride: usize,
    pub padding: usize,
    pub groups: usize,
    /// Input channels per group.
    pub in_per_group: usize,
    kernel: usize,
    /// Whether `weight` is in its kernel's layout.
    pub prepared: bool,
}

impl Conv2d {
    /// Dense `nn.Conv2d(in_channels, out_channels, kernel, stride, padding)` stored at `w`.
    pub fn new(
        w: &WeightsView,
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        stride: usize,
        padding: usize,
    ) -> Result<Self> {
        Ok(Conv2d {
            weight: w.get("weight", &[out_channels, in_channels, kernel, kernel])?,
            bias: w.get("bias", &[out_channels])?,
            stride,
            padding,
            groups: 1,
            in_per_group: in_channels,
            kernel,
            prepared: false,
        })
    }

    /// Depthwise `nn.Conv2d(c, c, kernel, stride, padding, groups=c)` stored at `w`.
    pub fn depthwise(
        w: &WeightsView,
        c: usize,
        kernel: usize,
        stride: usize,
        padding: usize,
    ) -> Result<Self> {
        Ok(Conv2d {
            weight: w.get("weight", &[c, 1, kernel, kernel])?,
            bias: w.get("bias", &[c])?,
            stride,
            padding,
            groups: c,
            in_per_group: 1,
            kernel,
            prepared: false,
        })
    }

    pub fn kernel_size(&self) -> usize {
        self.kernel
    }

    /// Record the weight's conversion into the layout its kernel reads (once, at load: the forwards
    /// then skip the per-call padding / transposition and its transient tensor) and keep only that:
    /// the checkpoint-layout tensor is released with the loaded weights. Dense convs whose K needs
    /// no padding and depthwise convs other than 3x3 keep their tensor as it is. Same values.
    pub fn prepare(&mut self, rec: &mut Recorder) -> Result<()> {
        if self.prepared {
            return Ok(());
        }
        if self.groups == 1 {
            self.weight = ops::conv::prepare_conv2d_weight(rec, &self.weight)?; // (Cout, Kp)
            self.prepared = true;
        } else if self.kernel == 3 && self.in_per_group == 1 {
            self.weight = ops::conv::prepare_dwconv3x3_taps(rec, &self.weight)?; // (9, C)
            self.prepared = true;
        }
        Ok(())
    }

    /// out (B, Ho, Wo, Cout) = conv(x (B, H, W, Cin)) + bias, for a dense conv.
    pub fn forward(&self, rec: &mut Recorder, x: &Tensor, out: &Tensor) -> Result<()> {
        if self.groups != 1 {
            return Err(Error::shape(
                "Conv2d::forward",
                format!("groups = {}: only dense convs (groups = 1)", self.groups),
            ));
        }
        self.conv(rec, x, out, None)
    }

    /// [`Conv2d::forward`] with its im2col scratch viewed in `scratch` (an arena buffer) when it is big
    /// enough (same values either way).
    pub fn forward_with_scratch(
        &self,
        rec: &mut Recorder,
        x: &Tensor,
        out: &Tensor,
        scratch: &Tensor,
    ) -> Result<()> {
        if self.groups != 1 {
            return Err(Error::shape(
                "Conv2d::forward",
                format!("groups = {}: only dense convs (groups = 1)", self.groups),
            ));
        }
        self.conv(rec, x, out, Some(scratch))
    }

    /// The dense conv, its weight as loaded (prepared or not), its im2col scratch in `scratch` if any.
    fn conv(
        &self,
        rec: &mut Recorder,
        x: &Tensor,
        out: &Tensor,
        scratch: Option<&Tensor>,
    ) -> Result<()> {
        let w = match self.prepared {
            true => ops::conv::Conv2dWeight::Prepared(
                &self.weight,
                (self.in_per_group, self.kernel, self.kernel),
            ),
            false => ops::conv::Conv2dWeight::Checkpoint(&self.weight),
        };
        let args = ops::conv::Conv2dArgs::new(self.stride, self.padding).scratch(scratch);
        ops::conv::conv2d(rec, x, w, &self.bias, args, out)
    }

    /// out (B, H, W, C) = x + conv(x) + bias with the residual fused, for a depthwise 3x3 conv with
    /// stride 1 and padding 1 (DaViT's positional convs). `out` must not be `x`.
    pub fn forward_residual(&self, rec: &mut Recorder, x: &Tensor, out: &Tensor) -> Result<()> {
        let c = self.bias.dim(0);
        if self.groups != c || self.kernel_size() != 3 || self.stride != 1 || self.padding != 1 {
            return Err(Error::shape(
                "Conv2d::forward_residual",
                format!(
                    "kernel {}, stride {}, padding {}, groups {} of {c} channels: only depthwise \
                     3x3 with stride 1 and padding 1",
                    self.kernel_size(),
                    self.stride,
                    self.padding,
                    self.groups
                ),
            ));
        }
        if self.prepared {
            return ops::conv::dwconv3x3_residual_taps(rec, x, &self.weight, &self.bias, out);
        }
        ops::conv::dwconv3x3_residual(rec, x, &self.weight, &self.bias, out)
    }
}

/// `nn.Embedding`: `weight` (num_embeddings, dim).
#[derive(Clone, Debug)]
pub struct Embedding {
    pub weight: Tensor,
}

impl Embedding {
    /// `nn.Embedding(num_embeddings, dim)` stored at `w`.
    pub fn new(w: &WeightsView, num_embeddings: usize, dim: usize) -> Result<Self> {
        Ok(Embedding {
            weight: w.get("weight", &[num_embeddings, dim])?,
        })
    }

    /// An embedding over an already loaded table (a tied one, e.g. BART's shared token embedding),
    /// checked against (num_embeddings, dim); `name` names it in the error.
    pub fn from_tensor(
        name: &str,
        weight: Tensor,
        num_embeddings: usize,
        dim: usize,
    ) -> Result<Self> {
        expect_shape(name, &weight, &[num_embeddings, dim])?;
        Ok(Embedding { weight })
    }

    pub fn num_embeddings(&self) -> usize {
        self.weight.dim(0)
    }

    /// out (T, dim) = weight[ids] for ids U32 (T); ids >= num_embeddings give zero rows.
    pub fn forward(&self, rec: &mut Recorder, ids: &Tensor, out: &Tensor) -> Result<()> {
        ops::embedding::embedding(rec, ids, &self.weight, out)
    }

    /// out (T, dim) = x (T, dim) + weight[start .. start + T] (learned positions); `out` may be `x`.
    pub fn add_rows(&self, rec: &mut Recorder, x: &Tensor, start: u32, out: &Tensor) -> Result<()> {
        ops::elementwise::add_rows_at(rec, x, &self.weight, start, out)
    }
}
