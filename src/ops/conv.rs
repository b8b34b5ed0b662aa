//! Convolutions over channels-last images (`shaders/conv.wgsl`): the patch-embedding `conv2d`
//! (im2col + the tuned `linear` GEMM) and DaViT's depthwise positional conv with its residual fused.

use crate::cpu::host;
use crate::error::{Error, Result};
use crate::gpu::Backend;
use crate::gpu::{ceil_div, grid_1d, shader, uniform, DType, Kernel, MemKind, Recorder, Tensor};
use crate::opdef::check;
pub use crate::opdef::conv::Conv2dWeight;
use crate::ops::matmul::{linear, LinearArgs};

shader!(pub static SHADER = "conv", [("WG", WG)]);

const WG: u32 = 256;

/// Largest im2col scratch chunk, in bytes (the default [`Conv2dArgs::chunk_bytes`]). Bigger chunks only save dispatches; keeping the chunk well
/// under the 128 MiB binding limit common to lavapipe and browsers bounds the transient memory.
pub const IM2COL_CHUNK_BYTES: u64 = 64 << 20;

uniform! {
    struct Im2colParams: IM2COL_PARAMS_LAYOUT = "conv" / Im2colParams {
        h: u32, w: u32, cin: u32, ho: u32, wo: u32, kh: u32, kw: u32, stride: u32, pad: u32,
        row0: u32, rows: u32, kp: u32
    }
}

uniform! {
    struct DwParams: DW_PARAMS_LAYOUT = "conv" / DwParams {
        n: u32, h: u32, w: u32, c: u32
    }
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

pub use crate::cpu::conv::conv_out_len;

/// The options of one [`conv2d`] call. `Conv2dArgs::new(stride, pad)` allocates its im2col scratch
/// and runs chunks of up to [`IM2COL_CHUNK_BYTES`].
#[derive(Clone, Copy, Debug)]
pub struct Conv2dArgs<'a> {
    /// Stride in both directions.
    pub stride: usize,
    /// Zero padding on every side.
    pub pad: usize,
    /// The im2col scratch is viewed in this buffer (a dead buffer of an activation arena) when it is big
    /// enough, instead of a fresh allocation, and the rows run in chunks whose scratch fits in it (at most
    /// [`im2col_scratch_bytes`]). Output rows are independent, so every value is the same.
    pub scratch: Option<&'a Tensor>,
    /// Largest im2col chunk in bytes (tests use a tiny one to exercise the chunked path on small shapes).
    pub chunk_bytes: u64,
}

impl<'a> Conv2dArgs<'a> {
    pub fn new(stride: usize, pad: usize) -> Self {
        Conv2dArgs {
            stride,
            pad,
            scratch: None,
            chunk_bytes: IM2COL_CHUNK_BYTES,
        }
    }

    pub fn scratch(self, scratch: Option<&'a Tensor>) -> Self {
        Conv2dArgs { scratch, ..self }
    }

    pub fn chunk_bytes(self, chunk_bytes: u64) -> Self {
        Conv2dArgs {
            chunk_bytes,
            ..self
        }
    }
}

/// Dense 2-D convolution: out (B, Ho, Wo, Cout) = conv(x (B, H, W, Cin), w (Cout, Cin, kh, kw)) + bias
/// (Cout), zero padding `args.pad` on every side, `args.stride` in both directions (PyTorch `nn.Conv2d`
/// semantics, channels-last activations, PyTorch weight layout). `w` may be F32 or F16, as in the
/// checkpoint or prepared by [`prepare_conv2d_weight`] ([`Conv2dWeight`]; same values).
///
/// Runs as im2col into a scratch (rows, Cin*kh*kw) matrix followed by `linear`, whose weight is exactly
/// `w` viewed as (Cout, Cin*kh*kw), K padded to [`gemm_k`] when it is not a multiple of [`K_STEP`] (a
/// checkpoint weight then padded on the GPU by `pad_weight`, a Cout x K copy per call). Large inputs are
/// processed in row chunks so the scratch never exceeds `args.chunk_bytes` (nor the device's binding
/// limit, nor `args.scratch`); each chunk's GEMM writes its rows of `out` in place when their byte offset
/// can be bound (chunks rounded to such rows when they allow it), through a chunk-sized copy otherwise.
pub fn conv2d(
    rec: &mut Recorder,
    x: &Tensor,
    w: Conv2dWeight,
    bias: &Tensor,
    args: Conv2dArgs,
    out: &Tensor,
) -> Result<()> {
    let g = check_conv2d(x, w, bias, &args, out)?;
    if g.rows == 0 {
        return Ok(());
    }
    match rec.backend()? {
        Backend::Host => rec.host_op("conv2d", &[x, out], || {
            host::vision::conv2d(x, w, bias, (args.stride, args.pad), out)
        }),
        Backend::Wgpu(_) => {
            check::u32_of(OP, "input elements", x.numel())?;
            check::u32_of(OP, "output rows", g.rows)?;
            let (w2, kp) = gemm_weight(rec, w, &g)?;
            let budget = args
                .scratch
                .map_or(args.chunk_bytes, |t| args.chunk_bytes.min(t.capacity()));
            record_conv2d(rec, x, &w2, kp, bias, &args, &g, budget, out)
        }
    }
}

/// The buffer [`prepare_conv2d_weight`] allocates for a dense conv weight of `shape` (Cout, Cin, kh, kw)
/// and `dtype`: the zero-padded f32 (Cout, Kp) when K = Cin*kh*kw needs padding on a GPU ([`gemm_k`]);
/// `None` when the checkpoint tensor is kept as it is (reshaped), as on the CPU backend (`host`).
pub fn padded_conv2d_weight(
    shape: &[usize],
    dtype: DType,
    host: bool,
) -> Option<([usize; 2], DType)> {
    let &[cout, cin, kh, kw] = shape else {
        return None;
    };
    let k = cin * kh * kw;
    let (kp, _) = gemm_k(k, dtype);
    (kp != k && !host).then_some(([cout, kp], DType::F32))
}

/// The weight (Cout, Cin, kh, kw) of a dense convolution in the layout [`Conv2dWeight::Prepared`] is:
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
    let Some((padded, dtype)) = padded_conv2d_weight(w.shape(), w.dtype(), rec.gpu().is_host())
    else {
        // (Cout, Cin*kh*kw): a Linear weight (the CPU GEMM takes any K).
        return w.reshape(&[cout, cin * kh * kw]);
    };
    let gpu = rec.gpu().clone();
    let wp = Tensor::zeros_kind(&gpu, &padded, dtype, "conv2d.w_padded", MemKind::Weights)?;
    pad_weight(rec, w, &wp)?;
    Ok(wp) // (Cout, Kp)
}

/// Record `wp` (Cout, Kp) = `w` (Cout, Cin, kh, kw) as rows of K = Cin*kh*kw, zero-padded to Kp.
fn pad_weight(rec: &mut Recorder, w: &Tensor, wp: &Tensor) -> Result<()> {
    let (cout, cin, kh, kw) = (w.dim(0), w.dim(1), w.dim(2), w.dim(3));
    let kp = wp.dim(1);
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
    rec.launch(
        &Kernel::new(&SHADER, "pad_weight").with(&overrides),
        &params,
        &[w, wp],
        grid_1d(ceil_div(cout * kp, WG as usize)),
    )
}

/// Bytes of the im2col scratch [`conv2d`] uses for `rows` output pixels of `k` = Cin*kh*kw columns
/// and a weight of `w_dtype` (one chunk of rows, K padded as [`gemm_k`] pads it; the size an arena
/// must give [`conv2d`] as [`Conv2dArgs::scratch`]).
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

const OP: &str = "conv2d";

/// The sizes of a checked [`conv2d`] call.
struct ConvGeom {
    h: usize,
    w: usize,
    cin: usize,
    cout: usize,
    kh: usize,
    kw: usize,
    ho: usize,
    wo: usize,
    /// Output pixels B * Ho * Wo: the GEMM's rows.
    rows: usize,
}

/// Dtypes and shapes of a conv2d call, and its output size.
fn check_conv2d(
    x: &Tensor,
    w: Conv2dWeight,
    bias: &Tensor,
    args: &Conv2dArgs,
    out: &Tensor,
) -> Result<ConvGeom> {
    check::f32(OP, "x", x)?;
    check::f32(OP, "bias", bias)?;
    check::f32(OP, "out", out)?;
    let (wt, w_rank) = match w {
        Conv2dWeight::Checkpoint(t) => (t, 4),
        Conv2dWeight::Prepared(t, _) => (t, 2),
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
        Conv2dWeight::Checkpoint(t) => (t.dim(0), t.dim(1), t.dim(2), t.dim(3)),
        Conv2dWeight::Prepared(t, (c, kh, kw)) => (t.dim(0), c, kh, kw),
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
    let (stride, pad) = (args.stride, args.pad);
    let (Some(ho), Some(wo)) = (
        conv_out_len(h, kh, stride, pad),
        conv_out_len(wd, kw, stride, pad),
    ) else {
        return Err(Error::shape(
            OP,
            format!(
                "input {h}x{wd} with kernel {kh}x{kw}, stride {stride}, pad {pad} gives no output"
            ),
        ));
    };
    if out.shape() != [b, ho, wo, cout] {
        return Err(Error::shape(
            OP,
            format!("out {:?} must be {:?}", out.shape(), [b, ho, wo, cout]),
        ));
    }
    let (h, w) = (h, wd);
    let rows = b * ho * wo;
    Ok(ConvGeom {
        h,
        w,
        cin,
        cout,
        kh,
        kw,
        ho,
        wo,
        rows,
    })
}

/// The GEMM's weight (Cout, Kp) and Kp: a checkpoint weight reshaped, or padded into a new tensor when
/// its K needs it; a prepared weight as it is (its K checked).
fn gemm_weight(rec: &mut Recorder, w: Conv2dWeight, g: &ConvGeom) -> Result<(Tensor, usize)> {
    let k = g.cin * g.kh * g.kw;
    match w {
        Conv2dWeight::Checkpoint(t) => {
            let (kp, _) = gemm_k(k, t.dtype());
            if kp == k {
                return Ok((t.reshape(&[g.cout, k])?, k)); // (Cout, Cin*kh*kw): a Linear weight
            }
            let gpu = rec.gpu().clone();
            let wp = Tensor::zeros(&gpu, &[g.cout, kp], DType::F32, "conv2d.w_padded")?;
            pad_weight(rec, t, &wp)?;
            Ok((wp, kp)) // (Cout, Kp)
        }
        Conv2dWeight::Prepared(t, _) => {
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
            Ok((t.clone(), kp))
        }
    }
}

/// Rows per im2col chunk within `budget` bytes of scratch: rounded down to whole groups of rows whose
/// output byte offset is storage-aligned (when a group fits), so each chunk's GEMM writes its rows of
/// `out` in place.
fn chunk_rows(budget: u64, kp: usize, rows: usize, cout: usize) -> usize {
    let fit = ((budget / (kp * 4) as u64) as usize).clamp(1, rows);
    let group = OUT_ALIGN / gcd(cout * 4, OUT_ALIGN);
    if fit < rows && fit >= group {
        fit / group * group
    } else {
        fit
    }
}

/// Record a checked conv2d: per chunk of output rows, im2col into the scratch, then the GEMM into
/// `out`'s rows (or a staging copy when they cannot be bound in place).
#[allow(clippy::too_many_arguments)]
fn record_conv2d(
    rec: &mut Recorder,
    x: &Tensor,
    w2: &Tensor,
    kp: usize,
    bias: &Tensor,
    args: &Conv2dArgs,
    g: &ConvGeom,
    budget: u64,
    out: &Tensor,
) -> Result<()> {
    let gpu = rec.gpu().clone();
    let (rows, cout) = (g.rows, g.cout);
    let chunk = chunk_rows(budget.min(gpu.caps.max_storage_binding), kp, rows, cout);
    let in_place = chunk == rows || (chunk * cout * 4).is_multiple_of(OUT_ALIGN);
    let kernel = Kernel::new(&SHADER, "im2col");
    let out2 = out.reshape(&[rows, cout])?; // (B*Ho*Wo, Cout)
                                            // One scratch reused by every chunk, the shorter tail through a prefix view of it (dispatches run in
                                            // recording order, so the next im2col only overwrites it after the previous linear has read it).
    let full = match args.scratch {
        Some(t) if t.capacity() >= (chunk * kp * 4) as u64 => t.view(&[chunk, kp], DType::F32)?,
        _ => Tensor::zeros(&gpu, &[chunk, kp], DType::F32, "conv2d.im2col")?,
    };
    // Chunk outputs that cannot be bound at their offset in `out` go through a copy.
    let staged = match in_place {
        true => None,
        false => Some(Tensor::zeros(
            &gpu,
            &[chunk, cout],
            DType::F32,
            "conv2d.chunk_out",
        )?),
    };
    let mut r0 = 0;
    while r0 < rows {
        let n = chunk.min(rows - r0);
        let off = (r0 * cout * 4) as u64;
        let cols = full.view(&[n, kp], DType::F32)?;
        let dst = match &staged {
            None if n == rows => out2.clone(),
            None => out2.view_at(out2.offset() + off, &[n, cout], DType::F32)?,
            Some(t) => t.view(&[n, cout], DType::F32)?,
        };
        let params = im2col_params(g, args, r0, n, kp);
        rec.launch(
            &kernel,
            &params,
            &[x, &cols],
            grid_1d(ceil_div(n * kp, WG as usize)),
        )?;
        linear(rec, &cols, w2, LinearArgs::default().bias(Some(bias)), &dst)?;
        if staged.is_some() {
            rec.copy_range(&dst, 0, out, off, (n * cout * 4) as u64)?;
        }
        r0 += n;
    }
    Ok(())
}

/// The im2col uniform of `n` output rows from `r0` into a (n, kp) scratch.
fn im2col_params(g: &ConvGeom, args: &Conv2dArgs, r0: usize, n: usize, kp: usize) -> Im2colParams {
    Im2colParams {
        h: g.h as u32,
        w: g.w as u32,
        cin: g.cin as u32,
        ho: g.ho as u32,
        wo: g.wo as u32,
        kh: g.kh as u32,
        kw: g.kw as u32,
        stride: args.stride as u32,
        pad: args.pad as u32,
        row0: r0 as u32,
        rows: n as u32,
        kp: kp as u32,
    }
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
    match rec.backend()? {
        Backend::Host => rec.host_op("dwconv3x3", &[x], || {
            host::vision::dwconv3x3_residual(x, taps, bias, out)
        }),
        Backend::Wgpu(_) => {
            let n32 = check::u32_of(OP, "elements", n)?;
            let lanes = if c.is_multiple_of(4) { 4 } else { 1 };
            let params = DwParams {
                n: n32 / lanes as u32,
                h: h as u32,
                w: wd as u32,
                c: (c / lanes) as u32,
            };
            let defines: &[&str] = if lanes == 4 { &["VEC4"] } else { &[] };
            rec.launch(
                &Kernel::new(&SHADER, "dwconv3x3_residual").defines(defines),
                &params,
                &[x, taps, bias, out],
                grid_1d(ceil_div(n / lanes, WG as usize)),
            )
        }
    }
}
