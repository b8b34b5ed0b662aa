//! DaViT channel attention core (`shaders/channel_attn.wgsl`): grouped attention across channels, with
//! the token count N as the reduction axis of the (d x d) logits and N^-0.5 as the scale.

use crate::error::{Error, Result};
use crate::gpu::{ceil_div, grid_1d, DType, Kernel, Recorder, Shader, Tensor, MAX_GRID_DIM};
use crate::ops::check;

pub static SHADER: Shader = Shader {
    name: "channel_attn",
    source: include_str!("../../shaders/channel_attn.wgsl"),
};

const WG: u32 = 256;
/// Tokens summed by one `gram_partial` workgroup. 256 keeps stage 0 of a 768 image (36864 tokens) at
/// 144 splits x groups workgroups: enough parallelism, and the partial buffer stays small.
const CHUNK: usize = 256;
/// (i, j) tile edge of one `gram_partial` workgroup (8x8 invocations x 4x4 outputs).
const TILE: usize = 32;

/// Mirrors `Params` in `shaders/channel_attn.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    c: u32,
    d: u32,
    g: u32,
    chunk: u32,
    nsplit: u32,
    tiles_j: u32,
    total: u32,
    scale: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
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
    check::f32(OP, "out", out)?;
    if qkv.rank() != 3 || out.rank() != 3 {
        return Err(Error::shape(
            OP,
            format!(
                "qkv {:?} must be (B, N, 3C), out {:?} (B, N, C)",
                qkv.shape(),
                out.shape()
            ),
        ));
    }
    let (b, n, c3) = (qkv.dim(0), qkv.dim(1), qkv.dim(2));
    let c = c3 / 3;
    if c3 % 3 != 0 || out.shape() != [b, n, c] {
        return Err(Error::shape(
            OP,
            format!("qkv {:?} and out {:?} disagree", qkv.shape(), out.shape()),
        ));
    }
    if groups == 0 || c == 0 || c % groups != 0 {
        return Err(Error::shape(
            OP,
            format!("{c} channels do not split into {groups} groups"),
        ));
    }
    if b == 0 || n == 0 {
        return Ok(());
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
    check::u32_of(OP, "qkv elements", qkv.numel())?;
    let gpu = rec.gpu().clone();
    let part_shape = [b, nsplit, groups, d, d];
    let part = match scratch {
        Some(t) if t.capacity() >= (part_shape.iter().product::<usize>() * 4) as u64 => {
            t.view(&part_shape, DType::F32)?
        }
        _ => Tensor::zeros(&gpu, &part_shape, DType::F32, "channel_attn.partials")?,
    };
    let attn = Tensor::zeros(&gpu, &[b, groups, d, d], DType::F32, "channel_attn.scratch")?;
    let attn_t = Tensor::zeros(&gpu, &[b, groups, d, d], DType::F32, "channel_attn.attn_t")?;
    // vec4 kernels when every group starts on a 4-float boundary and spans whole vec4s.
    let vec4 = c.is_multiple_of(4) && d.is_multiple_of(4);
    let mut params = Params {
        n: n as u32,
        c: c as u32,
        d: d as u32,
        g: groups as u32,
        chunk: CHUNK as u32,
        nsplit: nsplit as u32,
        tiles_j: tiles as u32,
        total: 0,
        scale: (n as f64).powf(-0.5) as f32,
        _pad0: 0,
        _pad1: 0,
        _pad2: 0,
    };
    rec.dispatch(
        &Kernel::new(
            &SHADER,
            if vec4 {
                "gram_partial4"
            } else {
                "gram_partial"
            },
        ),
        &params,
        &[qkv.binding(&gpu)?, part.binding(&gpu)?],
        [(tiles * tiles) as u32, (b * groups) as u32, nsplit as u32],
    )?;
    let rows = b * groups * d;
    params.total = rows as u32;
    rec.dispatch(
        &Kernel::new(&SHADER, "softmax_rows").with(&[("WG", WG as f64)]),
        &params,
        &[
            part.binding(&gpu)?,
            attn.binding(&gpu)?,
            attn_t.binding(&gpu)?,
        ],
        grid_1d(ceil_div(rows, WG as usize)),
    )?;
    let (entry, total) = if vec4 {
        ("attn_apply4", b * n * c / 4)
    } else {
        ("attn_apply", b * n * c)
    };
    params.total = total as u32;
    rec.dispatch(
        &Kernel::new(&SHADER, entry).with(&[("WG", WG as f64)]),
        &params,
        &[
            qkv.binding(&gpu)?,
            attn_t.binding(&gpu)?,
            out.binding(&gpu)?,
        ],
        grid_1d(ceil_div(total, WG as usize)),
    )
}
