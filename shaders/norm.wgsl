// LayerNorm over the last dimension: out[r, :] = (x[r, :] - mean) / sqrt(var + eps) * gamma + beta,
// with the biased variance, exactly as torch.nn.LayerNorm.
//
// Entry points (the launcher picks one by `RowStrategy`):
// - `layer_norm`: one workgroup per row (GPUs: coalesced loads). The grid is folded by `grid_1d`, so the
//   row index is rebuilt from wid.x and wid.y. Each invocation strides over the row; partial sums are
//   combined by a tree reduction in workgroup memory. Two passes over the row (mean, then the sum of
//   squared deviations) instead of the one-pass E[x^2] - E[x]^2, which cancels badly when |mean| >> std.
// - `layer_norm_rowwise`: one invocation per row, no workgroup memory, no barriers. On CPU adapters
//   (lavapipe, SwiftShader) a workgroup barrier is a coroutine switch and dominates a per-row tree
//   reduction, so one invocation walks its whole row. A long sequential f32 sum loses precision (~C * eps
//   relative in the worst case), so: four interleaved partial sums (also four independent dependency
//   chains), and the second pass accumulates d = x - m1 and d^2 around the first-pass mean m1, then
//   corrects it: mean = m1 + sum(d) / C, var = sum(d^2) / C - (sum(d) / C)^2, where sum(d) / C is only
//   m1's tiny rounding error, so the correction cannot cancel.
// In both, the last pass normalises; each element is read and written by the same invocation, so the
// in-place variant (x == out) is race-free.
//
// Variants (src/gpu/preprocess.rs):
// - INPLACE: x and out are one buffer (binding 1, read_write; WebGPU forbids binding one buffer both
//   read-only and writable in one dispatch), gamma and beta follow at 2 and 3.
// - VEC4 (C % 4 == 0, `layer_norm_rowwise` only): the arrays hold vec4<f32>, so every load and store is
//   16 bytes (~4x fewer load loops on lavapipe). The arithmetic is the same as the scalar variant's, which
//   also sums in vec4 lanes.

override WG: u32 = MAX_WG; // power of two <= MAX_WG (from the launcher: src/ops/norm.rs): the workgroup size

struct Params {
    rows: u32, // R
    c: u32,    // C
    eps: f32,
    _pad: u32,
}

#include lanes

@group(0) @binding(0) var<uniform> p: Params;
#if INPLACE
@group(0) @binding(1) var<storage, read_write> x: array<F>;     // (R, C), normalised in place
#else
@group(0) @binding(1) var<storage, read> x: array<F>;           // (R, C)
#endif
@group(0) @binding(2) var<storage, read> gamma: array<F>;       // (C)
@group(0) @binding(3) var<storage, read> beta: array<F>;        // (C)
#if !INPLACE
@group(0) @binding(4) var<storage, read_write> out: array<F>;   // (R, C)
#endif

// Element access by scalar index i. `load4`/`store4`/`affine4` take i % 4 == 0 and cover i .. i + 3.
#if VEC4
fn load1(i: u32) -> f32 { return x[i / 4u][i % 4u]; }
fn load4(i: u32) -> vec4<f32> { return x[i / 4u]; }
fn gamma1(i: u32) -> f32 { return gamma[i / 4u][i % 4u]; }
fn beta1(i: u32) -> f32 { return beta[i / 4u][i % 4u]; }
fn gamma4(i: u32) -> vec4<f32> { return gamma[i / 4u]; }
fn beta4(i: u32) -> vec4<f32> { return beta[i / 4u]; }
#else
fn load1(i: u32) -> f32 { return x[i]; }
fn load4(i: u32) -> vec4<f32> { return vec4<f32>(x[i], x[i + 1u], x[i + 2u], x[i + 3u]); }
fn gamma1(i: u32) -> f32 { return gamma[i]; }
fn beta1(i: u32) -> f32 { return beta[i]; }
fn gamma4(i: u32) -> vec4<f32> {
    return vec4<f32>(gamma[i], gamma[i + 1u], gamma[i + 2u], gamma[i + 3u]);
}
fn beta4(i: u32) -> vec4<f32> { return vec4<f32>(beta[i], beta[i + 1u], beta[i + 2u], beta[i + 3u]); }
#endif

fn store1(i: u32, v: f32) {
#if INPLACE
#if VEC4
    x[i / 4u][i % 4u] = v;
#else
    x[i] = v;
#endif
#else
#if VEC4
    out[i / 4u][i % 4u] = v;
#else
    out[i] = v;
#endif
#endif
}

fn store4(i: u32, v: vec4<f32>) {
#if VEC4
#if INPLACE
    x[i / 4u] = v;
#else
    out[i / 4u] = v;
#endif
#else
    store1(i, v.x);
    store1(i + 1u, v.y);
    store1(i + 2u, v.z);
    store1(i + 3u, v.w);
#endif
}

#if !VEC4
#include row_reduce

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
        s += load1(base + j);
    }
    let mean = reduce_sum(lid, s) / f32(p.c);
    var q = 0.0;
    for (var j = lid; j < p.c; j += WG) {
        let d = load1(base + j) - mean;
        q += d * d;
    }
    let inv = inverseSqrt(reduce_sum(lid, q) / f32(p.c) + p.eps);
    for (var j = lid; j < p.c; j += WG) {
        store1(base + j, (load1(base + j) - mean) * inv * gamma1(j) + beta1(j));
    }
}
#endif

// (mean, 1/sqrt(var + eps)) of the row starting at scalar index `base`, sequentially.
fn row_stats(base: u32) -> vec2<f32> {
    let c = p.c;
    let c4 = c / 4u * 4u;
    var a = vec4<f32>(0.0);
    for (var j = 0u; j < c4; j += 4u) {
        a += load4(base + j);
    }
    var t = 0.0;
    for (var j = c4; j < c; j++) {
        t += load1(base + j);
    }
    let m1 = ((a.x + a.y) + (a.z + a.w) + t) / f32(c);
    var d1 = vec4<f32>(0.0);
    var d2 = vec4<f32>(0.0);
    for (var j = 0u; j < c4; j += 4u) {
        let d = load4(base + j) - vec4<f32>(m1);
        d1 += d;
        d2 += d * d;
    }
    var e1 = 0.0;
    var e2 = 0.0;
    for (var j = c4; j < c; j++) {
        let d = load1(base + j) - m1;
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
    let c = p.c;
    let c4 = c / 4u * 4u;
    let base = row * c;
    let st = row_stats(base);
    for (var j = 0u; j < c4; j += 4u) {
        store4(base + j, (load4(base + j) - vec4<f32>(st.x)) * st.y * gamma4(j) + beta4(j));
    }
    for (var j = c4; j < c; j++) {
        store1(base + j, (load1(base + j) - st.x) * st.y * gamma1(j) + beta1(j));
    }
}
