// Data movement kernels (4-byte elements, f32 or u32, moved as raw bits):
//   permute      out = x.permute(dims) for rank <= 4 (the host pads shapes to rank 4 with leading 1s)
//   gather_batch out[b] = x[idx[b]] over the leading dim (beam reorder); idx >= B gives zeros
//   split_qkv    q, k, v = qkv[:, 0:C], qkv[:, C:2C], qkv[:, 2C:3C]
//
// One invocation per output element (for split_qkv: per element of q, writing q, k and v), grid folded
// by `grid_1d`. permute decomposes the flat output index into 4 coordinates with the output shape and
// dots them with the input strides of the permuted axes.

override WG: u32 = 256;

struct Params {
    n: u32,          // output elements (split_qkv: R * C)
    a: u32,          // gather_batch: B (rows of x); split_qkv: C
    b: u32,          // gather_batch: L * C (elements per batch row)
    _pad: u32,
    out_dims: vec4<u32>,   // permute: output shape (rank 4)
    in_strides: vec4<u32>, // permute: input stride of the input axis that becomes output axis i
}

@group(0) @binding(0) var<uniform> p: Params;

// permute, gather_batch
@group(0) @binding(1) var<storage, read> x: array<u32>;         // permute: x (any, rank <= 4); gather: (B, L, C)
@group(0) @binding(2) var<storage, read_write> out: array<u32>; // permute: out (permuted shape)

// gather_batch
@group(0) @binding(2) var<storage, read> idx: array<u32>;         // (B2)
@group(0) @binding(3) var<storage, read_write> gout: array<u32>;  // (B2, L, C)

// split_qkv
@group(0) @binding(1) var<storage, read> qkv: array<f32>;       // (R, 3C)
@group(0) @binding(2) var<storage, read_write> q: array<f32>;   // (R, C)
@group(0) @binding(3) var<storage, read_write> k: array<f32>;   // (R, C)
@group(0) @binding(4) var<storage, read_write> v: array<f32>;   // (R, C)

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
fn gather_batch(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i >= p.n) {
        return;
    }
    let ob = i / p.b;
    let e = i - ob * p.b;
    let src = idx[ob];
    if (src < p.a) {
        gout[i] = x[src * p.b + e];
    } else {
        gout[i] = 0u;
    }
}

@compute @workgroup_size(WG)
fn split_qkv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i >= p.n) {
        return;
    }
    let r = i / p.a;
    let col = i - r * p.a;
    let base = r * 3u * p.a + col;
    q[i] = qkv[base];
    k[i] = qkv[base + p.a];
    v[i] = qkv[base + 2u * p.a];
}

// ---- vec4 variants (chosen by the launchers when C, resp. L * C, is a multiple of 4) ----------------
// A quarter of the invocations and 16-byte accesses (several times faster on lavapipe, where every
// dynamically addressed load is a loop over the lanes). `p.n`, `p.a`, `p.b` stay in elements.

@group(0) @binding(1) var<storage, read> qkv4: array<vec4<f32>>;      // (R, 3C / 4)
@group(0) @binding(2) var<storage, read_write> q4: array<vec4<f32>>;  // (R, C / 4)
@group(0) @binding(3) var<storage, read_write> k4: array<vec4<f32>>;  // (R, C / 4)
@group(0) @binding(4) var<storage, read_write> v4: array<vec4<f32>>;  // (R, C / 4)

@group(0) @binding(1) var<storage, read> x4: array<vec4<u32>>;          // (B, L * C / 4)
@group(0) @binding(3) var<storage, read_write> gout4: array<vec4<u32>>; // (B2, L * C / 4)

@compute @workgroup_size(WG)
fn split_qkv4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i >= p.n / 4u) {
        return;
    }
    let c4 = p.a / 4u;
    let r = i / c4;
    let col = i - r * c4;
    let base = r * 3u * c4 + col;
    q4[i] = qkv4[base];
    k4[i] = qkv4[base + c4];
    v4[i] = qkv4[base + 2u * c4];
}

@compute @workgroup_size(WG)
fn gather_batch4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i >= p.n / 4u) {
        return;
    }
    let per4 = p.b / 4u;
    let ob = i / per4;
    let e = i - ob * per4;
    let src = idx[ob];
    if (src < p.a) {
        gout4[i] = x4[src * per4 + e];
    } else {
        gout4[i] = vec4<u32>(0u);
    }
}
