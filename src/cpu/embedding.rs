//! Embedding gather ([`crate::ops::embedding`]): out[t, :] = table[ids[t], :] for a table (V, C) in any
//! resident format (q8/q4 rows dequantized as they are copied: `d * q`, exact), ids >= V giving zero
//! rows.

use crate::cpu::{check_len, Weight};
use crate::error::Result;

/// out (T, C) = rows `ids` (T) of `table` (V, C).
pub fn embedding(
    ids: &[u32],
    table: Weight,
    (v, c): (usize, usize),
    out: &mut [f32],
) -> Result<()> {
    const OP: &str = "cpu embedding";
    table.check(OP, v, c)?;
    check_len(OP, "out", out, ids.len() * c)?;
    for (&id, row) in ids.iter().zip(out.chunks_exact_mut(c.max(1))) {
        if (id as usize) < v {
            table.row_into(c, id as usize, row);
        } else {
            row.fill(0.0);
        }
    }
    Ok(())
}
