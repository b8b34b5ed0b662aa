// LayerNorm over the last dimension: out[r, :] = (x[r, :] - mean) / sqrt(var + eps) * gamma + beta,
// with the biased variance, exactly as torch.nn.LayerNorm.
//
// One workgroup per row (the grid is folded by `grid_1d`, so the row index is rebuilt from wid.x and
// wid.y). Each invocation strides over the row; partial sums are combined by a tree reduction in
// workgroup memory. Two passes over the row (mean, then the sum of squared deviations) instead of the
// one-pass E[x^2] - E[x]^2, which cancels badly when |mean| >> std. A third pass normalises; each element
// is read and written by the same invocation, so `layer_norm_inplace` (x == out) is race-free.

override WG: u32 = 256; // power of two, <= 256 (the size of `red`)

struct Params {
    rows: u32, // R
    c: u32,    // C
    eps: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;         // (R, C)
@group(0) @binding(2) var<storage, read> gamma: array<f32>;     // (C)
@group(0) @binding(3) var<storage, read> beta: array<f32>;      // (C)
@group(0) @binding(4) var<storage, read_write> out: array<f32>; // (R, C)

// layer_norm_inplace: x and out are one buffer
@group(0) @binding(1) var<storage, read_write> io: array<f32>;  // (R, C)
@group(0) @binding(2) var<storage, read> gamma_i: array<f32>;   // (C)
@group(0) @binding(3) var<storage, read> beta_i: array<f32>;    // (C)

var<workgroup> red: array<f32, 256>;

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
    workgroupBarrier(); // `red` is reused by the next reduction
    return r;
}

@compute @workgroup_size(WG)
fn layer_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.c;
    var s = 0.0;
    for (var j = lid; j < p.c; j += WG) {
        s += x[base + j];
    }
    let mean = reduce_sum(lid, s) / f32(p.c);
    var q = 0.0;
    for (var j = lid; j < p.c; j += WG) {
        let d = x[base + j] - mean;
        q += d * d;
    }
    let inv = inverseSqrt(reduce_sum(lid, q) / f32(p.c) + p.eps);
    for (var j = lid; j < p.c; j += WG) {
        out[base + j] = (x[base + j] - mean) * inv * gamma[j] + beta[j];
    }
}

@compute @workgroup_size(WG)
fn layer_norm_inplace(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.c;
    var s = 0.0;
    for (var j = lid; j < p.c; j += WG) {
        s += io[base + j];
    }
    let mean = reduce_sum(lid, s) / f32(p.c);
    var q = 0.0;
    for (var j = lid; j < p.c; j += WG) {
        let d = io[base + j] - mean;
        q += d * d;
    }
    let inv = inverseSqrt(reduce_sum(lid, q) / f32(p.c) + p.eps);
    for (var j = lid; j < p.c; j += WG) {
        io[base + j] = (io[base + j] - mean) * inv * gamma_i[j] + beta_i[j];
    }
}

// Row-per-invocation variants: no workgroup memory, no barriers. On CPU adapters (lavapipe,
// SwiftShader) a workgroup barrier is a coroutine switch and dominates a per-row tree reduction, so
// one invocation walks its whole row. A long sequential f32 sum loses precision (~C * eps relative in
// the worst case), so: four interleaved partial sums (also four independent dependency chains), and
// the second pass accumulates d = x - m1 and d^2 around the first-pass mean m1, then corrects it:
// mean = m1 + sum(d) / C, var = sum(d^2) / C - (sum(d) / C)^2, where sum(d) / C is only m1's tiny
// rounding error, so the correction cannot cancel.

// (mean, 1/sqrt(var + eps)) of one row; one copy per buffer variable, since a function that touches
// both `x` and `io` would make every entry point calling it use both bindings.
fn stats_x(base: u32) -> vec2<f32> {
    let c = p.c;
    let c4 = c / 4u * 4u;
    var a = vec4<f32>(0.0);
    for (var j = 0u; j < c4; j += 4u) {
        a += vec4<f32>(x[base + j], x[base + j + 1u], x[base + j + 2u], x[base + j + 3u]);
    }
    var t = 0.0;
    for (var j = c4; j < c; j++) {
        t += x[base + j];
    }
    let m1 = ((a.x + a.y) + (a.z + a.w) + t) / f32(c);
    var d1 = vec4<f32>(0.0);
    var d2 = vec4<f32>(0.0);
    for (var j = 0u; j < c4; j += 4u) {
        let v = vec4<f32>(x[base + j], x[base + j + 1u], x[base + j + 2u], x[base + j + 3u]);
        let d = v - vec4<f32>(m1);
        d1 += d;
        d2 += d * d;
    }
    var e1 = 0.0;
    var e2 = 0.0;
    for (var j = c4; j < c; j++) {
        let d = x[base + j] - m1;
        e1 += d;
        e2 += d * d;
    }
    let corr = ((d1.x + d1.y) + (d1.z + d1.w) + e1) / f32(c);
    let vr = max(((d2.x + d2.y) + (d2.z + d2.w) + e2) / f32(c) - corr * corr, 0.0);
    return vec2<f32>(m1 + corr, inverseSqrt(vr + p.eps));
}

fn stats_io(base: u32) -> vec2<f32> {
    let c = p.c;
    let c4 = c / 4u * 4u;
    var a = vec4<f32>(0.0);
    for (var j = 0u; j < c4; j += 4u) {
        a += vec4<f32>(io[base + j], io[base + j + 1u], io[base + j + 2u], io[base + j + 3u]);
    }
    var t = 0.0;
    for (var j = c4; j < c; j++) {
        t += io[base + j];
    }
    let m1 = ((a.x + a.y) + (a.z + a.w) + t) / f32(c);
    var d1 = vec4<f32>(0.0);
    var d2 = vec4<f32>(0.0);
    for (var j = 0u; j < c4; j += 4u) {
        let v = vec4<f32>(io[base + j], io[base + j + 1u], io[base + j + 2u], io[base + j + 3u]);
        let d = v - vec4<f32>(m1);
        d1 += d;
        d2 += d * d;
    }
    var e1 = 0.0;
    var e2 = 0.0;
    for (var j = c4; j < c; j++) {
        let d = io[base + j] - m1;
        e1 += d;
        e2 += d * d;
    }
    let corr = ((d1.x + d1.y) + (d1.z + d1.w) + e1) / f32(c);
    let vr = max(((d2.x + d2.y) + (d2.z + d2.w) + e2) / f32(c) - corr * corr, 0.0);
    return vec2<f32>(m1 + corr, inverseSqrt(vr + p.eps));
}

@compute @workgroup_size(WG)
fn layer_norm_rowwise(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    let row = (wid.x + wid.y * nwg.x) * WG + lid;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.c;
    let st = stats_x(base);
    for (var j = 0u; j < p.c; j++) {
        out[base + j] = (x[base + j] - st.x) * st.y * gamma[j] + beta[j];
    }
}

@compute @workgroup_size(WG)
fn layer_norm_rowwise_inplace(@builtin(workgroup_id) wid: vec3<u32>,
                              @builtin(num_workgroups) nwg: vec3<u32>,
                              @builtin(local_invocation_index) lid: u32) {
    let row = (wid.x + wid.y * nwg.x) * WG + lid;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.c;
    let st = stats_io(base);
    for (var j = 0u; j < p.c; j++) {
        io[base + j] = (io[base + j] - st.x) * st.y * gamma_i[j] + beta_i[j];
    }
}

// vec4 row-per-invocation variants (C % 4 == 0): the same arithmetic with 16-byte loads, ~4x fewer
// load loops on lavapipe.
@group(0) @binding(1) var<storage, read> x4: array<vec4<f32>>;         // (R, C / 4)
@group(0) @binding(2) var<storage, read> gamma4: array<vec4<f32>>;     // (C / 4)
@group(0) @binding(3) var<storage, read> beta4: array<vec4<f32>>;      // (C / 4)
@group(0) @binding(4) var<storage, read_write> out4: array<vec4<f32>>; // (R, C / 4)
@group(0) @binding(1) var<storage, read_write> io4: array<vec4<f32>>;  // (R, C / 4), in place

fn stats4_x4(base4: u32) -> vec2<f32> {
    let c4 = p.c / 4u;
    var a = vec4<f32>(0.0);
    for (var j = 0u; j < c4; j++) {
        a += x4[base4 + j];
    }
    let m1 = ((a.x + a.y) + (a.z + a.w)) / f32(p.c);
    var d1 = vec4<f32>(0.0);
    var d2 = vec4<f32>(0.0);
    for (var j = 0u; j < c4; j++) {
        let d = x4[base4 + j] - vec4<f32>(m1);
        d1 += d;
        d2 += d * d;
    }
    let corr = ((d1.x + d1.y) + (d1.z + d1.w)) / f32(p.c);
    let vr = max(((d2.x + d2.y) + (d2.z + d2.w)) / f32(p.c) - corr * corr, 0.0);
    return vec2<f32>(m1 + corr, inverseSqrt(vr + p.eps));
}

fn stats4_io4(base4: u32) -> vec2<f32> {
    let c4 = p.c / 4u;
    var a = vec4<f32>(0.0);
    for (var j = 0u; j < c4; j++) {
        a += io4[base4 + j];
    }
    let m1 = ((a.x + a.y) + (a.z + a.w)) / f32(p.c);
    var d1 = vec4<f32>(0.0);
    var d2 = vec4<f32>(0.0);
    for (var j = 0u; j < c4; j++) {
        let d = io4[base4 + j] - vec4<f32>(m1);
        d1 += d;
        d2 += d * d;
    }
    let corr = ((d1.x + d1.y) + (d1.z + d1.w)) / f32(p.c);
    let vr = max(((d2.x + d2.y) + (d2.z + d2.w)) / f32(p.c) - corr * corr, 0.0);
    return vec2<f32>(m1 + corr, inverseSqrt(vr + p.eps));
}

@compute @workgroup_size(WG)
fn layer_norm_rowwise4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let row = (wid.x + wid.y * nwg.x) * WG + lid;
    if (row >= p.rows) {
        return;
    }
    let c4 = p.c / 4u;
    let base4 = row * c4;
    let st = stats4_x4(base4);
    for (var j = 0u; j < c4; j++) {
        out4[base4 + j] = (x4[base4 + j] - vec4<f32>(st.x)) * st.y * gamma4[j] + beta4[j];
    }
}

@compute @workgroup_size(WG)
fn layer_norm_rowwise4_inplace(@builtin(workgroup_id) wid: vec3<u32>,
                               @builtin(num_workgroups) nwg: vec3<u32>,
                               @builtin(local_invocation_index) lid: u32) {
    let row = (wid.x + wid.y * nwg.x) * WG + lid;
    if (row >= p.rows) {
        return;
    }
    let c4 = p.c / 4u;
    let base4 = row * c4;
    let st = stats4_io4(base4);
    for (var j = 0u; j < c4; j++) {
        io4[base4 + j] = (io4[base4 + j] - vec4<f32>(st.x)) * st.y * gamma4[j] + beta4[j];
    }
}
