// Numerically stable softmax / log-softmax over the last dimension of (R, C), any C (the vocabulary,
// 51328, included):
//   m = max_j x[j];  s = sum_j exp(x[j] - m)
//   softmax:      out[j] = exp(x[j] - m) / s
//   log_softmax:  out[j] = (x[j] - m) - log(s)   (x - m first: exact for x near m, so a row offset
//                 of 1000 costs no precision)
//
// One workgroup per row (grid folded by `grid_1d`); each invocation strides over the row and the
// partial max / sum are combined by tree reductions in workgroup memory. Three passes over the row
// (max, sum, write): each element is read and written by the same invocation, so the `_inplace`
// entries (x == out) are race-free.
//
// Masking: use a large negative finite value (f32::MIN or -1e30), not -inf: WGSL implementations may
// assume no infinities. A row whose entries are all equal gives the uniform distribution.

override WG: u32 = 256; // power of two, <= 256 (the size of `red`)

struct Params {
    rows: u32, // R
    c: u32,    // C
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;         // (R, C)
@group(0) @binding(2) var<storage, read_write> out: array<f32>; // (R, C)

// `_inplace` entries: x and out are one buffer
@group(0) @binding(1) var<storage, read_write> io: array<f32>;  // (R, C)

var<workgroup> red: array<f32, 256>;

fn reduce_max(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn reduce_sum(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            red[lid] = red[lid] + red[lid + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

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
    let inv = 1.0 / reduce_sum(lid, s);
    for (var j = lid; j < p.c; j += WG) {
        out[base + j] = exp(x[base + j] - m) * inv;
    }
}

@compute @workgroup_size(WG)
fn softmax_inplace(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.c;
    var m = LOWEST;
    for (var j = lid; j < p.c; j += WG) {
        m = max(m, io[base + j]);
    }
    m = reduce_max(lid, m);
    var s = 0.0;
    for (var j = lid; j < p.c; j += WG) {
        s += exp(io[base + j] - m);
    }
    let inv = 1.0 / reduce_sum(lid, s);
    for (var j = lid; j < p.c; j += WG) {
        io[base + j] = exp(io[base + j] - m) * inv;
    }
}

@compute @workgroup_size(WG)
fn log_softmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
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
    let ls = log(reduce_sum(lid, s));
    for (var j = lid; j < p.c; j += WG) {
        out[base + j] = (x[base + j] - m) - ls;
    }
}

@compute @workgroup_size(WG)
fn log_softmax_inplace(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.c;
    var m = LOWEST;
    for (var j = lid; j < p.c; j += WG) {
        m = max(m, io[base + j]);
    }
    m = reduce_max(lid, m);
    var s = 0.0;
    for (var j = lid; j < p.c; j += WG) {
        s += exp(io[base + j] - m);
    }
    let ls = log(reduce_sum(lid, s));
    for (var j = lid; j < p.c; j += WG) {
        io[base + j] = (io[base + j] - m) - ls;
    }
}
