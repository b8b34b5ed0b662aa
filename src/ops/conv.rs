//! Convolutions over channels-last images (`shaders/conv.wgsl`): the patch-embedding `conv2d`
//! (im2col + the tuned `linear` GEMM) and DaViT's depthwise positional conv with its residual fused.

use crate::error::{Error, Result};
use crate::gpu::{ceil_div, grid_1d, DType, Kernel, MemKind, Recorder, Shader, Tensor};
use crate::ops::check;
use crate::ops::matmul::{linear, Act};

pub static SHADER: Shader = Shader {
    name: "conv",
    source: include_str!("../../shaders/conv.wgsl"),
    consts: &[("WG", WG)],
};

const WG: u32 = 256;

/// Largest im2col scratch chunk, in bytes. Bigger chunks only save dispatches; keeping the chunk well
/// under the 128 MiB binding limit common to lavapipe and browsers bounds the transient memory.
const IM2COL_CHUNK_BYTES: u64 = 64 << 20;

/// Mirrors `Im2colParams` in `shaders/conv.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Im2colParams {
    h: u32,
    w: u32,
    cin: u32,
    ho: u32,
    wo: u32,
    kh: u32,
    kw: u32,
    stride: u32,
    pad: u32,
    row0: u32,
    rows: u32,
    kp: u32,
}

/// Mirrors `DwParams` in `shaders/conv.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct DwParams {
    n: u32,
    h: u32,
    w: u32,
    c: u32,
}

/// The GEMM K step the fast linear kernels need (vec4 loads, 8 k-values per step: `LinearVariant`'s
/// K % 8 rule).
pub const K_STEP: usize = 8;

/// The K an im2col GEMM runs with for a true K of `k` and weights in `dtype`: f32/f16 weights whose K is
/// not a multiple of [`K_STEP`] (147 for the 7x7 RGB stem) are padded to the next multiple with zero
/// columns in both operands, so the fast kernels can run it instead of the scalar one; the padded
/// products are exact zeros. The padded weight is f32 (the f16 values widened exactly). Other K and
/// quantized weights (whose K is already a multiple of 32) stay as they are.
pub fn gemm_k(k: usize, dtype: DType) -> (usize, DType) {
    if k.is_multiple_of(K_STEP) || !matches!(dtype, DType::F32 | DType::F16) {
        (k, dtype)
    } else {
        (k.next_multiple_of(K_STEP), DType::F32)
    }
}

/// Output size of a convolution along one axis: floor((n + 2 pad - k) / stride) + 1, or an error when
/// the padded input is smaller than the kernel.
pub fn conv_out_len(n: usize, k: usize, stride: usize, pad: usize) -> Option<usize> {
    if stride == 0 || n == 0 {
        return None;
    }
    (n + 2 * pad).checked_sub(k).map(|r| r / stride + 1)
}

/// Dense 2-D convolution: out (B, Ho, Wo, Cout) = conv(x (B, H, W, Cin), w (Cout, Cin, kh, kw)) + bias
/// (Cout), zero padding `pad` on every side, `stride` in both directions (PyTorch `nn.Conv2d` semantics,
/// channels-last activations, PyTorch weight layout). `w` may be F32 or F16.
///
/// Runs as im2col into a scratch (rows, Cin*kh*kw) matrix followed by `linear`, whose weight is exactly
/// `w` viewed as (Cout, Cin*kh*kw), K padded to [`gemm_k`] when it is not a multiple of [`K_STEP`] (the
/// weight then padded on the GPU by `pad_weight`, a Cout x K copy per call). Large inputs are processed
/// in row chunks so the scratch never exceeds [`IM2COL_CHUNK_BYTES`] (nor the device's binding limit);
/// each chunk's GEMM writes its rows of `out` in place when their byte offset can be bound (chunks
/// rounded to such rows when they allow it), through a chunk-sized copy otherwise.
pub fn conv2d(
    rec: &mut Recorder,
    x: &Tensor,
    w: &Tensor,
    bias: &Tensor,
    stride: usize,
    pad: usize,
    out: &Tensor,
) -> Result<()> {
    conv2d_chunked(rec, x, w, bias, stride, pad, out, IM2COL_CHUNK_BYTES)
}

/// [`conv2d`] with the im2col scratch taken from `scratch` (a buffer of an activation arena, viewed
/// as the scratch matrix) instead of a fresh allocation: the rows run in chunks whose scratch fits in
/// it (at most [`im2col_scratch_bytes`]). Output rows are independent, so every value is the same as
/// [`conv2d`]'s.
#[allow(clippy::too_many_arguments)]
pub fn conv2d_with_scratch(
    rec: &mut Recorder,
    x: &Tensor,
    w: &Tensor,
    bias: &Tensor,
    stride: usize,
    pad: usize,
    out: &Tensor,
    scratch: &Tensor,
) -> Result<()> {
    conv2d_impl(
        rec,
        x,
        DenseWeight::Checkpoint(w),
        bias,
        (stride, pad),
        out,
        IM2COL_CHUNK_BYTES.min(scratch.capacity()),
        Some(scratch),
    )
}

/// A dense convolution's weight: as in the checkpoint, or in the GEMM's layout, prepared once.
#[derive(Clone, Copy, Debug)]
enum DenseWeight<'a> {
    /// (Cout, Cin, kh, kw): padded on every call when its K needs it.
    Checkpoint(&'a Tensor),
    /// (Cout, K padded) from [`prepare_conv2d_weight`], and the kernel's (Cin, kh, kw).
    Gemm(&'a Tensor, (usize, usize, usize)),
}

/// The weight (Cout, Cin, kh, kw) of a dense convolution in the layout [`conv2d_prepared`] reads:
/// (Cout, K) for the im2col GEMM, with K padded as [`gemm_k`] pads it (then a new f32 tensor, counted
/// as weights, recorded into `rec`; otherwise a reshape of `w`, no copy). Done once at load, it spares
/// every forward the padding copy.
pub fn prepare_conv2d_weight(rec: &mut Recorder, w: &Tensor) -> Result<Tensor> {
    const OP: &str = "prepare_conv2d_weight";
    if w.rank() != 4 {
        return Err(Error::shape(
            OP,
            format!("w {:?} must be (Cout, Cin, kh, kw)", w.shape()),
        ));
    }
    let (cout, cin, kh, kw) = (w.dim(0), w.dim(1), w.dim(2), w.dim(3));
    let k = cin * kh * kw;
    let (kp, _) = gemm_k(k, w.dtype());
    if kp == k {
        return w.reshape(&[cout, k]); // (Cout, Cin*kh*kw): a Linear weight
    }
    let gpu = rec.gpu().clone();
    let wp = Tensor::zeros_kind(
        &gpu,
        &[cout, kp],
        DType::F32,
        "conv2d.w_padded",
        MemKind::Weights,
    )?;
    pad_weight(rec, w, &wp)?;
    Ok(wp) // (Cout, Kp)
}

/// Record `wp` (Cout, Kp) = `w` (Cout, Cin, kh, kw) as rows of K = Cin*kh*kw, zero-padded to Kp.
fn pad_weight(rec: &mut Recorder, w: &Tensor, wp: &Tensor) -> Result<()> {
    const OP: &str = "conv2d";
    let (cout, cin, kh, kw) = (w.dim(0), w.dim(1), w.dim(2), w.dim(3));
    let kp = wp.dim(1);
    let gpu = rec.gpu().clone();
    let params = Im2colParams {
        h: 0,
        w: 0,
        cin: cin as u32,
        ho: 0,
        wo: 0,
        kh: kh as u32,
        kw: kw as u32,
        stride: 0,
        pad: 0,
        row0: 0,
        rows: check::u32_of(OP, "output channels", cout)?,
        kp: check::u32_of(OP, "padded K", kp)?,
    };
    let f16 = if w.dtype() == DType::F16 { 1.0 } else { 0.0 };
    let overrides = [("W_F16", f16)];
    rec.dispatch(
        &Kernel::new(&SHADER, "pad_weight").with(&overrides),
        &params,
        &[w.binding(&gpu)?, wp.binding(&gpu)?],
        grid_1d(ceil_div(cout * kp, WG as usize)),
    )
}

/// [`conv2d_with_scratch`] (or [`conv2d`] when `scratch` is None) with the weight prepared by
/// [`prepare_conv2d_weight`]: `w2` (Cout, K padded) for a kernel of `cin` x `kh` x `kw`. Same values.
#[allow(clippy::too_many_arguments)]
pub fn conv2d_prepared(
    rec: &mut Recorder,
    x: &Tensor,
    w2: &Tensor,
    (cin, kh, kw): (usize, usize, usize),
    bias: &Tensor,
    (stride, pad): (usize, usize),
    out: &Tensor,
    scratch: Option<&Tensor>,
) -> Result<()> {
    conv2d_impl(
        rec,
        x,
        DenseWeight::Gemm(w2, (cin, kh, kw)),
        bias,
        (stride, pad),
        out,
        scratch.map_or(IM2COL_CHUNK_BYTES, |t| IM2COL_CHUNK_BYTES.min(t.capacity())),
        scratch,
    )
}

/// Bytes of the im2col scratch [`conv2d`] uses for `rows` output pixels of `k` = Cin*kh*kw columns
/// and a weight of `w_dtype` (one chunk of rows, K padded as [`gemm_k`] pads it; the size an arena
/// must give [`conv2d_with_scratch`]).
pub fn im2col_scratch_bytes(
    max_storage_binding: u64,
    rows: usize,
    k: usize,
    w_dtype: DType,
) -> u64 {
    let (kp, _) = gemm_k(k, w_dtype);
    let budget = IM2COL_CHUNK_BYTES.min(max_storage_binding);
    let row_bytes = (kp.max(1) * 4) as u64;
    let chunk_rows = ((budget / row_bytes) as usize).clamp(1, rows.max(1));
    chunk_rows as u64 * row_bytes
}

/// [`conv2d`] with an explicit im2col scratch budget in bytes (tests use a tiny one to exercise the
/// chunked path on small shapes).
#[allow(clippy::too_many_arguments)]
pub fn conv2d_chunked(
    rec: &mut Recorder,
    x: &Tensor,
    w: &Tensor,
    bias: &Tensor,
    stride: usize,
    pad: usize,
    out: &Tensor,
    scratch_bytes: u64,
) -> Result<()> {
    conv2d_impl(
        rec,
        x,
        DenseWeight::Checkpoint(w),
        bias,
        (stride, pad),
        out,
        scratch_bytes,
        None,
    )
}

#[allow(clippy::too_many_arguments)]
fn conv2d_impl(
    rec: &mut Recorder,
    x: &Tensor,
    w: DenseWeight,
    bias: &Tensor,
    (stride, pad): (usize, usize),
    out: &Tensor,
    scratch_bytes: u64,
    scratch: Option<&Tensor>,
) -> Result<()> {
    const OP: &str = "conv2d";
    check::f32(OP, "x", x)?;
    check::f32(OP, "bias", bias)?;
    check::f32(OP, "out", out)?;
    let (wt, w_rank) = match w {
        DenseWeight::Checkpoint(t) => (t, 4),
        DenseWeight::Gemm(t, _) => (t, 2),
    };
    if x.rank() != 4 || wt.rank() != w_rank || out.rank() != 4 {
        return Err(Error::shape(
            OP,
            format!(
                "expected x (B, H, W, Cin), w (Cout, Cin, kh, kw) or (Cout, K padded), out (B, Ho, Wo, Cout); got {:?}, {:?}, {:?}",
                x.shape(),
                wt.shape(),
                out.shape()
            ),
        ));
    }
    let (b, h, wd, cin) = (x.dim(0), x.dim(1), x.dim(2), x.dim(3));
    let (cout, wcin, kh, kw) = match w {
        DenseWeight::Checkpoint(t) => (t.dim(0), t.dim(1), t.dim(2), t.dim(3)),
        DenseWeight::Gemm(t, (c, kh, kw)) => (t.dim(0), c, kh, kw),
    };
    if wcin != cin || cout == 0 || kh == 0 || kw == 0 {
        return Err(Error::shape(
            OP,
            format!("weight {:?} does not fit input {:?}", wt.shape(), x.shape()),
        ));
    }
    if bias.shape() != [cout] {
        return Err(Error::shape(
            OP,
            format!("bias {:?} must be ({cout})", bias.shape()),
        ));
    }
    let (ho, wo) = match (
        conv_out_len(h, kh, stride, pad),
        conv_out_len(wd, kw, stride, pad),
    ) {
        (Some(ho), Some(wo)) => (ho, wo),
        _ => {
            return Err(Error::shape(
                OP,
                format!(
                "input {h}x{wd} with kernel {kh}x{kw}, stride {stride}, pad {pad} gives no output"
            ),
            ))
        }
    };
    if out.shape() != [b, ho, wo, cout] {
        return Err(Error::shape(
            OP,
            format!("out {:?} must be {:?}", out.shape(), [b, ho, wo, cout]),
        ));
    }
    let k = cin * kh * kw;
    let rows = b * ho * wo;
    if rows == 0 {
        return Ok(());
    }
    check::u32_of(OP, "input elements", x.numel())?;
    check::u32_of(OP, "output rows", rows)?;
    let gpu = rec.gpu().clone();
    let (w2, kp) = match w {
        DenseWeight::Checkpoint(t) => {
            let (kp, _) = gemm_k(k, t.dtype());
            if kp == k {
                (t.reshape(&[cout, k])?, k) // (Cout, Cin*kh*kw): a Linear weight
            } else {
                let wp = Tensor::zeros(&gpu, &[cout, kp], DType::F32, "conv2d.w_padded")?;
                pad_weight(rec, t, &wp)?;
                (wp, kp) // (Cout, Kp)
            }
        }
        DenseWeight::Gemm(t, _) => {
            let (kp, _) = gemm_k(k, t.dtype());
            if t.dim(1) != kp {
                return Err(Error::shape(
                    OP,
                    format!(
                        "prepared weight {:?} must be (Cout, {kp}) for K = {k}",
                        t.shape()
                    ),
                ));
            }
            (t.clone(), kp)
        }
    };
    let budget = scratch_bytes.min(gpu.caps.max_storage_binding);
    let row_bytes = (kp * 4) as u64;
    let chunk_rows = {
        let fit = ((budget / row_bytes) as usize).clamp(1, rows);
        // Rounded down to whole groups of rows whose output byte offset is storage-aligned (when a
        // group fits), so each chunk's GEMM writes its rows of `out` in place.
        let group = OUT_ALIGN / gcd(cout * 4, OUT_ALIGN);
        if fit < rows && fit >= group {
            fit / group * group
        } else {
            fit
        }
    };
    let in_place = chunk_rows == rows || (chunk_rows * cout * 4).is_multiple_of(OUT_ALIGN);
    let kernel = Kernel::new(&SHADER, "im2col");
    let out2 = out.reshape(&[rows, cout])?; // (B*Ho*Wo, Cout)
                                            // One scratch reused by every chunk, the shorter tail through a prefix view of it (dispatches
                                            // run in recording order, so the next im2col only overwrites it after the previous linear has
                                            // read it).
    let full = match scratch {
        Some(t) if t.capacity() >= (chunk_rows * kp * 4) as u64 => {
            t.view(&[chunk_rows, kp], DType::F32)?
        }
        _ => Tensor::zeros(&gpu, &[chunk_rows, kp], DType::F32, "conv2d.im2col")?,
    };
    // Chunk outputs that cannot be bound at their offset in `out` go through a copy.
    let staged = if in_place {
        None
    } else {
        Some(Tensor::zeros(
            &gpu,
            &[chunk_rows, cout],
            DType::F32,
            "conv2d.chunk_out",
        )?)
    };
    let mut r0 = 0;
    while r0 < rows {
        let n = chunk_rows.min(rows - r0);
        let off = (r0 * cout * 4) as u64;
        let cols = full.view(&[n, kp], DType::F32)?;
        let dst = match &staged {
            None if n == rows => out2.clone(),
            None => out2.view_at(out2.offset() + off, &[n, cout], DType::F32)?,
            Some(t) => t.view(&[n, cout], DType::F32)?,
        };
        let params = Im2colParams {
            h: h as u32,
            w: wd as u32,
            cin: cin as u32,
            ho: ho as u32,
            wo: wo as u32,
            kh: kh as u32,
            kw: kw as u32,
            stride: stride as u32,
            pad: pad as u32,
            row0: r0 as u32,
            rows: n as u32,
            kp: kp as u32,
        };
        rec.dispatch(
            &kernel,
            &params,
            &[x.binding(&gpu)?, cols.binding(&gpu)?],
            grid_1d(ceil_div(n * kp, WG as usize)),
        )?;
        linear(rec, &cols, &w2, Some(bias), Act::None, &dst)?;
        if staged.is_some() {
            rec.copy_range(&dst, 0, out, off, (n * cout * 4) as u64)?;
        }
        r0 += n;
    }
    Ok(())
}

/// Largest storage offset alignment WebGPU (and Vulkan) allows: a byte offset that is a multiple of
/// it can be bound on every device.
const OUT_ALIGN: usize = 256;

fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// out = x + depthwise_conv3x3(x, pad 1) + bias, for x, out (B, H, W, C), w (C, 1, 3, 3), bias (C):
/// DaViT's `conv1` / `conv2` positional convs with the residual around them. `out` must not be `x`.
/// The weight is transposed to the kernel's (9, C) taps on every call; a model does it once at load
/// ([`prepare_dwconv3x3_taps`], [`dwconv3x3_residual_taps`]).
pub fn dwconv3x3_residual(
    rec: &mut Recorder,
    x: &Tensor,
    w: &Tensor,
    bias: &Tensor,
    out: &Tensor,
) -> Result<()> {
    let c = x.dim(-1);
    if w.shape() != [c, 1, 3, 3] {
        return Err(Error::shape(
            "dwconv3x3_residual",
            format!(
                "w {:?} must be (C, 1, 3, 3) for x {:?}",
                w.shape(),
                x.shape()
            ),
        ));
    }
    let taps = transpose_taps(rec, w, MemKind::Activations)?;
    dwconv3x3_residual_taps(rec, x, &taps, bias, out)
}

/// The depthwise 3x3 weight `w` (C, 1, 3, 3) as the (9, C) taps [`dwconv3x3_residual_taps`] reads,
/// a new f32 tensor counted as weights (recorded into `rec`). Done once at load.
pub fn prepare_dwconv3x3_taps(rec: &mut Recorder, w: &Tensor) -> Result<Tensor> {
    if w.rank() != 4 || w.dim(1) != 1 || w.dim(2) != 3 || w.dim(3) != 3 {
        return Err(Error::shape(
            "prepare_dwconv3x3_taps",
            format!("w {:?} must be (C, 1, 3, 3)", w.shape()),
        ));
    }
    transpose_taps(rec, w, MemKind::Weights)
}

/// (C, 1, 3, 3) -> (9, C): tap t's weights for neighbouring channels are neighbours (one vec4 load
/// for 4 channels in the VEC4 variant).
fn transpose_taps(rec: &mut Recorder, w: &Tensor, kind: MemKind) -> Result<Tensor> {
    check::f32("dwconv3x3_residual", "w", w)?;
    let c = w.dim(0);
    let gpu = rec.gpu().clone();
    let wt = Tensor::zeros_kind(&gpu, &[9, c], DType::F32, "dwconv.w_t", kind)?;
    crate::ops::layout::permute(rec, &w.reshape(&[c, 9])?, &[1, 0], &wt)?; // (9, C)
    Ok(wt)
}

/// [`dwconv3x3_residual`] with the weight as (9, C) taps ([`prepare_dwconv3x3_taps`]).
pub fn dwconv3x3_residual_taps(
    rec: &mut Recorder,
    x: &Tensor,
    taps: &Tensor,
    bias: &Tensor,
    out: &Tensor,
) -> Result<()> {
    const OP: &str = "dwconv3x3_residual";
    for (n, t) in [("x", x), ("taps", taps), ("bias", bias), ("out", out)] {
        check::f32(OP, n, t)?;
    }
    if x.rank() != 4 {
        return Err(Error::shape(
            OP,
            format!("x {:?} must be (B, H, W, C)", x.shape()),
        ));
    }
    let (h, wd, c) = (x.dim(1), x.dim(2), x.dim(3));
    if taps.shape() != [9, c] || bias.shape() != [c] || out.shape() != x.shape() {
        return Err(Error::shape(
            OP,
            format!(
                "x {:?}, taps {:?}, bias {:?}, out {:?}: want taps (9, C), bias (C), out = x",
                x.shape(),
                taps.shape(),
                bias.shape(),
                out.shape()
            ),
        ));
    }
    check::distinct(OP, ("x", x), ("out", out))?;
    let n = x.numel();
    if n == 0 {
        return Ok(());
    }
    let gpu = rec.gpu().clone();
    let n32 = check::u32_of(OP, "elements", n)?;
    let lanes = if c.is_multiple_of(4) { 4 } else { 1 };
    let params = DwParams {
        n: n32 / lanes as u32,
        h: h as u32,
        w: wd as u32,
        c: (c / lanes) as u32,
    };
    let defines: &[&str] = if lanes == 4 { &["VEC4"] } else { &[] };
    rec.dispatch(
        &Kernel::new(&SHADER, "dwconv3x3_residual").defines(defines),
        &params,
        &[
            x.binding(&gpu)?,
            taps.binding(&gpu)?,
            bias.binding(&gpu)?,
            out.binding(&gpu)?,
        ],
        grid_1d(ceil_div(n / lanes, WG as usize)),
    )
}
