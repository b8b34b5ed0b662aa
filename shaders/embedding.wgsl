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

override WG: u32 = 256;

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
