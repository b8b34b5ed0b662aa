//! Data movement (`shaders/layout.wgsl`): `permute` (rank <= 4) and `split_qkv` (DaViT's fused qkv
//! output into separate q, k, v).

use crate::cpu::host;
use crate::error::{Error, Result};
use crate::gpu::Backend;
use crate::gpu::{ceil_div, grid_1d, shader, uniform, Kernel, Recorder, Tensor};
use crate::opdef::check;

shader!(pub static SHADER = "layout", [("WG", WG)]);

const WG: u32 = 256;

uniform! {
    struct Params: PARAMS_LAYOUT = "layout" / Params {
        n: u32, a: u32, b: u32, _pad: u32, out_dims: [u32; 4], in_strides: [u32; 4]
    }
}

impl Params {
    fn new(n: u32) -> Self {
        Params {
            n,
            a: 1,
            b: 1,
            _pad: 0,
            out_dims: [1; 4],
            in_strides: [0; 4],
        }
    }
}

/// Record `entry` (its VEC4 variant when `vec4`) over `items` invocations.
fn launch(
    rec: &mut Recorder,
    (entry, vec4): (&'static str, bool),
    items: usize,
    params: Params,
    tensors: &[&Tensor],
) -> Result<()> {
    rec.launch(
        &Kernel::new(&SHADER, entry).defines(if vec4 { &["VEC4"] } else { &[] }),
        &params,
        tensors,
        grid_1d(ceil_div(items, WG as usize)),
    )
}

/// out = x.permute(dims) (materialised, contiguous). `dims` is a permutation of 0..rank, rank <= 4;
/// out's shape must be `[x.shape[dims[0]], x.shape[dims[1]], ..]`. f32 or u32; `out` must not be `x`.
/// Example: mlx channels-last conv weights (O, kH, kW, I) -> (O, I, kH, kW) is `dims = [0, 3, 1, 2]`.
pub fn permute(rec: &mut Recorder, x: &Tensor, dims: &[usize], out: &Tensor) -> Result<()> {
    const OP: &str = "permute";
    check::word(OP, "x", x)?;
    if out.dtype() != x.dtype() {
        return Err(Error::shape(
            OP,
            format!("out dtype {:?} != x dtype {:?}", out.dtype(), x.dtype()),
        ));
    }
    let rank = x.rank();
    let mut seen = [false; 4];
    let mut valid = (1..=4).contains(&rank) && dims.len() == rank;
    for &d in dims {
        match seen.get_mut(d) {
            Some(s) if d < rank && !*s => *s = true,
            _ => valid = false,
        }
    }
    if !valid {
        return Err(Error::shape(
            OP,
            format!("dims {dims:?} is not a permutation of x's {rank} axes (rank 1..=4)"),
        ));
    }
    let xs = x.shape();
    let want: Vec<usize> = dims.iter().map(|&d| xs[d]).collect();
    check::shape(OP, "out", out, &want)?;
    check::distinct(OP, ("x", x), ("out", out))?;
    match rec.backend()? {
        Backend::Host => rec.host_op("permute", &[x], || host::vision::permute(x, dims, out)),
        Backend::Wgpu(_) => {
            let n = check::u32_of(OP, "elements", x.numel())?;
            // Row-major strides of x.
            let mut stride = vec![1usize; rank];
            for i in (0..rank.saturating_sub(1)).rev() {
                stride[i] = stride[i + 1] * xs[i + 1];
            }
            let mut p = Params::new(n);
            let pad = 4 - rank;
            for (i, &d) in dims.iter().enumerate() {
                p.out_dims[pad + i] = want[i].max(1) as u32;
                p.in_strides[pad + i] = check::u32_of(OP, "stride", stride[d])?;
            }
            launch(rec, ("permute", false), n as usize, p, &[x, out])
        }
    }
}

/// q, k, v = qkv[:, :C], qkv[:, C:2C], qkv[:, 2C:] for qkv (R, 3C) and q, k, v (R, C) (any leading dims
/// flattened into R, the same in all four).
pub fn split_qkv(
    rec: &mut Recorder,
    qkv: &Tensor,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
) -> Result<()> {
    const OP: &str = "split_qkv";
    for (n, t) in [("qkv", qkv), ("q", q), ("k", k), ("v", v)] {
        check::f32(OP, n, t)?;
    }
    let c3 = qkv.dim(-1);
    if qkv.rank() == 0 || c3 == 0 || !c3.is_multiple_of(3) {
        return Err(Error::shape(
            OP,
            format!("qkv {:?}: last dim must be 3C", qkv.shape()),
        ));
    }
    let mut want = qkv.shape().to_vec();
    if let Some(last) = want.last_mut() {
        *last = c3 / 3;
    }
    for (n, t) in [("q", q), ("k", k), ("v", v)] {
        check::shape(OP, n, t, &want)?;
        check::distinct(OP, ("qkv", qkv), (n, t))?;
    }
    check::distinct(OP, ("q", q), ("k", k))?;
    check::distinct(OP, ("q", q), ("v", v))?;
    check::distinct(OP, ("k", k), ("v", v))?;
    match rec.backend()? {
        Backend::Host => rec.host_op("split_qkv", &[qkv], || {
            host::vision::split_qkv(qkv, q, k, v)
        }),
        Backend::Wgpu(_) => {
            check::u32_of(OP, "qkv elements", qkv.numel())?;
            let mut p = Params::new(q.numel() as u32);
            p.a = (c3 / 3) as u32;
            if (c3 / 3).is_multiple_of(4) {
                launch(rec, ("split_qkv", true), q.numel() / 4, p, &[qkv, q, k, v])
            } else {
                launch(rec, ("split_qkv", false), q.numel(), p, &[qkv, q, k, v])
            }
        }
    }
}
