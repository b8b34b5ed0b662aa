// DaViT channel attention core. For each batch b and channel group gi (d = C / groups channels):
//   q, k, v = the group's columns of qkv (N, 3C): q = cols [gi*d, gi*d+d), k = C + those, v = 2C + those
//   (or q, k from a separate qk (N, 2C) and v from a separate (N, C): row strides and v's column offset
//   are parameters)
//   attn    = softmax_j( sum_n q[n, i] * k[n, j] * scale )     (d x d; scale = N^-0.5, the TOKEN count)
//   out[n, gi*d + i] = sum_j attn[i, j] * v[n, j]
// exactly as the reference's eager path computes (q k^T over the token axis, then * scale, softmax, @ v).
//
// The reduction over N is long (36864 tokens at stage 0 of a 768 image) while the result is tiny (d x d), so
// it is split three ways:
//   1. `gram_partial`: workgroup (tile, b*g + gi, split) sums its `chunk` tokens for a 32x32 tile of (i, j);
//      each of its 8x8 invocations keeps a 4x4 register block (4 q + 4 k loads feed 16 multiply-adds, no
//      barriers: barriers are expensive on CPU adapters). Partials go to (B, nsplit, g, d, d).
//   2. `softmax_rows`: one invocation per (b, gi, i) row adds the splits in a fixed order (deterministic),
//      scales, and applies a max-subtracted softmax over j (using `attn` as scratch), and writes the result
//      TRANSPOSED, attn_t (B, g, d(j), d(i)), so that 4 consecutive output channels i are one vec4 load.
//   3. `attn_apply`: one invocation per output element (b, n, c), a d-long dot of attn row and v row.
// Out-of-range rows/columns of a partial tile load clamped (valid) addresses and are never stored.
// `gram_partial4` / `attn_apply4` are the same with vec4 loads, used when C and d are multiples of 4 (all
// released models): on CPU adapters every non-constant load is a per-lane loop, so loading 4 floats at
// once is what pays; `attn_apply4` produces 4 channels per invocation from d/4 vec4 loads of v and d
// vec4 loads of attn_t (1.25 d loads per 4 outputs instead of 8 d).

// From the launcher (src/ops/channel_attn.rs, SHADER's consts): WG, the workgroup size of the 1-D
// entries; TILE, the (i, j) tile edge of a Gram workgroup (TILE / 4 x TILE / 4 invocations of 4x4).

struct Params {
    n: u32,        // tokens N
    c: u32,        // channels C
    d: u32,        // channels per group
    g: u32,        // groups
    chunk: u32,    // tokens per split
    nsplit: u32,   // number of splits
    tiles_j: u32,  // TILE-wide tiles along j
    total: u32,    // rows (softmax_rows) or output elements (attn_apply)
    scale: f32,    // N^-0.5
    qk_stride: u32, // floats per token row of the q/k source: 3C (qkv) or 2C (separate qk)
    v_stride: u32,  // floats per token row of the v source: 3C (qkv) or C (separate v)
    v_off: u32,     // column of v in that row: 2C (qkv) or 0
}

@group(0) @binding(0) var<uniform> p: Params;

// ---- 1. gram_partial -------------------------------------------------------------------------------
@group(0) @binding(1) var<storage, read> qkv: array<f32>;            // (B, N, qk_stride)
@group(0) @binding(2) var<storage, read_write> part: array<f32>;     // (B, nsplit, g, d, d)

@compute @workgroup_size(TILE / 4u, TILE / 4u)
fn gram_partial(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
    let ti = wid.x / p.tiles_j;
    let tj = wid.x % p.tiles_j;
    let b = wid.y / p.g;
    let gi = wid.y % p.g;
    let sp = wid.z;
    let i0 = ti * TILE + l.y * 4u;
    let j0 = tj * TILE + l.x * 4u;
    let dm = p.d - 1u;
    let qc = vec4<u32>(min(i0, dm), min(i0 + 1u, dm), min(i0 + 2u, dm), min(i0 + 3u, dm)) + gi * p.d;
    let kc = vec4<u32>(min(j0, dm), min(j0 + 1u, dm), min(j0 + 2u, dm), min(j0 + 3u, dm)) + (p.c + gi * p.d);
    let c3 = p.qk_stride;
    let n0 = sp * p.chunk;
    let n1 = min(n0 + p.chunk, p.n);
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    for (var n = n0; n < n1; n++) {
        let row = (b * p.n + n) * c3;
        let qa = vec4<f32>(qkv[row + qc.x], qkv[row + qc.y], qkv[row + qc.z], qkv[row + qc.w]);
        let kb = vec4<f32>(qkv[row + kc.x], qkv[row + kc.y], qkv[row + kc.z], qkv[row + kc.w]);
        a0 += qa.x * kb;
        a1 += qa.y * kb;
        a2 += qa.z * kb;
        a3 += qa.w * kb;
    }
    let base = ((b * p.nsplit + sp) * p.g + gi) * p.d * p.d;
    var acc = array<vec4<f32>, 4>(a0, a1, a2, a3);
    for (var r = 0u; r < 4u; r++) {
        let i = i0 + r;
        if (i >= p.d) {
            break;
        }
        let v = acc[r];
        for (var s = 0u; s < 4u; s++) {
            let j = j0 + s;
            if (j < p.d) {
                part[base + i * p.d + j] = v[s];
            }
        }
    }
}

// ---- 1b. gram_partial4 (C % 4 == 0, d % 4 == 0) -----------------------------------------------------
@group(0) @binding(1) var<storage, read> qkv4: array<vec4<f32>>;     // (B, N, qk_stride/4)

@compute @workgroup_size(TILE / 4u, TILE / 4u)
fn gram_partial4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
    let ti = wid.x / p.tiles_j;
    let tj = wid.x % p.tiles_j;
    let b = wid.y / p.g;
    let gi = wid.y % p.g;
    let sp = wid.z;
    let i0 = ti * TILE + l.y * 4u;
    let j0 = tj * TILE + l.x * 4u;
    let qc = (gi * p.d + min(i0, p.d - 4u)) / 4u;
    let kc = (p.c + gi * p.d + min(j0, p.d - 4u)) / 4u;
    let c34 = p.qk_stride / 4u;
    let n0 = sp * p.chunk;
    let n1 = min(n0 + p.chunk, p.n);
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    for (var n = n0; n < n1; n++) {
        let row = (b * p.n + n) * c34;
        let qa = qkv4[row + qc];
        let kb = qkv4[row + kc];
        a0 += qa.x * kb;
        a1 += qa.y * kb;
        a2 += qa.z * kb;
        a3 += qa.w * kb;
    }
    if (i0 >= p.d || j0 >= p.d) {
        return;
    }
    let base = ((b * p.nsplit + sp) * p.g + gi) * p.d * p.d + i0 * p.d + j0;
    let dd = p.d;
    part[base] = a0.x;
    part[base + 1u] = a0.y;
    part[base + 2u] = a0.z;
    part[base + 3u] = a0.w;
    part[base + dd] = a1.x;
    part[base + dd + 1u] = a1.y;
    part[base + dd + 2u] = a1.z;
    part[base + dd + 3u] = a1.w;
    part[base + 2u * dd] = a2.x;
    part[base + 2u * dd + 1u] = a2.y;
    part[base + 2u * dd + 2u] = a2.z;
    part[base + 2u * dd + 3u] = a2.w;
    part[base + 3u * dd] = a3.x;
    part[base + 3u * dd + 1u] = a3.y;
    part[base + 3u * dd + 2u] = a3.z;
    part[base + 3u * dd + 3u] = a3.w;
}

// ---- 2. softmax_rows ---------------------------------------------------------------------------------
@group(0) @binding(1) var<storage, read> part_in: array<f32>;         // (B, nsplit, g, d, d)
@group(0) @binding(2) var<storage, read_write> attn: array<f32>;      // (B, g, d, d) scratch (row-major)
@group(0) @binding(3) var<storage, read_write> attn_t: array<f32>;    // (B, g, d(j), d(i)) result

fn flat(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.x + wid.y * nwg.x) * WG + lid;
}

@compute @workgroup_size(WG)
fn softmax_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let r = flat(wid, nwg, lid);   // b*g*d + gi*d + i
    if (r >= p.total) {
        return;
    }
    let gd = p.g * p.d;
    let b = r / gd;
    let gi_i = r % gd;             // gi*d + i
    let dd = p.d;
    let split_stride = gd * dd;    // one split's (g, d, d)
    let src0 = b * p.nsplit * split_stride + gi_i * dd;
    let dst0 = r * dd;
    var mx = -3.402823e38;
    for (var j = 0u; j < dd; j++) {
        var s = 0.0;
        for (var sp = 0u; sp < p.nsplit; sp++) {
            s += part_in[src0 + sp * split_stride + j];
        }
        let logit = s * p.scale;
        attn[dst0 + j] = logit;
        mx = max(mx, logit);
    }
    var sum = 0.0;
    for (var j = 0u; j < dd; j++) {
        let e = exp(attn[dst0 + j] - mx);
        attn[dst0 + j] = e;
        sum += e;
    }
    let inv = 1.0 / sum;
    let i = gi_i % dd;
    let t0 = (r - i) * dd + i;     // ((b*g + gi)*d)*d + i: column i of the transposed block
    for (var j = 0u; j < dd; j++) {
        attn_t[t0 + j * dd] = attn[dst0 + j] * inv;
    }
}

// ---- 3. attn_apply -----------------------------------------------------------------------------------
@group(0) @binding(1) var<storage, read> qkv_v: array<f32>;           // (B, N, v_stride)
@group(0) @binding(2) var<storage, read> attn_in: array<f32>;         // (B, g, d(j), d(i)) transposed
@group(0) @binding(3) var<storage, read_write> out: array<f32>;       // (B, N, C)

@compute @workgroup_size(WG)
fn attn_apply(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let e = flat(wid, nwg, lid);
    if (e >= p.total) {
        return;
    }
    let ch = e % p.c;              // gi*d + i
    let bn = e / p.c;              // b*N + n
    let b = bn / p.n;
    let gi = ch / p.d;
    let i = ch % p.d;
    let a0 = (b * p.c + ch - i) * p.d + i;    // ((b*g + gi)*d)*d + i
    let vrow = bn * p.v_stride + p.v_off + gi * p.d;
    var acc = 0.0;
    for (var j = 0u; j < p.d; j++) {
        acc += attn_in[a0 + j * p.d] * qkv_v[vrow + j];
    }
    out[e] = acc;
}

// ---- 3b. attn_apply4 (C % 4 == 0, d % 4 == 0): 4 output channels per invocation -------------------------
@group(0) @binding(1) var<storage, read> qkv_v4: array<vec4<f32>>;    // (B, N, v_stride/4)
@group(0) @binding(2) var<storage, read> attn_t4: array<vec4<f32>>;   // (B, g, d(j), d(i)/4)
@group(0) @binding(3) var<storage, read_write> out4: array<vec4<f32>>; // (B, N, C/4)

@compute @workgroup_size(WG)
fn attn_apply4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let e = flat(wid, nwg, lid);   // (b*N + n)*C/4 + ch/4
    if (e >= p.total) {
        return;
    }
    let c4 = p.c / 4u;
    let d4 = p.d / 4u;
    let ch = (e % c4) * 4u;
    let bn = e / c4;
    let b = bn / p.n;
    let i = ch % p.d;
    let a0 = ((b * p.c + ch - i) * p.d + i) / 4u;   // vec4 index of attn_t[b, gi, 0, i..i+4]
    let v0 = (bn * p.v_stride + p.v_off + ch - i) / 4u;
    var acc = vec4<f32>(0.0);
    for (var j4 = 0u; j4 < d4; j4++) {
        let v = qkv_v4[v0 + j4];
        let a = a0 + j4 * 4u * d4;
        acc += attn_t4[a] * v.x;
        acc += attn_t4[a + d4] * v.y;
        acc += attn_t4[a + 2u * d4] * v.z;
        acc += attn_t4[a + 3u * d4] * v.w;
    }
    out4[e] = acc;
}
