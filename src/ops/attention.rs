//! Multi-head scaled dot-product attention (`shaders/attention.wgsl`): online softmax over key tiles,
//! heads interleaved in columns, optional causal rule, KV-cache fill, additive mask and K/V shared
//! across the batch (Bk = 1).
//!
//! Two kernels ([`AttnVariant`]): the workgroup-tiled one (`shaders/attention.wgsl`, plus its Tq = 1
//! decode entry) for real GPUs and the browser, and a barrier-free one keeping query rows in registers
//! (`shaders/attention_rows.wgsl`) for CPU adapters. [`attention`] picks with [`choose_attention_variant`].

use crate::error::{Error, Result};
use crate::gpu::{grid_1d, Caps, DType, Kernel, Recorder, Shader, Tensor};
use crate::ops::check;

pub static SHADER: Shader = Shader {
    name: "attention",
    source: include_str!("../../shaders/attention.wgsl"),
};

pub static ROWS_SHADER: Shader = Shader {
    name: "attention_rows",
    source: include_str!("../../shaders/attention_rows.wgsl"),
};

const WG: u32 = 64;
/// Largest head dim of the register kernel (MAXD4 * 4 in `attention_rows.wgsl`).
pub const ROWS_MAX_HEAD_DIM: usize = 80;
/// Query rows per invocation of the register kernel (MAXQ in the shader).
const ROWS_QPI: usize = 4;

/// Which kernel runs an [`attention`] call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnVariant {
    /// `attention.wgsl`: one workgroup per (batch row, head, block of query rows), K/V tiles staged in
    /// workgroup memory, barriers per tile; Tq = 1 with kv_len <= 2048 takes its `attention_decode`
    /// entry. Any head dim up to 768. The default for GPUs and the browser.
    Tiled,
    /// `attention_rows.wgsl`: one invocation per (batch row, head, 4 query rows), rows and outputs in
    /// registers, no workgroup memory or barriers. Head dim a multiple of 4 up to 80. Fast on CPU adapters.
    Rows,
}

/// Whether `variant` can run head dim `d`.
pub fn variant_supports(variant: AttnVariant, d: usize) -> bool {
    match variant {
        AttnVariant::Tiled => (1..=KV_CAP).contains(&d),
        AttnVariant::Rows => d > 0 && d.is_multiple_of(4) && d <= ROWS_MAX_HEAD_DIM,
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
        }
    }
}

/// Mirrors `Params` in `shaders/attention.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    batch: u32,
    tq: u32,
    tk: u32,
    heads: u32,
    bk: u32,
    kv_len: u32,
    q_offset: u32,
    causal: u32,
    has_mask: u32,
    n_qblocks: u32,
    scale: f32,
    _pad: u32,
}

/// Tile sizes (QB query rows, KT keys) for head dim `d` and `tq` query rows, within the shader's
/// workgroup-memory capacities.
fn tiles(d: usize, tq: usize) -> (usize, usize) {
    let qb = QB_MAX.min(tq.max(1)).min(Q_CAP / d).max(1);
    let kt = KT_MAX.min(KV_CAP / d).min(S_CAP / qb).max(1);
    (qb, kt)
}

/// out = softmax(scale * q k^T + mask) v per head. q (B, Tq, H*D), k/v (Bk, Tk, H*D) with Bk = B or 1,
/// out (B, Tq, H*D). See [`AttnOpts`] for the causal rule, KV fill and mask. The kernel is chosen by
/// [`choose_attention_variant`].
pub fn attention(
    rec: &mut Recorder,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: &AttnOpts,
    out: &Tensor,
) -> Result<()> {
    let d = q
        .shape()
        .last()
        .and_then(|w| w.checked_div(opts.heads))
        .unwrap_or(0);
    let variant = choose_attention_variant(&rec.gpu().caps, d);
    attention_variant(rec, variant, q, k, v, opts, out)
}

/// [`attention`] whose key count and query position are read by the kernel, at run time, from `dyn_len`
/// (U32, at least 2 elements: [kv_len, q_offset]) instead of `opts.kv_len` / `opts.q_offset`: a recorded
/// decode step ([`crate::gpu::Plan`]) replays the same bind group at every position and only rewrites
/// `dyn_len`. The shader clamps kv_len to Tk. Same kernels (their `DYN_LEN` variant), same arithmetic.
pub fn attention_dyn(
    rec: &mut Recorder,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: &AttnOpts,
    dyn_len: &Tensor,
    out: &Tensor,
) -> Result<()> {
    let d = q
        .shape()
        .last()
        .and_then(|w| w.checked_div(opts.heads))
        .unwrap_or(0);
    let variant = choose_attention_variant(&rec.gpu().caps, d);
    attention_impl(rec, variant, q, k, v, opts, Some(dyn_len), out)
}

/// [`attention_dyn`] with a given kernel (tests run every variant).
#[allow(clippy::too_many_arguments)]
pub fn attention_dyn_variant(
    rec: &mut Recorder,
    variant: AttnVariant,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: &AttnOpts,
    dyn_len: &Tensor,
    out: &Tensor,
) -> Result<()> {
    attention_impl(rec, variant, q, k, v, opts, Some(dyn_len), out)
}

/// [`attention`] with a given kernel (tests and benchmarks run every variant). Errors with
/// `Error::Shape` when `variant` does not support the head dim ([`variant_supports`]).
pub fn attention_variant(
    rec: &mut Recorder,
    variant: AttnVariant,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: &AttnOpts,
    out: &Tensor,
) -> Result<()> {
    attention_impl(rec, variant, q, k, v, opts, None, out)
}

#[allow(clippy::too_many_arguments)]
fn attention_impl(
    rec: &mut Recorder,
    variant: AttnVariant,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: &AttnOpts,
    dyn_len: Option<&Tensor>,
    out: &Tensor,
) -> Result<()> {
    const OP: &str = "attention";
    if let Some(t) = dyn_len {
        check::dtype(OP, "dyn_len", t, DType::U32)?;
        if t.numel() < 2 {
            return Err(Error::shape(
                OP,
                format!("dyn_len {:?} must hold [kv_len, q_offset]", t.shape()),
            ));
        }
    }
    for (name, t) in [("q", q), ("k", k), ("v", v), ("out", out)] {
        check::f32(OP, name, t)?;
        check::rank(OP, name, t, 3)?;
    }
    let (b, tq, hd) = (q.dim(0), q.dim(1), q.dim(2));
    let (bk, tk) = (k.dim(0), k.dim(1));
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
    let kv_len = match dyn_len {
        Some(_) => tk,
        None => opts.kv_len.map(|l| l as usize).unwrap_or(tk),
    };
    if kv_len > tk {
        return Err(Error::shape(
            OP,
            format!("kv_len {kv_len} exceeds the {tk} key rows"),
        ));
    }
    let gpu = rec.gpu().clone();
    let mask = match opts.mask {
        Some(m) => {
            if m.dtype() != DType::F32 || m.shape() != [tq, tk] {
                return Err(Error::shape(
                    OP,
                    format!(
                        "mask must be f32 ({tq}, {tk}), got {:?} {:?}",
                        m.dtype(),
                        m.shape()
                    ),
                ));
            }
            m
        }
        None => q, // placeholder binding, never read
    };
    if b == 0 || tq == 0 {
        return Ok(());
    }
    if variant == AttnVariant::Rows {
        return record_rows(
            rec,
            q,
            k,
            v,
            opts,
            mask,
            (b, tq, tk, bk, heads, d, kv_len),
            dyn_len,
            out,
        );
    }
    // Decode: one query row; all visible keys' scores fit the decode kernel's workgroup buffer.
    let decode = tq == 1 && kv_len <= DEC_MAXK;
    let (qb, kt) = if decode { (1, 1) } else { tiles(d, tq) };
    let n_qblocks = tq.div_ceil(qb);
    let groups = b
        .checked_mul(heads)
        .and_then(|x| x.checked_mul(n_qblocks))
        .ok_or_else(|| Error::shape(OP, "workgroup count overflows"))?;
    let params = Params {
        batch: check::u32_of(OP, "batch", b)?,
        tq: check::u32_of(OP, "Tq", tq)?,
        tk: check::u32_of(OP, "Tk", tk)?,
        heads: check::u32_of(OP, "heads", heads)?,
        bk: check::u32_of(OP, "Bk", bk)?,
        kv_len: kv_len as u32,
        q_offset: opts.q_offset,
        causal: opts.causal as u32,
        has_mask: opts.mask.is_some() as u32,
        n_qblocks: n_qblocks as u32,
        scale: opts.scale,
        _pad: 0,
    };
    let overrides = [
        ("WG", WG as f64),
        ("D", d as f64),
        ("QB", qb as f64),
        ("KT", kt as f64),
    ];
    let entry = if decode {
        "attention_decode"
    } else {
        "attention"
    };
    let mut bindings = vec![
        q.binding(&gpu)?,
        k.binding(&gpu)?,
        v.binding(&gpu)?,
        mask.binding(&gpu)?,
        out.binding(&gpu)?,
    ];
    if let Some(t) = dyn_len {
        bindings.push(t.binding(&gpu)?);
    }
    rec.dispatch(
        &Kernel::new(&SHADER, entry)
            .with(&overrides)
            .defines(dyn_defines(dyn_len)),
        &params,
        &bindings,
        grid_1d(check::u32_of(OP, "workgroups", groups)?),
    )
}

/// The register kernel: one invocation per (batch row, head, group of up to 4 query rows). Its shader runs
/// without run-time bounds checks: the shape checks of [`attention_variant`] (and `variant_supports`:
/// D % 4 == 0, D <= 80) are what its header's bounds proof relies on; keep them in step.
#[allow(clippy::too_many_arguments)]
fn record_rows(
    rec: &mut Recorder,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: &AttnOpts,
    mask: &Tensor,
    (b, tq, tk, bk, heads, d, kv_len): (usize, usize, usize, usize, usize, usize, usize),
    dyn_len: Option<&Tensor>,
    out: &Tensor,
) -> Result<()> {
    const OP: &str = "attention";
    let gpu = rec.gpu().clone();
    let qpi = ROWS_QPI.min(tq);
    let n_qgroups = tq.div_ceil(qpi);
    let total = b
        .checked_mul(heads)
        .and_then(|x| x.checked_mul(n_qgroups))
        .ok_or_else(|| Error::shape(OP, "invocation count overflows"))?;
    let total32 = check::u32_of(OP, "invocations", total)?;
    // Few invocations (decode): small workgroups so that they still spread over every CPU thread.
    let wg: u32 = if total < 512 { 8 } else { WG };
    let params = Params {
        batch: check::u32_of(OP, "batch", b)?,
        tq: check::u32_of(OP, "Tq", tq)?,
        tk: check::u32_of(OP, "Tk", tk)?,
        heads: check::u32_of(OP, "heads", heads)?,
        bk: check::u32_of(OP, "Bk", bk)?,
        kv_len: kv_len as u32,
        q_offset: opts.q_offset,
        causal: opts.causal as u32,
        has_mask: opts.mask.is_some() as u32,
        n_qblocks: n_qgroups as u32,
        scale: opts.scale,
        _pad: 0,
    };
    let overrides = [
        ("WG", wg as f64),
        ("D4", (d / 4) as f64),
        ("QPI", qpi as f64),
    ];
    let mut bindings = vec![
        q.binding(&gpu)?,
        k.binding(&gpu)?,
        v.binding(&gpu)?,
        mask.binding(&gpu)?,
        out.binding(&gpu)?,
    ];
    if let Some(t) = dyn_len {
        bindings.push(t.binding(&gpu)?);
    }
    rec.dispatch(
        &Kernel::new(&ROWS_SHADER, "attention_rows")
            .with(&overrides)
            .defines(dyn_defines(dyn_len)),
        &params,
        &bindings,
        grid_1d(total32.div_ceil(wg)),
    )
}

/// The shader variant reading kv_len / q_offset from a buffer ([`attention_dyn`]).
fn dyn_defines(dyn_len: Option<&Tensor>) -> &'static [&'static str] {
    if dyn_len.is_some() {
        &["DYN_LEN"]
    } else {
        &[]
    }
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
}
