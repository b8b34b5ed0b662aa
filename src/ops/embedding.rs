//! Embedding gather (`shaders/embedding.wgsl`), for tables larger than one storage binding.

use crate::cpu::host;
use crate::error::{Error, Result};
use crate::gpu::Backend;
use crate::gpu::{ceil_div, grid_1d, shader, uniform, DType, Kernel, Recorder, Tensor};
use crate::opdef::check;

shader!(pub static SHADER = "embedding", [("WG", WG)]);

const WG: u32 = 256;

uniform! {
    struct Params: PARAMS_LAYOUT = "embedding" / Params {
        n: u32, c: u32, row_start: u32, rows: u32, v: u32, zero_oob: u32, _pad0: u32, _pad1: u32
    }
}

/// out[t, :] = table[ids[t], :] for ids U32 (T), table (V, C) f32, f16 (C even) or q8/q4 (C % 32 == 0,
/// dequantized on the fly), out f32 (T, C). Ids >= V give zero
/// rows (never an out-of-bounds read). The table may exceed the device's storage-binding limit: it is
/// bound in row chunks, one dispatch per chunk.
pub fn embedding(rec: &mut Recorder, ids: &Tensor, table: &Tensor, out: &Tensor) -> Result<()> {
    const OP: &str = "embedding";
    check::dtype(OP, "ids", ids, DType::U32)?;
    let fmt: u32 = match table.dtype() {
        DType::F32 => 0,
        DType::F16 => 16,
        DType::Q8 => 8,
        DType::Q4 => 4,
        DType::U32 => {
            return Err(Error::shape(
                OP,
                "table: expected f32, f16, q8 or q4, got U32",
            ))
        }
    };
    check::f32(OP, "out", out)?;
    let t = check::rank(OP, "ids", ids, 1)?[0];
    let ts = check::rank(OP, "table", table, 2)?;
    let (v, c) = (ts[0], ts[1]);
    if c == 0 {
        return Err(Error::shape(OP, format!("table {ts:?} has no columns")));
    }
    check::shape(OP, "out", out, &[t, c])?;
    check::distinct(OP, ("table", table), ("out", out))?;
    match rec.backend()? {
        Backend::Host => rec.host_op("embedding", &[out], || {
            host::dense::embedding(ids, table, out)
        }),
        Backend::Wgpu(_) => {
            let n = check::u32_of(OP, "T * C", t * c)?;
            let v32 = check::u32_of(OP, "V", v)?;
            check::u32_of(OP, "table elements", table.numel())?;
            let gpu = rec.gpu().clone();
            let chunks = table.row_chunks(&gpu, c)?;
            if fmt == 16 && c % 2 != 0 {
                return Err(Error::shape(
                    OP,
                    format!("f16 table rows of odd length {c}"),
                ));
            }
            let row_words = table.dtype().row_bytes(c) / 4;
            // f32 tables: the VEC4 variant when rows are whole vec4s (then every chunk's offset and size are
            // multiples of 16). Packed tables (f16, q8, q4) go through the unpacking entry, one invocation per
            // element.
            let vec4 = fmt == 0 && c.is_multiple_of(4);
            let items = if vec4 { n as usize / 4 } else { n as usize };
            let overrides = [("W_FMT", fmt as f64), ("ROW_WORDS", row_words as f64)];
            let kernel = if fmt != 0 {
                Kernel::new(&SHADER, "embedding_packed").with(&overrides)
            } else {
                Kernel::new(&SHADER, "embedding")
                    .defines(if vec4 { &["VEC4"] } else { &[] })
                    .with(&overrides[..1])
            };
            for (k, ch) in chunks.iter().enumerate() {
                let params = Params {
                    n,
                    c: c as u32,
                    row_start: ch.row_start as u32,
                    rows: ch.rows as u32,
                    v: v32,
                    zero_oob: u32::from(k == 0),
                    _pad0: 0,
                    _pad1: 0,
                };
                rec.dispatch(
                    &kernel,
                    &params,
                    &[
                        ids.binding(&gpu)?,
                        table.binding_range(ch.byte_offset, ch.byte_size)?,
                        out.binding(&gpu)?,
                    ],
                    grid_1d(ceil_div(items, WG as usize)),
                )?;
            }
            Ok(())
        }
    }
}
