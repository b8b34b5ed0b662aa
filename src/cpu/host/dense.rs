//! Host twins of the transformer launchers: linear, attention, the decode step's KV-cache write and
//! position add, the f16 cast, the embedding.

use crate::cpu;
use crate::cpu::attention::{AttnOpts as CpuAttnOpts, KvMut};
use crate::cpu::host::{f32_in, f32_out, kv_in, step_value, u32_in, weight_in};
use crate::cpu::linear::LinearRef;
use crate::error::{Error, Result};
use crate::gpu::host::{f16s_mut, with_host, HostAccess};
use crate::gpu::{DType, Tensor};
use crate::opdef::attention::AttnOpts;
use crate::opdef::check;
use crate::opdef::linear::LinearArgs;

/// [`crate::ops::matmul::linear`] on the host.
pub fn linear(x: &Tensor, w: &Tensor, args: &LinearArgs, out: &Tensor) -> Result<()> {
    const OP: &str = "linear";
    let (_, n, k) = crate::opdef::linear::linear_shapes(x, w, out)?;
    if let Some(b) = args.bias {
        check::f32(OP, "bias", b)?;
        check::shape(OP, "bias", b, &[n])?;
    }
    if let Some(r) = args.residual {
        check::f32(OP, "residual", r)?;
        check::shape(OP, "residual", r, out.shape())?;
    }
    let mut ins = vec![x, w];
    ins.extend(args.bias);
    ins.extend(args.residual);
    with_host(out, &ins, |o, i| {
        let bias = match args.bias {
            Some(b) => Some(f32_in(b, i[2])?),
            None => None,
        };
        let residual = match args.residual {
            Some(r) => Some(f32_in(r, i[i.len() - 1])?),
            None => None,
        };
        let l = LinearRef {
            w: weight_in(w, i[1])?,
            n,
            k,
            bias,
        };
        let (x, out) = (f32_in(x, i[0])?, f32_out(out, o)?);
        let dot = cpu::qdot_int8::quant_dot();
        cpu::linear_rows(&l, x, args.act, residual, out, (args.per_row, dot))
    })
}

/// [`crate::ops::attention::attention`] on the host (operands checked by the launcher).
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, opts: &AttnOpts, out: &Tensor) -> Result<()> {
    let (b, tq, c, tk) = (q.dim(0), q.dim(1), q.dim(2), k.dim(1));
    let (kv_len, q_offset) = match opts.dyn_len {
        Some(t) => (step_value(t, 0)?.min(tk), step_value(t, 1)?),
        None => (
            opts.kv_len.map(|l| l as usize).unwrap_or(tk),
            opts.q_offset as usize,
        ),
    };
    let mut ins = vec![q, k, v];
    ins.extend(opts.mask);
    with_host(out, &ins, |o, i| {
        let mask = match opts.mask {
            Some(m) => Some(f32_in(m, i[3])?),
            None => None,
        };
        let cpu_opts = CpuAttnOpts {
            heads: opts.heads,
            scale: opts.scale,
            causal: opts.causal,
            kv_len: Some(kv_len),
            q_offset,
            mask,
        };
        cpu::attention::attention(
            f32_in(q, i[0])?,
            kv_in(k, i[1])?,
            kv_in(v, i[2])?,
            (b, tq, tk, c),
            &cpu_opts,
            f32_out(out, o)?,
        )
    })
}

/// [`crate::ops::decode_step::kv_write`] on the host: row `step[at]` of both caches.
pub fn kv_write(
    [kn, vn]: [&Tensor; 2],
    [ck, cv]: [&Tensor; 2],
    (step, at): (&Tensor, usize),
) -> Result<()> {
    let pos = step_value(step, at)?;
    let dims = (ck.dim(0), ck.dim(1), ck.dim(2));
    let mut acc = HostAccess::new(&[ck, cv], &[kn, vn])?;
    let (outs, ins) = acc.split()?;
    for ((cache, t), rows) in outs
        .into_iter()
        .zip([ck, cv])
        .zip([(kn, ins[0]), (vn, ins[1])])
    {
        let n = t.numel();
        let cache = match t.dtype() {
            DType::F16 => KvMut::F16(
                f16s_mut(cache)
                    .get_mut(..n)
                    .ok_or_else(|| Error::shape("kv_write", "cache outside its buffer"))?,
            ),
            _ => KvMut::F32(f32_out(t, cache)?),
        };
        cpu::attention::kv_write(cache, dims, pos, f32_in(rows.0, rows.1)?)?;
    }
    Ok(())
}

/// [`crate::ops::decode_step::pos_add`] on the host: x[r, :] += table[step[at], :] (a row past the
/// table adds nothing).
pub fn pos_add(x: &Tensor, table: &Tensor, step: &Tensor, at: usize) -> Result<()> {
    let pos = step_value(step, at)?;
    let d = x.dim(1);
    if pos >= table.dim(0) {
        return Ok(());
    }
    with_host(x, &[table], |o, i| {
        let row = &f32_in(table, i[0])?[pos * d..(pos + 1) * d];
        cpu::elementwise::add_row(f32_out(x, o)?, row)
    })
}

/// [`crate::ops::cast::f32_to_f16`] on the host.
pub fn f32_to_f16(x: &Tensor, out: &Tensor) -> Result<()> {
    let n = out.numel();
    with_host(out, &[x], |o, i| {
        let h = f16s_mut(o)
            .get_mut(..n)
            .ok_or_else(|| Error::shape("f32_to_f16", "out outside its buffer"))?;
        cpu::attention::f32_to_f16(f32_in(x, i[0])?, h)
    })
}

/// [`crate::ops::embedding::embedding`] on the host (ids past the table give zero rows).
pub fn embedding(ids: &Tensor, table: &Tensor, out: &Tensor) -> Result<()> {
    let (v, c) = (table.dim(0), table.dim(1));
    with_host(out, &[ids, table], |o, i| {
        cpu::embedding::embedding(
            u32_in(ids, i[0])?,
            weight_in(table, i[1])?,
            (v, c),
            f32_out(out, o)?,
        )
    })
}
