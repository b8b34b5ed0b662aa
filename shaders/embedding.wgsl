// Embedding gather: out[t, :] = table[ids[t], :]; ids outside [0, V) give a zero row.
//
// The table (V, C) may be larger than one storage binding (Florence-2's shared embedding is
// 51328 x 768 f32 = 157.7 MB, over the 128 MiB binding limit of lavapipe and many browsers). The host
// splits it into row chunks (`Tensor::row_chunks`) and dispatches this kernel once per chunk with that
// chunk bound at an aligned offset; each dispatch writes only the output rows whose id falls in its row
// range [row_start, row_start + rows), so the chunks together write every valid row exactly once and no
// dispatch ever reads outside its binding. The first dispatch (`zero_oob` = 1) also writes the zero rows
// for out-of-range ids.
//
// One invocation per output element (t, c), grid folded by `grid_1d`. Variant VEC4 (C % 4 == 0, chosen by
// the launcher; src/gpu/preprocess.rs): one invocation per 4 columns, 16-byte accesses.

// WG, the workgroup size: from the launcher (src/ops/embedding.rs, SHADER's consts).

struct Params {
    n: u32,         // T * C
    c: u32,         // C
    row_start: u32, // first table row in the bound chunk
    rows: u32,      // table rows in the bound chunk
    v: u32,         // V, rows in the whole table
    zero_oob: u32,  // 1: this dispatch also zeroes rows of ids >= V
    _pad0: u32,
    _pad1: u32,
}

#include lanes

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;       // (T)
@group(0) @binding(2) var<storage, read> table: array<F>;       // (rows, C): table rows row_start..row_start+rows
@group(0) @binding(3) var<storage, read_write> out: array<F>;   // (T, C)

@compute @workgroup_size(WG)
fn embedding(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * WG + lid;
    if (i >= p.n / LANES) {
        return;
    }
    let c = p.c / LANES;
    let t = i / c;
    let col = i - t * c;
    let id = ids[t];
    if (id >= p.row_start && id - p.row_start < p.rows) {
        out[i] = table[(id - p.row_start) * c + col];
    } else if (p.zero_oob == 1u && id >= p.v) {
        out[i] = F(0.0);
    }
}

// Packed-weight variant (table in f16 pairs, or q8/q4 rows as in `src/gpu/quant.rs`), one invocation per
// output element. W_FMT: 16 = f16, 8 = q8, 4 = q4. `row_words` is the u32 words per table row (C/2 for
// f16 with C even, the quantized row bytes / 4 for q8/q4); the launcher binds whole rows.
override W_FMT: u32 = 16u;
override ROW_WORDS: u32 = 1u;
@group(0) @binding(2) var<storage, read> table_w: array<u32>; // (rows, ROW_WORDS) u32 words
@group(0) @binding(3) var<storage, read_write> out_p: array<f32>; // (T, C), whatever the VEC4 flag

fn packed_at(row: u32, col: u32) -> f32 {
    let base = row * ROW_WORDS;
    if (W_FMT == 16u) {
        return unpack2x16float(table_w[base + col / 2u])[col % 2u];
    }
    let qwords = p.c * W_FMT / 32u; // quant words per row
    let blk = col / 32u;
    let d = unpack2x16float(table_w[base + qwords + blk / 2u])[blk % 2u];
    if (W_FMT == 8u) {
        let byte = (table_w[base + col / 4u] >> (8u * (col % 4u))) & 255u;
        return d * f32(bitcast<i32>(byte << 24u) >> 24u);
    }
    let nib = (table_w[base + col / 8u] >> (4u * (col % 8u))) & 15u;
    return d * (f32(nib) - 8.0);
}

@compute @workgroup_size(WG)
fn embedding_packed(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * WG + lid;
    if (i >= p.n) {
        return;
    }
    let t = i / p.c;
    let col = i - t * p.c;
    let id = ids[t];
    if (id >= p.row_start && id - p.row_start < p.rows) {
        out_p[i] = packed_at(id - p.row_start, col);
    } else if (p.zero_oob == 1u && id >= p.v) {
        out_p[i] = 0.0;
    }
}
