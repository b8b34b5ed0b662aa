// DaViT channel attention core. For each batch b and channel group gi (d = C / groups channels):
//   q, k, v = the group's columns of qkv (N, 3C): q = cols [gi*d, gi*d+d), k = C + those, v = 2C + those
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
//      scales, and applies a max-subtracted softmax over j, writing attn (B, g, d, d).
//   3. `attn_apply`: one invocation per output element (b, n, c), a d-long dot of attn row and v row.
// Out-of-range rows/columns of a partial tile load clamped (valid) addresses and are never stored.

override WG: u32 = 256;

struct Params {
    n: u32,        // tokens N
    c: u32,        // channels C
    d: u32,        // channels per group
    g: u32,        // groups
    chunk: u32,    // tokens per split
    nsplit: u32,   // number of splits
    tiles_j: u32,  // 32-wide tiles along j
    total: u32,    // rows (softmax_rows) or output elements (attn_apply)
    scale: f32,    // N^-0.5
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

// ---- 1. gram_partial -------------------------------------------------------------------------------
@group(0) @binding(1) var<storage, read> qkv: array<f32>;            // (B, N, 3C)
@group(0) @binding(2) var<storage, read_write> part: array<f32>;     // (B, nsplit, g, d, d)

@compute @workgroup_size(8, 8)
fn gram_partial(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
    let ti = wid.x / p.tiles_j;
    let tj = wid.x % p.tiles_j;
    let b = wid.y / p.g;
    let gi = wid.y % p.g;
    let sp = wid.z;
    let i0 = ti * 32u + l.y * 4u;
    let j0 = tj * 32u + l.x * 4u;
    let dm = p.d - 1u;
    let qc = vec4<u32>(min(i0, dm), min(i0 + 1u, dm), min(i0 + 2u, dm), min(i0 + 3u, dm)) + gi * p.d;
    let kc = vec4<u32>(min(j0, dm), min(j0 + 1u, dm), min(j0 + 2u, dm), min(j0 + 3u, dm)) + (p.c + gi * p.d);
    let c3 = 3u * p.c;
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

// ---- 2. softmax_rows ---------------------------------------------------------------------------------
@group(0) @binding(1) var<storage, read> part_in: array<f32>;         // (B, nsplit, g, d, d)
@group(0) @binding(2) var<storage, read_write> attn: array<f32>;      // (B, g, d, d)

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
    for (var j = 0u; j < dd; j++) {
        attn[dst0 + j] = attn[dst0 + j] * inv;
    }
}

// ---- 3. attn_apply -----------------------------------------------------------------------------------
@group(0) @binding(1) var<storage, read> qkv_v: array<f32>;           // (B, N, 3C)
@group(0) @binding(2) var<storage, read> attn_in: array<f32>;         // (B, g, d, d)
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
    let arow = (b * p.c + ch) * p.d;          // ((b*g + gi)*d + i)*d
    let vrow = bn * 3u * p.c + 2u * p.c + gi * p.d;
    var acc = 0.0;
    for (var j = 0u; j < p.d; j++) {
        acc += attn_in[arow + j] * qkv_v[vrow + j];
    }
    out[e] = acc;
}
