//! Element-wise ops (`shaders/elementwise.wgsl`): `add`, `scale`, `add_row` (broadcast bias) and
//! `add_rows_at` (learned positional rows). Every op accepts `out` sharing its buffer with `x` (in-place);
//! the launcher then picks the shader's INPLACE variant, since WebGPU forbids binding one buffer both
//! read-only and writable in one dispatch. When the element count (and C for the row ops) is a multiple
//! of 4, the VEC4 variant runs instead (5-10x faster on lavapipe).

use crate::cpu::host;
use crate::error::{Error, Result};
use crate::gpu::Backend;
use crate::gpu::{ceil_div, grid_1d, shader, uniform, Kernel, Recorder, Tensor};
use crate::opdef::check;

shader!(pub static SHADER = "elementwise", [("WG", WG)]);

const WG: u32 = 256;

uniform! {
    struct Params: PARAMS_LAYOUT = "elementwise" / Params {
        n: u32, scale: f32, c: u32, start: u32
    }
}

/// Record `entry` over `params.n` elements: the VEC4 variant when `vec4`, the INPLACE one when `inplace`
/// (then `tensors[0]` is both input and output).
fn launch(
    rec: &mut Recorder,
    entry: &'static str,
    (vec4, inplace): (bool, bool),
    params: Params,
    tensors: &[&Tensor],
) -> Result<()> {
    let items = if vec4 {
        params.n as usize / 4
    } else {
        params.n as usize
    };
    let defines: &[&str] = match (vec4, inplace) {
        (true, true) => &["VEC4", "INPLACE"],
        (true, false) => &["VEC4"],
        (false, true) => &["INPLACE"],
        (false, false) => &[],
    };
    rec.launch(
        &Kernel::new(&SHADER, entry).defines(defines),
        &params,
        tensors,
        grid_1d(ceil_div(items, WG as usize)),
    )
}

fn params(op: &'static str, n: usize) -> Result<Params> {
    Ok(Params {
        n: check::u32_of(op, "element count", n)?,
        scale: 1.0,
        c: 1,
        start: 0,
    })
}

/// out = a + b (same shapes). `out` may share a buffer with `a` and/or `b`.
pub fn add(rec: &mut Recorder, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
    for (n, t) in [("a", a), ("b", b), ("out", out)] {
        check::f32("add", n, t)?;
    }
    if a.shape() != b.shape() || a.shape() != out.shape() {
        return Err(Error::shape(
            "add",
            format!(
                "shapes {:?} + {:?} -> {:?}",
                a.shape(),
                b.shape(),
                out.shape()
            ),
        ));
    }
    match rec.backend()? {
        Backend::Host => rec.host_op("add", &[a], || host::rows::add(a, b, out)),
        Backend::Wgpu(_) => {
            let p = params("add", a.numel())?;
            let v4 = p.n % 4 == 0;
            let (sa, sb) = (check::same_buffer(a, out), check::same_buffer(b, out));
            match (sa, sb) {
                (false, false) => launch(rec, "add", (v4, false), p, &[a, b, out]),
                (true, false) => launch(rec, "add", (v4, true), p, &[out, b]),
                (false, true) => launch(rec, "add", (v4, true), p, &[out, a]),
                // out = out + out
                (true, true) => {
                    launch(rec, "scale", (v4, true), Params { scale: 2.0, ..p }, &[out])
                }
            }
        }
    }
}

/// out = x * s (same shapes; `out` may be `x`).
pub fn scale(rec: &mut Recorder, x: &Tensor, s: f32, out: &Tensor) -> Result<()> {
    check::f32("scale", "x", x)?;
    check::f32("scale", "out", out)?;
    check::shape("scale", "out", out, x.shape())?;
    match rec.backend()? {
        Backend::Host => rec.host_op("scale", &[x], || host::rows::scale(x, s, out)),
        Backend::Wgpu(_) => {
            let p = Params {
                scale: s,
                ..params("scale", x.numel())?
            };
            let v4 = p.n.is_multiple_of(4);
            if check::same_buffer(x, out) {
                launch(rec, "scale", (v4, true), p, &[out])
            } else {
                launch(rec, "scale", (v4, false), p, &[x, out])
            }
        }
    }
}

/// out[r, :] = x[r, :] + row for x, out (R, C) and row (C) (any leading dims of x are flattened into R).
/// `out` may be `x`.
pub fn add_row(rec: &mut Recorder, x: &Tensor, row: &Tensor, out: &Tensor) -> Result<()> {
    const OP: &str = "add_row";
    for (n, t) in [("x", x), ("row", row), ("out", out)] {
        check::f32(OP, n, t)?;
    }
    check::shape(OP, "out", out, x.shape())?;
    let c = x.dim(-1);
    if x.rank() == 0 || c == 0 || row.shape() != [c] {
        return Err(Error::shape(
            OP,
            format!(
                "x {:?} + row {:?}: row must be (C) = last dim of x",
                x.shape(),
                row.shape()
            ),
        ));
    }
    check::distinct(OP, ("row", row), ("out", out))?;
    match rec.backend()? {
        Backend::Host => rec.host_op("add_row", &[x], || host::rows::add_row(x, row, out)),
        Backend::Wgpu(_) => {
            let p = Params {
                c: check::u32_of(OP, "C", c)?,
                ..params(OP, x.numel())?
            };
            let v4 = c.is_multiple_of(4);
            if check::same_buffer(x, out) {
                launch(rec, "add_row", (v4, true), p, &[out, row])
            } else {
                launch(rec, "add_row", (v4, false), p, &[x, row, out])
            }
        }
    }
}

/// out[t, :] = x[t, :] + table[start + t, :] for x, out (T, C) and table (P, C) with start + T <= P.
/// `out` may be `x`.
pub fn add_rows_at(
    rec: &mut Recorder,
    x: &Tensor,
    table: &Tensor,
    start: u32,
    out: &Tensor,
) -> Result<()> {
    const OP: &str = "add_rows_at";
    for (n, t) in [("x", x), ("table", table), ("out", out)] {
        check::f32(OP, n, t)?;
    }
    let xs = check::rank(OP, "x", x, 2)?;
    let ts = check::rank(OP, "table", table, 2)?;
    check::shape(OP, "out", out, xs)?;
    let (t, c) = (xs[0], xs[1]);
    if ts[1] != c || start as usize + t > ts[0] {
        return Err(Error::shape(
            OP,
            format!(
                "x {xs:?} + table {ts:?} rows {start}..{}: needs table (>= start + T, C)",
                start as usize + t
            ),
        ));
    }
    check::distinct(OP, ("table", table), ("out", out))?;
    match rec.backend()? {
        Backend::Host => rec.host_op("add_rows_at", &[x], || {
            host::rows::add_rows_at(x, table, start as usize, out)
        }),
        Backend::Wgpu(_) => {
            let p = Params {
                c: check::u32_of(OP, "C", c)?,
                start,
                ..params(OP, x.numel())?
            };
            // start * C + T * C <= P * C must be indexable in u32.
            check::u32_of(OP, "table elements", table.numel())?;
            let v4 = c % 4 == 0;
            if check::same_buffer(x, out) {
                launch(rec, "add_rows_at", (v4, true), p, &[out, table])
            } else {
                launch(rec, "add_rows_at", (v4, false), p, &[x, table, out])
            }
        }
    }
}
