// The position-dependent parts of a decoder step, reading the position from the step buffer instead of a
// uniform: a decode step is recorded once per request (`gpu::Plan`) and replayed at every position, so
// the bind groups and params of its dispatches never change; only the small step buffer (U32, written per
// step with queue.write_buffer) does. Layout of the step buffer (see `DecoderState::write_step`):
// step[0] = kv_len (pos + 1), step[1] = q_offset (pos), step[2] = position-table row (pos + offset),
// step[3] = cache row written (pos).
//
// - `pos_add`: x[r, :] += table[step[2], :] for every batch row r (the learned position embedding; the
//   same single f32 add as the recorded path's copy + add_row, so the result is bit-identical).
// - `kv_write`: ck[r, step[3], :] = kn[r, :] and cv[r, step[3], :] = vn[r, :] (the self-attention cache
//   rows of this position; the recorded path copies them row by row). In the KV_F16 variant the caches
//   hold IEEE halves packed two per u32 (the decoder's caches when the weights are not fp32): each
//   invocation rounds a pair of channels with `pack2x16float` (the recorded path packs with the same
//   instruction, `ops::cast::f32_to_f16`, then copies bytes, so both paths store the same bits). D is even.
// One invocation per element of (B, D) (KV_F16: per pair of elements), grid folded by `grid_1d`. A row
// outside the table or the cache writes nothing (the host validates the position before writing the step
// buffer).

// WG, the workgroup size: from the launcher (src/ops/decode_step.rs, SHADER's consts).

struct Params {
    b: u32,       // batch rows B
    d: u32,       // row width D
    rows: u32,    // pos_add: table rows; kv_write: cache rows per batch row (max_len)
    at: u32,      // index of the step buffer element holding the row
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> step: array<u32>;  // (4), see above

fn flat(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.x + wid.y * nwg.x) * WG + lid;
}

#if KV_WRITE
@group(0) @binding(2) var<storage, read> kn: array<f32>;        // (B, D)
@group(0) @binding(3) var<storage, read> vn: array<f32>;        // (B, D)
#if KV_F16
@group(0) @binding(4) var<storage, read_write> ck: array<u32>;  // (B, max_len, D / 2) f16 pairs
@group(0) @binding(5) var<storage, read_write> cv: array<u32>;  // (B, max_len, D / 2) f16 pairs

@compute @workgroup_size(WG)
fn kv_write(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    let row = step[p.at];
    let half_d = p.d / 2u;
    if (i >= p.b * half_d || row >= p.rows) {
        return;
    }
    let r = i / half_d;
    let c = i % half_d;
    let src = r * p.d + 2u * c;
    let dst = (r * p.rows + row) * half_d + c;
    ck[dst] = pack2x16float(vec2<f32>(kn[src], kn[src + 1u]));
    cv[dst] = pack2x16float(vec2<f32>(vn[src], vn[src + 1u]));
}
#else
@group(0) @binding(4) var<storage, read_write> ck: array<f32>;  // (B, max_len, D)
@group(0) @binding(5) var<storage, read_write> cv: array<f32>;  // (B, max_len, D)

@compute @workgroup_size(WG)
fn kv_write(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    let row = step[p.at];
    if (i >= p.b * p.d || row >= p.rows) {
        return;
    }
    let r = i / p.d;
    let c = i % p.d;
    let dst = (r * p.rows + row) * p.d + c;
    ck[dst] = kn[i];
    cv[dst] = vn[i];
}
#endif
#else
@group(0) @binding(2) var<storage, read> table: array<f32>;    // (rows, D)
@group(0) @binding(3) var<storage, read_write> x: array<f32>;  // (B, D)

@compute @workgroup_size(WG)
fn pos_add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    let row = step[p.at];
    if (i >= p.b * p.d || row >= p.rows) {
        return;
    }
    x[i] = x[i] + table[row * p.d + i % p.d];
}
#endif
