// Numerically stable softmax / log-softmax over the last dimension of (R, C), any C (the vocabulary,
// 51328, included):
//   m = max_j x[j];  s = sum_j exp(x[j] - m)
//   softmax:      out[j] = exp(x[j] - m) / s
//   log_softmax:  out[j] = (x[j] - m) - log(s)   (x - m first: exact for x near m, so a row offset
//                 of 1000 costs no precision)
//
// One workgroup per row (grid folded by `grid_1d`); each invocation strides over the row and the
// partial max / sum are combined by tree reductions in workgroup memory. Three passes over the row
// (max, sum, write): each element is read and written by the same invocation, so the in-place variant
// (x == out) is race-free.
//
// Variants (src/gpu/preprocess.rs): LOG computes log_softmax instead of softmax; INPLACE binds x and out
// as one read_write buffer (WebGPU forbids binding one buffer both read-only and writable).
//
// Masking: use a large negative finite value (f32::MIN or -1e30), not -inf: WGSL implementations may
// assume no infinities. A row whose entries are all equal gives the uniform distribution.

override WG: u32 = MAX_WG; // power of two <= MAX_WG (from the launcher: src/ops/softmax.rs): the workgroup size

struct Params {
    rows: u32, // R
    c: u32,    // C
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
#if INPLACE
@group(0) @binding(1) var<storage, read_write> x: array<f32>;   // (R, C), overwritten by the result
#else
@group(0) @binding(1) var<storage, read> x: array<f32>;         // (R, C)
@group(0) @binding(2) var<storage, read_write> out: array<f32>; // (R, C)
#endif

fn store(i: u32, v: f32) {
#if INPLACE
    x[i] = v;
#else
    out[i] = v;
#endif
}

#include row_reduce

const LOWEST: f32 = -0x1.fffffep+127f; // -f32::MAX (a decimal literal may round past it: Tint rejects that)

@compute @workgroup_size(WG)
fn softmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.c;
    var m = LOWEST;
    for (var j = lid; j < p.c; j += WG) {
        m = max(m, x[base + j]);
    }
    m = reduce_max(lid, m);
    var s = 0.0;
    for (var j = lid; j < p.c; j += WG) {
        s += exp(x[base + j] - m);
    }
#if LOG
    let ls = log(reduce_sum(lid, s));
    for (var j = lid; j < p.c; j += WG) {
        store(base + j, (x[base + j] - m) - ls);
    }
#else
    let inv = 1.0 / reduce_sum(lid, s);
    for (var j = lid; j < p.c; j += WG) {
        store(base + j, exp(x[base + j] - m) * inv);
    }
#endif
}
