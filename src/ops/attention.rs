//! Multi-head scaled dot-product attention (`shaders/attention.wgsl`): online softmax over key tiles,
//! heads interleaved in columns, optional causal rule, KV-cache fill, additive mask and K/V shared
//! across the batch (Bk = 1).
//!
//! Three kernels ([`AttnVariant`]): the workgroup-tiled one (`shaders/attention.wgsl`, plus its Tq = 1
//! decode entry), the GPU-class flash kernel (`shaders/attention_flash.wgsl`: K/V tiles in workgroup
//! memory, each query row's state in registers, vec4 loads) and a barrier-free one keeping query rows in
//! registers (`shaders/attention_rows.wgsl`) for CPU adapters. [`attention`] asks the kernel registry
//! (the tuner's choice for the call's [`ShapeClass`]) first and falls back to
//! [`choose_attention_variant`].
//!
//! K and V are f32, or f16 (packed halves, [`DType::F16`]): every kernel has a `KV_F16` variant that
//! widens them to f32 on load (the decoder's KV caches and cross-attention K/V when the weights are not
//! fp32; half the bytes held and read). q, the mask and out stay f32, and so does the arithmetic.

use crate::cpu::host;
use crate::error::{Error, Result};
use crate::gpu::registry::ShapeClass;
use crate::gpu::Backend;
use crate::gpu::{grid_1d, shader, uniform, Caps, DType, Device, Kernel, Recorder, Shader, Tensor};
pub use crate::opdef::attention::{AttnOpts, AttnVariant};
use crate::opdef::check;

shader!(pub static SHADER = "attention", [
    ("WG", WG),
    ("Q_CAP", Q_CAP as u32),
    ("KV_CAP", KV_CAP as u32),
    ("S_CAP", S_CAP as u32),
    ("QB_MAX", QB_MAX as u32),
    ("DEC_MAXK", DEC_MAXK as u32),
]);

shader!(pub static ROWS_SHADER = "attention_rows", [
    ("MAX_WG", ROWS_WG),
    ("MAXD4", (ROWS_MAX_HEAD_DIM / 4) as u32),
    ("MAXQ", ROWS_QPI as u32),
]);

shader!(pub static FLASH_SHADER = "attention_flash", [
    ("MAX_WG", FLASH_MAX_WG as u32),
    ("MAXD4", (FLASH_MAX_HEAD_DIM / 4) as u32),
    ("MAXKPL", FLASH_MAXKPL as u32),
    ("KV4", FLASH_KV4 as u32),
]);

/// Workgroup size of the tiled kernel.
const WG: u32 = 64;
/// Largest head dim of the register kernel.
pub const ROWS_MAX_HEAD_DIM: usize = 80;
/// Most query rows per invocation of the register kernel.
const ROWS_QPI: usize = 4;
/// Workgroup size of the register kernel, and (below [`ROWS_FEW`] invocations) its small one.
const ROWS_WG: u32 = 64;
const ROWS_WG_SMALL: u32 = 8;
/// Invocation count under which the register kernel runs small workgroups (decode), so that they still
/// spread over every CPU thread.
const ROWS_FEW: usize = 512;

impl AttnVariant {
    /// Every variant: the tuner's candidates (filtered by [`AttnVariant::supports`]).
    pub const ALL: [AttnVariant; 4] = [
        AttnVariant::Tiled,
        AttnVariant::Rows,
        AttnVariant::Flash,
        AttnVariant::FlashSplit,
    ];

    /// The name in tuning tables and caches.
    pub fn name(self) -> &'static str {
        match self {
            AttnVariant::Tiled => "tiled",
            AttnVariant::Rows => "rows",
            AttnVariant::Flash => "flash",
            AttnVariant::FlashSplit => "flash_split",
        }
    }

    pub fn from_name(s: &str) -> Option<AttnVariant> {
        AttnVariant::ALL.into_iter().find(|v| v.name() == s)
    }

    /// Whether this variant runs head dim `d` on an adapter with `caps` (workgroup memory and size).
    pub fn supports(self, caps: &Caps, d: usize) -> bool {
        variant_supports(self, d)
            && match self {
                AttnVariant::Rows => true,
                AttnVariant::Tiled => {
                    caps.max_workgroup_storage >= TILED_WG_BYTES && caps.max_invocations >= WG
                }
                AttnVariant::Flash | AttnVariant::FlashSplit => {
                    caps.max_workgroup_storage >= FLASH_WG_BYTES
                        && caps.max_invocations >= FLASH_MAX_WG as u32
                }
            }
    }
}

/// Whether `variant` can run head dim `d` (on any WebGPU adapter: their guaranteed limits suffice).
pub fn variant_supports(variant: AttnVariant, d: usize) -> bool {
    match variant {
        AttnVariant::Tiled => (1..=KV_CAP).contains(&d),
        AttnVariant::Rows => d > 0 && d.is_multiple_of(4) && d <= ROWS_MAX_HEAD_DIM,
        AttnVariant::Flash | AttnVariant::FlashSplit => {
            d > 0 && d.is_multiple_of(4) && d <= FLASH_MAX_HEAD_DIM
        }
    }
}

/// The variant [`attention`] uses for head dim `d`: the register kernel on CPU adapters when it supports
/// `d`, the tiled kernel otherwise.
pub fn choose_attention_variant(caps: &Caps, d: usize) -> AttnVariant {
    if caps.is_cpu && variant_supports(AttnVariant::Rows, d) {
        AttnVariant::Rows
    } else {
        AttnVariant::Tiled
    }
}
/// Workgroup-memory capacities in the shader (f32 elements): Q block and output block, K/V tile,
/// score tile, per-row statistics.
const Q_CAP: usize = 1024;
const KV_CAP: usize = 768;
const S_CAP: usize = 256;
const QB_MAX: usize = 16;
/// Longest key range of the decode kernel (its score buffer).
const DEC_MAXK: usize = 2048;
const KT_MAX: usize = 64;
/// Workgroup memory of the tiled kernel (its `attention_decode` entry: 8 KiB scores + 2 KiB scratch + q).
const TILED_WG_BYTES: u32 = 16 * 1024;

/// Flash kernel (`attention_flash.wgsl`): largest head dim, vec4 capacity of each of the K and V tiles,
/// keys per invocation per tile, largest workgroup, workgroup memory.
pub const FLASH_MAX_HEAD_DIM: usize = 64;
const FLASH_KV4: usize = 448;
const FLASH_MAXKPL: usize = 64;
pub(crate) const FLASH_MAX_WG: usize = 64;
/// Most query rows per workgroup of `flash_split`.
const FLASH_SPLIT_ROWS: usize = 16;
const FLASH_WG_BYTES: u32 = (2 * FLASH_KV4 * 16 + 2 * FLASH_MAX_WG * 4) as u32;

uniform! {
    /// The uniform of every attention kernel.
    struct AttnParams: ATTN_PARAMS_LAYOUT = "include/attn_params" / Params {
        batch: u32, tq: u32, tk: u32, heads: u32, bk: u32, kv_len: u32, q_offset: u32, causal: u32,
        has_mask: u32, n_qblocks: u32, scale: f32, q_stride: u32, kv_stride: u32, k_off: u32,
        v_off: u32, out_stride: u32
    }
}

impl AttnParams {
    /// The uniform of a call over `l`'s rows with `opts`' rule, in `n_qblocks` blocks of query rows.
    fn new(l: &AttnLayout, opts: &AttnOpts, n_qblocks: usize) -> Result<Self> {
        let u = |name: &str, x: usize| check::u32_of("attention", name, x);
        Ok(AttnParams {
            batch: u("batch", l.batch)?,
            tq: u("Tq", l.tq)?,
            tk: u("Tk", l.tk)?,
            heads: u("heads", l.heads)?,
            bk: u("Bk", l.bk)?,
            kv_len: u("kv_len", l.kv_len)?,
            q_offset: opts.q_offset,
            causal: opts.causal as u32,
            has_mask: opts.mask.is_some() as u32,
            n_qblocks: u("q blocks", n_qblocks)?,
            scale: opts.scale,
            q_stride: u("q stride", l.q_stride / 4)?,
            kv_stride: u("kv stride", l.kv_stride / 4)?,
            k_off: u("k offset", l.k_off / 4)?,
            v_off: u("v offset", l.v_off / 4)?,
            out_stride: u("out stride", l.heads * l.d / 4)?,
        })
    }
}

/// Tile sizes (QB query rows, KT keys) for head dim `d` and `tq` query rows, within the shader's
/// workgroup-memory capacities.
fn tiles(d: usize, tq: usize) -> (usize, usize) {
    let qb = QB_MAX.min(tq.max(1)).min(Q_CAP / d).max(1);
    let kt = KT_MAX.min(KV_CAP / d).min(S_CAP / qb).max(1);
    (qb, kt)
}

/// out = softmax(scale * q k^T + mask) v per head. q (B, Tq, H*D), k/v (Bk, Tk, H*D) with Bk = B or 1,
/// out (B, Tq, H*D). See [`AttnOpts`] for the causal rule, KV fill, mask, run-time lengths and kernel.
pub fn attention(
    rec: &mut Recorder,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: &AttnOpts,
    out: &Tensor,
) -> Result<()> {
    let variant = match opts.variant {
        Some(v) => v,
        None => chosen_variant(rec.gpu(), rec.images(), q, k, opts),
    };
    check_operands(q, k, v, opts, out)?;
    match rec.backend()? {
        Backend::Host => {
            mask_of(q, opts, q.dim(1), k.dim(1))?;
            rec.host_op("attention", &[q, k], || {
                host::dense::attention(q, k, v, opts, out)
            })
        }
        Backend::Wgpu(_) => {
            let layout = layout_of(q, k, opts, variant)?;
            let mask = mask_of(q, opts, layout.tq, layout.tk)?;
            if layout.batch == 0 || layout.tq == 0 {
                return Ok(());
            }
            let tensors = [q, k, v, mask];
            let dyn_len = opts.dyn_len;
            let launch = match variant {
                AttnVariant::Tiled => tiled_launch(&layout)?,
                AttnVariant::Rows => rows_launch(&layout)?,
                AttnVariant::Flash => flash_launch(&layout, FLASH_MAX_WG)?,
                AttnVariant::FlashSplit => flash_launch(&layout, FLASH_SPLIT_ROWS)?,
            };
            record_launch(rec, &layout, opts, tensors, dyn_len, out, launch)
        }
    }
}

/// The registry's choice for the call's [`ShapeClass::attention`] when the tuner made one and it supports the
/// head dim, else [`choose_attention_variant`]. Shapes are checked later by the launcher. The class is
/// one image's share of the batch (`images`, [`crate::gpu::Recorder::set_images`]), so that each image or
/// request of a batch gets the kernel it gets alone.
fn chosen_variant(
    gpu: &crate::gpu::Device,
    images: usize,
    q: &Tensor,
    k: &Tensor,
    opts: &AttnOpts,
) -> AttnVariant {
    let dim = |t: &Tensor, i: usize| t.shape().get(i).copied().unwrap_or(0);
    let d = q
        .shape()
        .last()
        .and_then(|w| w.checked_div(opts.heads))
        .unwrap_or(0);
    let rows = dim(q, 0).div_ceil(images) * dim(q, 1);
    let class = ShapeClass::attention(
        rows,
        dim(k, 1),
        d,
        opts.heads,
        opts.causal,
        opts.mask.is_some(),
    );
    gpu.choices
        .get(&class)
        .and_then(AttnVariant::from_name)
        .filter(|v| v.supports(&gpu.caps, d))
        .unwrap_or_else(|| choose_attention_variant(&gpu.caps, d))
}

const OP: &str = "attention";

/// Dtypes and ranks of an attention call; k and v alike, their batch 1 or q's, out like q.
fn check_operands(q: &Tensor, k: &Tensor, v: &Tensor, opts: &AttnOpts, out: &Tensor) -> Result<()> {
    if let Some(t) = opts.dyn_len {
        check::dtype(OP, "dyn_len", t, DType::U32)?;
        if t.numel() < 2 {
            return Err(Error::shape(
                OP,
                format!("dyn_len {:?} must hold [kv_len, q_offset]", t.shape()),
            ));
        }
    }
    for (name, t) in [("q", q), ("out", out)] {
        check::f32(OP, name, t)?;
    }
    check_kv_dtype(OP, k, v)?;
    for (name, t) in [("q", q), ("k", k), ("v", v), ("out", out)] {
        check::rank(OP, name, t, 3)?;
    }
    let (b, hd, bk) = (q.dim(0), q.dim(2), k.dim(0));
    if k.shape() != v.shape() || k.dim(2) != hd {
        return Err(Error::shape(
            OP,
            format!(
                "q {:?}, k {:?}, v {:?}: k and v must match and share q's width",
                q.shape(),
                k.shape(),
                v.shape()
            ),
        ));
    }
    if bk != b && bk != 1 {
        return Err(Error::shape(
            OP,
            format!("k/v batch {bk} must be 1 or q's batch {b}"),
        ));
    }
    if out.shape() != q.shape() {
        return Err(Error::shape(
            OP,
            format!("out {:?} must match q {:?}", out.shape(), q.shape()),
        ));
    }
    Ok(())
}

/// The geometry of a checked call (packed rows) for `variant`: heads dividing the width, a head dim
/// the variant supports, kv_len within Tk.
fn layout_of(q: &Tensor, k: &Tensor, opts: &AttnOpts, variant: AttnVariant) -> Result<AttnLayout> {
    let (b, tq, hd) = (q.dim(0), q.dim(1), q.dim(2));
    let (bk, tk) = (k.dim(0), k.dim(1));
    let heads = opts.heads;
    if heads == 0 || hd == 0 || !hd.is_multiple_of(heads) {
        return Err(Error::shape(
            OP,
            format!("width {hd} is not a positive multiple of {heads} heads"),
        ));
    }
    let d = hd / heads;
    if !variant_supports(variant, d) {
        return Err(Error::shape(
            OP,
            format!("head dim {d} is not supported by the {variant:?} kernel"),
        ));
    }
    // With `dyn_len` the key count is only known per step: up to Tk.
    let kv_len = match opts.dyn_len {
        Some(_) => tk,
        None => opts.kv_len.map(|l| l as usize).unwrap_or(tk),
    };
    if kv_len > tk {
        return Err(Error::shape(
            OP,
            format!("kv_len {kv_len} exceeds the {tk} key rows"),
        ));
    }
    Ok(AttnLayout {
        batch: b,
        bk,
        tq,
        tk,
        heads,
        d,
        kv_len,
        q_stride: hd,
        kv_stride: hd,
        k_off: 0,
        v_off: 0,
    })
}

/// The mask binding: `opts.mask`, f32 (Tq, Tk), or q as a placeholder the kernel never reads.
fn mask_of<'t>(q: &'t Tensor, opts: &AttnOpts<'t>, tq: usize, tk: usize) -> Result<&'t Tensor> {
    match opts.mask {
        Some(m) if m.dtype() != DType::F32 || m.shape() != [tq, tk] => Err(Error::shape(
            OP,
            format!(
                "mask must be f32 ({tq}, {tk}), got {:?} {:?}",
                m.dtype(),
                m.shape()
            ),
        )),
        Some(m) => Ok(m),
        None => Ok(q),
    }
}

/// One attention kernel's launch: its shader and entry point, override constants, the blocks of query
/// rows its uniform counts, and the workgroups of its grid.
struct AttnLaunch {
    shader: &'static Shader,
    entry: &'static str,
    overrides: Vec<(&'static str, f64)>,
    n_blocks: usize,
    workgroups: usize,
    /// Element indices are u32 in the shader (checked for q, k, v, out).
    u32_indices: bool,
}

/// Record `launch` over `[q, k, v, mask]` into `out`: the uniform, the bindings and the dispatch every
/// attention kernel shares.
fn record_launch(
    rec: &mut Recorder,
    l: &AttnLayout,
    opts: &AttnOpts,
    [q, k, v, mask]: [&Tensor; 4],
    dyn_len: Option<&Tensor>,
    out: &Tensor,
    launch: AttnLaunch,
) -> Result<()> {
    let gpu = rec.gpu().clone();
    let params = AttnParams::new(l, opts, launch.n_blocks)?;
    if launch.u32_indices {
        for (name, t) in [("q", q), ("k", k), ("v", v), ("out", out)] {
            check::u32_of(OP, name, t.numel())?;
        }
    }
    let bindings = attn_bindings(&gpu, [q, k, v, mask, out], dyn_len)?;
    rec.dispatch(
        &Kernel::new(launch.shader, launch.entry)
            .with(&launch.overrides)
            .defines(variant_defines(dyn_len, k)),
        &params,
        &bindings,
        grid_1d(check::u32_of(OP, "workgroups", launch.workgroups)?),
    )
}

/// batch x heads x `per_head` (workgroups or invocations), or a named error on overflow.
fn per_head_count(l: &AttnLayout, per_head: usize, what: &str) -> Result<usize> {
    l.batch
        .checked_mul(l.heads)
        .and_then(|x| x.checked_mul(per_head))
        .ok_or_else(|| Error::shape(OP, format!("{what} count overflows")))
}

/// The tiled kernel: one workgroup per (batch row, head, block of QB query rows); a decode step (one
/// query row, at most [`DEC_MAXK`] keys) takes its `attention_decode` entry.
fn tiled_launch(l: &AttnLayout) -> Result<AttnLaunch> {
    // Decode: one query row; all visible keys' scores fit the decode kernel's workgroup buffer.
    let decode = l.tq == 1 && l.kv_len <= DEC_MAXK;
    let (qb, kt) = if decode { (1, 1) } else { tiles(l.d, l.tq) };
    let n_qblocks = l.tq.div_ceil(qb);
    Ok(AttnLaunch {
        shader: &SHADER,
        entry: if decode {
            "attention_decode"
        } else {
            "attention"
        },
        overrides: vec![("D", l.d as f64), ("QB", qb as f64), ("KT", kt as f64)],
        n_blocks: n_qblocks,
        workgroups: per_head_count(l, n_qblocks, "workgroup")?,
        u32_indices: false,
    })
}

/// The register kernel: one invocation per (batch row, head, group of up to 4 query rows). Its shader runs
/// without run-time bounds checks: the shape checks of [`attention`] (and `variant_supports`:
/// D % 4 == 0, D <= 80) are what its header's bounds proof relies on; keep them in step.
fn rows_launch(l: &AttnLayout) -> Result<AttnLaunch> {
    let qpi = ROWS_QPI.min(l.tq);
    let n_qgroups = l.tq.div_ceil(qpi);
    let total = per_head_count(l, n_qgroups, "invocation")?;
    let total32 = check::u32_of(OP, "invocations", total)?;
    let wg = if total < ROWS_FEW {
        ROWS_WG_SMALL
    } else {
        ROWS_WG
    };
    Ok(AttnLaunch {
        shader: &ROWS_SHADER,
        entry: "attention_rows",
        overrides: vec![
            ("WG", wg as f64),
            ("D4", (l.d / 4) as f64),
            ("QPI", qpi as f64),
        ],
        n_blocks: n_qgroups,
        workgroups: total32.div_ceil(wg) as usize,
        u32_indices: false,
    })
}

/// Bindings 1-5 of every attention shader (q, k, v, mask, out), then binding 6 (the kv_len / q_offset
/// buffer) in the DYN_LEN variant.
fn attn_bindings<'a>(
    gpu: &Device,
    tensors: [&'a Tensor; 5],
    dyn_len: Option<&'a Tensor>,
) -> Result<Vec<wgpu::BindingResource<'a>>> {
    tensors
        .into_iter()
        .chain(dyn_len)
        .map(|t| t.binding(gpu))
        .collect()
}

/// The shader variant: kv_len / q_offset read from a buffer ([`AttnOpts::dyn_len`]: `DYN_LEN`), K/V packed
/// f16 (`KV_F16`, when `k` is [`DType::F16`]; v has k's dtype, checked by [`check_kv_dtype`]).
fn variant_defines(dyn_len: Option<&Tensor>, k: &Tensor) -> &'static [&'static str] {
    match (dyn_len.is_some(), k.dtype() == DType::F16) {
        (false, false) => &[],
        (true, false) => &["DYN_LEN"],
        (false, true) => &["KV_F16"],
        (true, true) => &["DYN_LEN", "KV_F16"],
    }
}

/// K and V are both f32 or both f16 (packed halves).
fn check_kv_dtype(op: &'static str, k: &Tensor, v: &Tensor) -> Result<()> {
    match (k.dtype(), v.dtype()) {
        (DType::F32, DType::F32) | (DType::F16, DType::F16) => Ok(()),
        (kd, vd) => Err(Error::shape(
            op,
            format!("k and v must both be f32 or both f16, got {kd:?} and {vd:?}"),
        )),
    }
}

/// Query rows per batch row timed by the tuner in `auto` (CPU adapters take seconds on a full encoder).
const AUTO_ATTN_ROWS: usize = 256;

/// An attention call shape for the tuner ([`crate::gpu::tune::TuneCase`]): q (B, Tq, H*D), k/v
/// (Bk, Tk, H*D), all keys valid, with or without the causal rule and an additive mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    pub b: usize,
    pub tq: usize,
    pub bk: usize,
    pub tk: usize,
    pub heads: usize,
    pub d: usize,
    pub causal: bool,
    pub masked: bool,
}

impl crate::gpu::tune::TuneCase for AttnShape {
    fn class(&self) -> ShapeClass {
        let AttnShape {
            b,
            tq,
            tk,
            heads,
            d,
            causal,
            masked,
            ..
        } = *self;
        ShapeClass::attention(b * tq, tk, d, heads, causal, masked)
    }

    fn candidates(&self, caps: &Caps) -> Vec<&'static str> {
        AttnVariant::ALL
            .into_iter()
            .filter(|v| v.supports(caps, self.d))
            .map(AttnVariant::name)
            .collect()
    }

    fn flops(&self) -> f64 {
        4.0 * (self.b * self.tq * self.tk * self.heads * self.d) as f64
    }

    fn auto_shape(&self) -> Option<Box<dyn crate::gpu::tune::TuneCase>> {
        let tq = AUTO_ATTN_ROWS;
        crate::gpu::tune::shrunk(self.tq > tq, || AttnShape { tq, ..*self })
    }

    fn prepare(
        &self,
        gpu: &std::sync::Arc<crate::gpu::Device>,
    ) -> Result<crate::gpu::tune::CaseRunner> {
        let s = *self;
        let hd = s.heads * s.d;
        let q = Tensor::zeros(gpu, &[s.b, s.tq, hd], DType::F32, "tune.q")?;
        let k = Tensor::zeros(gpu, &[s.bk, s.tk, hd], DType::F32, "tune.k")?;
        let v = Tensor::zeros(gpu, &[s.bk, s.tk, hd], DType::F32, "tune.v")?;
        let out = Tensor::zeros(gpu, &[s.b, s.tq, hd], DType::F32, "tune.attn")?;
        let mask = match s.masked {
            true => Some(Tensor::zeros(gpu, &[s.tq, s.tk], DType::F32, "tune.mask")?),
            false => None,
        };
        Ok(Box::new(move |rec: &mut Recorder, name: &'static str| {
            let variant = AttnVariant::from_name(name)
                .ok_or_else(|| Error::shape("attention", format!("no variant {name:?}")))?;
            let opts = AttnOpts {
                heads: s.heads,
                scale: 1.0,
                causal: s.causal,
                kv_len: None,
                q_offset: s.tk.saturating_sub(s.tq) as u32,
                mask: mask.as_ref(),
                dyn_len: None,
                variant: Some(variant),
            };
            attention(rec, &q, &k, &v, &opts, &out)
        }))
    }
}

/// The geometry of one attention call, and where the kernel finds its rows, in f32 elements: q rows of
/// `q_stride`, k/v rows of `kv_stride` with k and v at column offsets `k_off` / `v_off` (0 for separate
/// tensors; C and 2C when q, k and v are one fused qkv tensor, which only the flash kernel reads: all
/// multiples of 4 there), out rows of H*D.
pub(crate) struct AttnLayout {
    pub batch: usize,
    pub bk: usize,
    pub tq: usize,
    pub tk: usize,
    pub heads: usize,
    pub d: usize,
    pub kv_len: usize,
    pub q_stride: usize,
    pub kv_stride: usize,
    pub k_off: usize,
    pub v_off: usize,
}

/// The flash kernel's launch shape for head dim `d`, `tq` query rows per batch row and at most `max_rows`
/// rows per workgroup: (QB rows per workgroup, S invocations per row, KT keys per tile). QB * S <= 64;
/// few rows are split over S
/// invocations (a power of two) so a decode step still fills a workgroup; the K and V tiles fit
/// FLASH_KV4 vec4s each; KT is a multiple of S with KT / S <= FLASH_MAXKPL; the merge scratch
/// (QB * S / 2 * D/4 vec4s) fits the two tiles.
pub(crate) fn flash_tiles(d: usize, tq: usize, max_rows: usize) -> (usize, usize, usize) {
    let d4 = (d / 4).max(1);
    let qb = tq.clamp(1, max_rows.clamp(1, FLASH_MAX_WG));
    let per_tile = (FLASH_KV4 / d4).max(1);
    let mut s = 1;
    while qb * s * 2 <= FLASH_MAX_WG && s * 2 <= per_tile {
        s *= 2;
    }
    let kt = (per_tile / s * s).min(FLASH_MAXKPL * s).max(s);
    (qb, s, kt)
}

/// Record the flash kernel over `[q, k, v, mask]` (the mask binding is a placeholder unless `opts.mask`),
/// at most `max_rows` query rows per workgroup ([`FLASH_MAX_WG`]: `flash`, [`FLASH_SPLIT_ROWS`]:
/// `flash_split`). Callers have checked the shapes against `l` (the shader runs with naga's bounds checks).
pub(crate) fn record_flash(
    rec: &mut Recorder,
    l: &AttnLayout,
    max_rows: usize,
    opts: &AttnOpts,
    tensors: [&Tensor; 4],
    dyn_len: Option<&Tensor>,
    out: &Tensor,
) -> Result<()> {
    let launch = flash_launch(l, max_rows)?;
    record_launch(rec, l, opts, tensors, dyn_len, out, launch)
}

/// The flash kernel: one workgroup per (batch row, head, block of QB query rows), S invocations per row.
fn flash_launch(l: &AttnLayout, max_rows: usize) -> Result<AttnLaunch> {
    let (qb, s, kt) = flash_tiles(l.d, l.tq, max_rows);
    let n_qblocks = l.tq.div_ceil(qb);
    Ok(AttnLaunch {
        shader: &FLASH_SHADER,
        entry: "attention_flash",
        overrides: vec![
            ("WG", (qb * s) as f64),
            ("D4", (l.d / 4) as f64),
            ("QB", qb as f64),
            ("S", s as f64),
            ("KT", kt as f64),
        ],
        n_blocks: n_qblocks,
        workgroups: per_head_count(l, n_qblocks, "workgroup")?,
        u32_indices: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_fit_the_shader_capacities() {
        for d in [1usize, 8, 24, 32, 48, 64, 80, 128, 256, 768] {
            for tq in [1usize, 2, 7, 16, 144, 1000] {
                let (qb, kt) = tiles(d, tq);
                assert!((1..=QB_MAX).contains(&qb) && qb <= tq.max(1));
                assert!(qb * d <= Q_CAP, "d {d} tq {tq}");
                assert!(kt >= 1 && kt * d <= KV_CAP && qb * kt <= S_CAP);
            }
        }
    }

    #[test]
    fn auto_tuning_times_fewer_rows_of_long_attention() {
        use crate::gpu::tune::TuneCase;
        let enc = AttnShape {
            b: 1,
            tq: 593,
            bk: 1,
            tk: 593,
            heads: 12,
            d: 64,
            causal: false,
            masked: false,
        };
        let small = enc.auto_shape().map(|s| s.flops());
        assert_eq!(small, Some(enc.flops() * AUTO_ATTN_ROWS as f64 / 593.0));
        assert!(AttnShape { tq: 1, ..enc }.auto_shape().is_none());
    }

    #[test]
    fn flash_tiles_fit_the_shader_capacities() {
        for d in (4..=FLASH_MAX_HEAD_DIM).step_by(4) {
            let d4 = d / 4;
            for (tq, rows) in [1usize, 2, 3, 5, 7, 16, 33, 49, 64, 65, 144, 600]
                .into_iter()
                .flat_map(|tq| [(tq, FLASH_MAX_WG), (tq, FLASH_SPLIT_ROWS)])
            {
                let (qb, s, kt) = flash_tiles(d, tq, rows);
                let wg = qb * s;
                assert!(
                    qb >= 1 && qb <= tq.min(rows) && wg <= FLASH_MAX_WG,
                    "d {d} tq {tq}"
                );
                assert!(s.is_power_of_two() && kt % s == 0 && kt / s <= FLASH_MAXKPL);
                assert!(kt * d4 <= FLASH_KV4, "d {d} tq {tq} kt {kt}");
                assert!(wg / 2 * d4 <= 2 * FLASH_KV4);
            }
        }
        // Decode fills a workgroup by splitting keys; windows of 49 tokens fit one K/V tile at D = 32.
        assert_eq!(flash_tiles(64, 1, FLASH_MAX_WG).1, 16);
        // flash_split on the encoder: 16 rows x 4 invocations per workgroup.
        assert_eq!(flash_tiles(64, 600, FLASH_SPLIT_ROWS).0, 16);
        assert_eq!(flash_tiles(64, 600, FLASH_SPLIT_ROWS).1, 4);
        let (qb, s, kt) = flash_tiles(32, 49, FLASH_MAX_WG);
        assert_eq!((qb, s), (49, 1));
        assert!(kt >= 49);
    }
}
