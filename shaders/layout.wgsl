// Data movement kernels (4-byte elements, f32 or u32, moved as raw bits):
//   permute      out = x.permute(dims) for rank <= 4 (the host pads shapes to rank 4 with leading 1s)
//   split_qkv    q, k, v = qkv[:, 0:C], qkv[:, C:2C], qkv[:, 2C:3C]
//
// One invocation per output element (for split_qkv: per element of q, writing q, k and v), grid folded
// by `grid_1d`. permute decomposes the flat output index into 4 coordinates with the output shape and
// dots them with the input strides of the permuted axes.
//
// Variant VEC4 (src/gpu/preprocess.rs), chosen for split_qkv when C is a multiple of 4: q, k, v and qkv
// hold vec4<f32>, a quarter of the invocations and 16-byte accesses (several times faster on lavapipe,
// where every dynamically addressed load is a loop over the lanes). `p.n` and `p.a` stay in elements.

// WG, the workgroup size: from the launcher (src/ops/layout.rs, SHADER's consts).

struct Params {
    n: u32,          // output elements (split_qkv: R * C)
    a: u32,          // split_qkv: C
    b: u32,          // unused
    _pad: u32,
    out_dims: vec4<u32>,   // permute: output shape (rank 4)
    in_strides: vec4<u32>, // permute: input stride of the input axis that becomes output axis i
}

#include lanes

@group(0) @binding(0) var<uniform> p: Params;

// permute
@group(0) @binding(1) var<storage, read> x: array<u32>;         // x (any, rank <= 4)
@group(0) @binding(2) var<storage, read_write> out: array<u32>; // out (permuted shape)

// split_qkv
@group(0) @binding(1) var<storage, read> qkv: array<F>;         // (R, 3C)
@group(0) @binding(2) var<storage, read_write> q: array<F>;     // (R, C)
@group(0) @binding(3) var<storage, read_write> k: array<F>;     // (R, C)
@group(0) @binding(4) var<storage, read_write> v: array<F>;     // (R, C)

fn flat(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.x + wid.y * nwg.x) * WG + lid;
}

@compute @workgroup_size(WG)
fn permute(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i >= p.n) {
        return;
    }
    var r = i;
    let i3 = r % p.out_dims.w;
    r = r / p.out_dims.w;
    let i2 = r % p.out_dims.z;
    r = r / p.out_dims.z;
    let i1 = r % p.out_dims.y;
    let i0 = r / p.out_dims.y;
    let src = i0 * p.in_strides.x + i1 * p.in_strides.y + i2 * p.in_strides.z + i3 * p.in_strides.w;
    out[i] = x[src];
}

@compute @workgroup_size(WG)
fn split_qkv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i >= p.n / LANES) {
        return;
    }
    let c = p.a / LANES;
    let r = i / c;
    let col = i - r * c;
    let base = r * 3u * c + col;
    q[i] = qkv[base];
    k[i] = qkv[base + c];
    v[i] = qkv[base + 2u * c];
}
