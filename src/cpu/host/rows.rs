//! Host twins of the row-wise launchers: layer norm, softmax, reductions, elementwise adds and scales.
//! The in-place CPU kernels run on `out` after `x` is copied into it (the launchers allow `out` = `x`).

use crate::cpu;
use crate::cpu::host::{f32_in, f32_out};
use crate::error::Result;
use crate::gpu::host::{with_host, HostAccess};
use crate::gpu::Tensor;

/// out = x, then `f` on out in place (with `extra` inputs).
fn in_place(
    x: &Tensor,
    extra: &[&Tensor],
    out: &Tensor,
    f: impl FnOnce(&mut [f32], &[&[u32]]) -> Result<()>,
) -> Result<()> {
    // `out` = `x` (same buffer, same bytes): the kernel runs on it as it is, with no copy of x.
    let aliased =
        x.same_buffer(out) && x.offset() == out.offset() && x.byte_size() == out.byte_size();
    if aliased {
        return with_host(out, extra, |o, i| f(f32_out(out, o)?, i));
    }
    let mut ins = vec![x];
    ins.extend_from_slice(extra);
    with_host(out, &ins, |o, i| {
        let o = f32_out(out, o)?;
        o.copy_from_slice(f32_in(x, i[0])?);
        f(o, &i[1..])
    })
}

/// [`crate::ops::norm::layer_norm`] on the host.
pub fn layer_norm(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
    with_host(out, &[x, gamma, beta], |o, i| {
        cpu::norm::layer_norm(
            f32_in(x, i[0])?,
            f32_in(gamma, i[1])?,
            f32_in(beta, i[2])?,
            eps,
            f32_out(out, o)?,
        )
    })
}

/// [`crate::ops::softmax::softmax_rows`] (`log` false) or `log_softmax_rows` on the host.
pub fn softmax_rows(x: &Tensor, out: &Tensor, log: bool) -> Result<()> {
    let c = x.dim(-1);
    in_place(x, &[], out, |o, _| {
        if log {
            cpu::softmax::log_softmax_rows(o, c)
        } else {
            cpu::softmax::softmax_rows(o, c)
        }
    })
}

/// [`crate::ops::reduce::argmax_rows`] on the host.
pub fn argmax_rows(x: &Tensor, out: &Tensor) -> Result<()> {
    let v = x.dim(-1);
    let n = out.numel();
    with_host(out, &[x], |o, i| {
        cpu::reduce::argmax_rows(f32_in(x, i[0])?, v, &mut o[..n])
    })
}

/// [`crate::ops::reduce::topk_rows`] on the host.
pub fn topk_rows(x: &Tensor, k: usize, vals: &Tensor, ids: &Tensor) -> Result<()> {
    let v = x.dim(-1);
    let n = ids.numel();
    let mut acc = HostAccess::new(&[vals, ids], &[x])?;
    let (mut outs, ins) = acc.split()?;
    let (vo, io) = outs.split_at_mut(1);
    cpu::reduce::topk_rows(
        f32_in(x, ins[0])?,
        v,
        k,
        f32_out(vals, vo[0])?,
        &mut io[0][..n],
    )
}

/// [`crate::ops::reduce::mean_rows`] on the host.
pub fn mean_rows(x: &Tensor, out: &Tensor) -> Result<()> {
    let dims = (x.dim(0), x.dim(1), x.dim(2));
    with_host(out, &[x], |o, i| {
        cpu::reduce::mean_rows(f32_in(x, i[0])?, dims, f32_out(out, o)?)
    })
}

/// [`crate::ops::elementwise::add`] on the host.
pub fn add(a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
    in_place(a, &[b], out, |o, i| {
        cpu::elementwise::add(o, f32_in(b, i[0])?)
    })
}

/// [`crate::ops::elementwise::scale`] on the host.
pub fn scale(x: &Tensor, s: f32, out: &Tensor) -> Result<()> {
    in_place(x, &[], out, |o, _| {
        cpu::elementwise::scale(o, s);
        Ok(())
    })
}

/// [`crate::ops::elementwise::add_row`] on the host.
pub fn add_row(x: &Tensor, row: &Tensor, out: &Tensor) -> Result<()> {
    in_place(x, &[row], out, |o, i| {
        cpu::elementwise::add_row(o, f32_in(row, i[0])?)
    })
}

/// [`crate::ops::elementwise::add_rows_at`] on the host.
pub fn add_rows_at(x: &Tensor, table: &Tensor, start: usize, out: &Tensor) -> Result<()> {
    let c = x.dim(-1);
    in_place(x, &[table], out, |o, i| {
        cpu::elementwise::add_rows_at(o, f32_in(table, i[0])?, c, start)
    })
}
