//! DaViT channel attention core (`shaders/channel_attn.wgsl`): grouped attention across channels, with
//! the token count N as the reduction axis of the (d x d) logits and N^-0.5 as the scale.

use crate::cpu::channel_attn::{channel_logits as cpu_logits, ChannelLogits as CpuLogits};
use crate::cpu::host;
use crate::error::{Error, Result};
use crate::gpu::host::with_host;
use crate::gpu::Backend;
use crate::gpu::{
    ceil_div, grid_1d, shader, uniform, DType, Kernel, Recorder, Tensor, MAX_GRID_DIM,
};
use crate::opdef::check;

shader!(pub static SHADER = "channel_attn", [("WG", WG), ("TILE", TILE as u32)]);

const WG: u32 = 256;
/// Tokens summed by one `gram_partial` workgroup. 256 keeps stage 0 of a 768 image (36864 tokens) at
/// 144 splits x groups workgroups: enough parallelism, and the partial buffer stays small.
const CHUNK: usize = 256;
/// (i, j) tile edge of one `gram_partial` workgroup (8x8 invocations x 4x4 outputs).
const TILE: usize = 32;

uniform! {
    #[derive(Debug)]
    struct Params: PARAMS_LAYOUT = "channel_attn" / Params {
        n: u32, c: u32, d: u32, g: u32, chunk: u32, nsplit: u32, tiles_j: u32, total: u32,
        scale: f32, qk_stride: u32, v_stride: u32, v_off: u32
    }
}

/// Channel attention for qkv (B, N, 3C) (columns: q | k | v, each split into `groups` groups of d = C /
/// groups channels, as the reference's reshape (B, N, 3, groups, d) lays them out) -> out (B, N, C):
/// per group, attn = softmax_j(sum_n q[n, i] k[n, j] * N^-0.5) and out[n, g*d + i] = sum_j attn[i, j]
/// v[n, j]. The `qkv` and `proj` Linears around it are separate `linear` calls.
pub fn channel_attention(
    rec: &mut Recorder,
    qkv: &Tensor,
    groups: usize,
    out: &Tensor,
) -> Result<()> {
    channel_attention_impl(rec, qkv, groups, out, None)
}

/// [`channel_attention`] with its Gram partials, (B, N/256, groups, d, d), viewed in `scratch` (a
/// dead buffer of an activation arena, distinct from `qkv`) when it is big enough, instead of a fresh
/// allocation. Same values. `scratch` may be `out`'s buffer: the partials are reduced (into the
/// small attention matrices) before the output is written.
pub fn channel_attention_with_scratch(
    rec: &mut Recorder,
    qkv: &Tensor,
    groups: usize,
    out: &Tensor,
    scratch: &Tensor,
) -> Result<()> {
    check::distinct("channel_attention", ("qkv", qkv), ("scratch", scratch))?;
    check::distinct("channel_attention", ("qkv", qkv), ("out", out))?;
    channel_attention_impl(rec, qkv, groups, out, Some(scratch))
}

fn channel_attention_impl(
    rec: &mut Recorder,
    qkv: &Tensor,
    groups: usize,
    out: &Tensor,
    scratch: Option<&Tensor>,
) -> Result<()> {
    const OP: &str = "channel_attention";
    check::f32(OP, "qkv", qkv)?;
    if qkv.rank() != 3 || !qkv.dim(2).is_multiple_of(3) {
        return Err(Error::shape(
            OP,
            format!("qkv {:?} must be (B, N, 3C)", qkv.shape()),
        ));
    }
    let c = qkv.dim(2) / 3;
    let attn = logits_impl(rec, qkv, c, groups, scratch)?;
    attn.apply_impl(rec, qkv, 3 * c, 2 * c, out)
}

/// The attention matrices of [`channel_attention`] from q and k alone, for a caller that computes v
/// afterwards (into memory q and k occupied: DaViT's arena): [`ChannelLogits::apply`] then reads v.
pub struct ChannelLogits {
    /// (B, g, d(j), d(i)) softmaxed, transposed.
    attn_t: Tensor,
    params: Params,
    vec4: bool,
    dims: (usize, usize, usize),
}

/// Record the Gram partials, their reduction and the softmax of channel attention for `qk` (B, N, 2C)
/// (columns q | k, grouped as in [`channel_attention`]), the partials in `scratch` where it is big
/// enough (it must not overlap `qk`; it may share its buffer). Same values as [`channel_attention`]
/// on the qkv those columns come from.
pub fn channel_attention_logits(
    rec: &mut Recorder,
    qk: &Tensor,
    groups: usize,
    scratch: Option<&Tensor>,
) -> Result<ChannelLogits> {
    const OP: &str = "channel_attention";
    check::f32(OP, "qk", qk)?;
    if qk.rank() != 3 || !qk.dim(2).is_multiple_of(2) {
        return Err(Error::shape(
            OP,
            format!("qk {:?} must be (B, N, 2C)", qk.shape()),
        ));
    }
    if let Some(t) = scratch {
        disjoint(OP, ("qk", qk), ("scratch", t))?;
    }
    logits_impl(rec, qk, qk.dim(2) / 2, groups, scratch)
}

impl ChannelLogits {
    /// out (B, N, C) = the attention applied to `v` (B, N, C). `out` must not share `v`'s buffer.
    pub fn apply(&self, rec: &mut Recorder, v: &Tensor, out: &Tensor) -> Result<()> {
        let (b, n, c) = self.dims;
        if v.shape() != [b, n, c] {
            return Err(Error::shape(
                "channel_attention",
                format!("v {:?} must be {:?}", v.shape(), [b, n, c]),
            ));
        }
        check::f32("channel_attention", "v", v)?;
        check::distinct("channel_attention", ("v", v), ("out", out))?;
        self.apply_impl(rec, v, c, 0, out)
    }

    fn apply_impl(
        &self,
        rec: &mut Recorder,
        v: &Tensor,
        v_stride: usize,
        v_off: usize,
        out: &Tensor,
    ) -> Result<()> {
        const OP: &str = "channel_attention";
        check::f32(OP, "out", out)?;
        let (b, n, c) = self.dims;
        if out.shape() != [b, n, c] {
            return Err(Error::shape(
                OP,
                format!("out {:?} must be {:?}", out.shape(), [b, n, c]),
            ));
        }
        if b == 0 || n == 0 {
            return Ok(());
        }
        match rec.backend()? {
            Backend::Host => rec.host_op("channel_attention", &[v], || {
                self.host_apply(v, (v_stride, v_off), out)
            }),
            Backend::Wgpu(_) => {
                let (entry, total) = if self.vec4 {
                    ("attn_apply4", b * n * c / 4)
                } else {
                    ("attn_apply", b * n * c)
                };
                let mut params = self.params;
                params.total = total as u32;
                params.v_stride = v_stride as u32;
                params.v_off = v_off as u32;
                rec.launch(
                    &Kernel::new(&SHADER, entry),
                    &params,
                    &[v, &self.attn_t, out],
                    grid_1d(ceil_div(total, WG as usize)),
                )
            }
        }
    }
}

/// The CPU backend's side (see [`crate::ops::host`]).
impl ChannelLogits {
    /// `attn_t` from q | k in the first 2C columns of `src`'s rows.
    fn host_logits(&self, src: &Tensor, groups: usize) -> Result<()> {
        let (b, n, c) = self.dims;
        let stride = src.dim(2);
        with_host(&self.attn_t, &[src], |o, i| {
            let l = cpu_logits(host::f32_in(src, i[0])?, stride, (b, n, c), groups)?;
            host::f32_out(&self.attn_t, o)?.copy_from_slice(&l.attn_t);
            Ok(())
        })
    }

    /// out (B, N, C) = the attention applied to v at column `v_off` of rows of `v_stride`.
    fn host_apply(
        &self,
        v: &Tensor,
        (v_stride, v_off): (usize, usize),
        out: &Tensor,
    ) -> Result<()> {
        let (b, n, _) = self.dims;
        let (groups, d) = (self.params.g as usize, self.params.d as usize);
        with_host(out, &[v, &self.attn_t], |o, i| {
            let l = CpuLogits {
                attn_t: host::f32_in(&self.attn_t, i[1])?.to_vec(),
                b,
                groups,
                d,
            };
            l.apply(
                host::f32_in(v, i[0])?,
                (v_stride, v_off),
                n,
                host::f32_out(out, o)?,
            )
        })
    }
}

/// Refuse two tensors whose byte ranges overlap in one buffer.
fn disjoint(op: &'static str, a: (&str, &Tensor), b: (&str, &Tensor)) -> Result<()> {
    let (x, y) = (a.1, b.1);
    let overlap = x.same_buffer(y)
        && x.offset() < y.offset() + y.byte_size()
        && y.offset() < x.offset() + x.byte_size();
    if overlap {
        return Err(Error::shape(
            op,
            format!("{} and {} must not overlap", a.0, b.0),
        ));
    }
    Ok(())
}

/// GPU bytes one channel-attention call allocates for itself while it is recorded, besides its Gram
/// partials (which the caller's scratch may hold): the transposed attention `attn_t` and, on a GPU,
/// the reduction's `scratch`, each (B, groups, d, d) f32 ([`logits_impl`]).
pub fn logits_scratch_bytes(b: usize, groups: usize, d: usize, host: bool) -> Result<u64> {
    let one = DType::F32.buffer_bytes(&[b.max(1), groups, d, d])?;
    Ok(if host { one } else { 2 * one })
}

/// Gram partials, reduction and softmax for q | k in the first 2C columns of `src`'s rows.
fn logits_impl(
    rec: &mut Recorder,
    src: &Tensor,
    c: usize,
    groups: usize,
    scratch: Option<&Tensor>,
) -> Result<ChannelLogits> {
    const OP: &str = "channel_attention";
    let (b, n, stride) = (src.dim(0), src.dim(1), src.dim(2));
    if groups == 0 || c == 0 || !c.is_multiple_of(groups) {
        return Err(Error::shape(
            OP,
            format!("{c} channels do not split into {groups} groups"),
        ));
    }
    let d = c / groups;
    let nsplit = n.div_ceil(CHUNK);
    let tiles = d.div_ceil(TILE);
    if b * groups > MAX_GRID_DIM as usize
        || nsplit > MAX_GRID_DIM as usize
        || tiles * tiles > MAX_GRID_DIM as usize
    {
        return Err(Error::shape(
            OP,
            format!(
                "batch {b} x groups {groups}, {n} tokens or {d} channels per group is too large"
            ),
        ));
    }
    check::u32_of(OP, "qkv elements", src.numel())?;
    let gpu = rec.gpu().clone();
    let attn_t = Tensor::zeros(
        &gpu,
        &[b.max(1), groups, d, d],
        DType::F32,
        "channel_attn.attn_t",
    )?;
    // vec4 kernels when every group starts on a 4-float boundary and spans whole vec4s.
    let vec4 = c.is_multiple_of(4) && d.is_multiple_of(4);
    let params = Params {
        n: n as u32,
        c: c as u32,
        d: d as u32,
        g: groups as u32,
        chunk: CHUNK as u32,
        nsplit: nsplit as u32,
        tiles_j: tiles as u32,
        total: 0,
        scale: (n as f64).powf(-0.5) as f32,
        qk_stride: stride as u32,
        v_stride: 0,
        v_off: 0,
    };
    let out = ChannelLogits {
        attn_t,
        params,
        vec4,
        dims: (b, n, c),
    };
    if b == 0 || n == 0 {
        return Ok(out);
    }
    match rec.backend()? {
        Backend::Host => {
            rec.host_op("channel_logits", &[src], || out.host_logits(src, groups))?;
            Ok(out)
        }
        Backend::Wgpu(_) => {
            record_logits(rec, src, &out, scratch)?;
            Ok(out)
        }
    }
}

/// Record the two logits passes into `out.attn_t`: per-split Gram partials of q and k (into `scratch`
/// when it is large enough), then their sum's row softmax, transposed.
fn record_logits(
    rec: &mut Recorder,
    src: &Tensor,
    out: &ChannelLogits,
    scratch: Option<&Tensor>,
) -> Result<()> {
    let gpu = rec.gpu().clone();
    let mut params = out.params;
    let (b, groups, d) = (out.dims.0, params.g as usize, params.d as usize);
    let (nsplit, tiles, vec4) = (params.nsplit as usize, params.tiles_j as usize, out.vec4);
    let part_shape = [b, nsplit, groups, d, d];
    let part = match scratch {
        Some(t) if t.byte_size() >= (part_shape.iter().product::<usize>() * 4) as u64 => {
            t.view_at(t.offset(), &part_shape, DType::F32)?
        }
        _ => Tensor::zeros(&gpu, &part_shape, DType::F32, "channel_attn.partials")?,
    };
    let attn = Tensor::zeros(&gpu, &[b, groups, d, d], DType::F32, "channel_attn.scratch")?;
    rec.launch(
        &Kernel::new(
            &SHADER,
            if vec4 {
                "gram_partial4"
            } else {
                "gram_partial"
            },
        ),
        &params,
        &[src, &part],
        [(tiles * tiles) as u32, (b * groups) as u32, nsplit as u32],
    )?;
    let rows = b * groups * d;
    params.total = rows as u32;
    rec.launch(
        &Kernel::new(&SHADER, "softmax_rows"),
        &params,
        &[&part, &attn, &out.attn_t],
        grid_1d(ceil_div(rows, WG as usize)),
    )?;
    Ok(())
}
