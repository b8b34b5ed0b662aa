// Row reductions:
//   argmax_rows  out[r] = index of the largest x[r, :]                          x (R, V) -> u32 (R)
//   topk_rows    the k largest of x[r, :], descending, with their indices       -> (R, k), u32 (R, k)
//   mean_rows    out[b, c] = mean over n of x[b, n, c]                          x (B, N, C) -> (B, C)
//
// Ordering (argmax, topk): each value is mapped to an order-preserving u32 key (sign-magnitude floats
// flipped so that unsigned comparison matches float order), with -0 mapped to +0 (they compare equal)
// and every NaN mapped to the top key: NaN ranks above +inf, like torch.argmax / torch.topk. Elements
// are ranked by (key descending, index ascending), a strict total order, so ties go to the LOWER
// index and topk's output order is fully determined (the order of torch's stable sort). Integer keys
// make the comparisons immune to float fast-math assumptions about NaN.
//
// argmax / topk: one workgroup per row (grid folded by `grid_1d`). Invocation `lid` scans the indices
// j = lid, lid + WG, ... in increasing order, keeping its best element (argmax) or a sorted list of its
// best k (topk, k <= 16, insertion sort in private memory); a tie never displaces an earlier index.
// argmax then tree-reduces the per-invocation bests in workgroup memory. topk runs k rounds of the same
// tree reduction over the heads of the per-invocation lists; the owner of the winner (lid = index % WG)
// pops its head. Rows of the vocabulary (51328) or of beams x vocabulary are one workgroup each.
//
// mean_rows: one invocation per output (b, c), summing the N rows in order (reads of neighbouring c are
// contiguous across the workgroup).

override WG: u32 = MAX_WG; // power of two <= MAX_WG (the size of the shared arrays; from the launcher, src/ops/reduce.rs)

struct Params {
    rows: u32, // argmax/topk: R;  mean: B
    v: u32,    // argmax/topk: V;  mean: N
    k: u32,    // topk: k (1..=16); mean: C
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;           // argmax/topk: (R, V); mean: (B, N, C)
@group(0) @binding(2) var<storage, read_write> amax: array<u32>;  // argmax: (R)
@group(0) @binding(2) var<storage, read_write> vals: array<f32>;  // topk: (R, k)
@group(0) @binding(3) var<storage, read_write> ids: array<u32>;   // topk: (R, k)
@group(0) @binding(2) var<storage, read_write> mean: array<f32>;  // mean: (B, C)

// MAXK: the most values topk keeps per invocation (MAX_TOPK in the launcher).
const NONE: u32 = 0xffffffffu; // index of the sentinel, ranked below every real element (key 0)

var<workgroup> sk: array<u32, MAX_WG>;
var<workgroup> si: array<u32, MAX_WG>;

fn order_key(v: f32) -> u32 {
    var b = bitcast<u32>(v);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return 0xffffffffu; // NaN
    }
    if (b == 0x80000000u) {
        b = 0u; // -0 == +0
    }
    if ((b & 0x80000000u) != 0u) {
        return ~b;
    }
    return b | 0x80000000u;
}

// (ka, ia) ranks above (kb, ib)
fn better(ka: u32, ia: u32, kb: u32, ib: u32) -> bool {
    return ka > kb || (ka == kb && ia < ib);
}

// Tree-reduce (key, index) pairs to the best one; every invocation gets the result.
fn reduce_best(lid: u32, k: u32, i: u32) -> vec2<u32> {
    sk[lid] = k;
    si[lid] = i;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s && better(sk[lid + s], si[lid + s], sk[lid], si[lid])) {
            sk[lid] = sk[lid + s];
            si[lid] = si[lid + s];
        }
        workgroupBarrier();
    }
    let r = vec2<u32>(sk[0], si[0]);
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(WG)
fn argmax_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.v;
    var bk = 0u;
    var bi = NONE;
    for (var j = lid; j < p.v; j += WG) {
        let k = order_key(x[base + j]);
        if (k > bk || bi == NONE) {
            bk = k;
            bi = j;
        }
    }
    let best = reduce_best(lid, bk, bi);
    if (lid == 0u) {
        amax[row] = best.y;
    }
}

@compute @workgroup_size(WG)
fn topk_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.v;
    let kk = min(p.k, MAXK);
    var lk: array<u32, MAXK>;
    var li: array<u32, MAXK>;
    for (var t = 0u; t < MAXK; t++) {
        lk[t] = 0u;
        li[t] = NONE;
    }
    for (var j = lid; j < p.v; j += WG) {
        let k = order_key(x[base + j]);
        if (better(k, j, lk[kk - 1u], li[kk - 1u])) {
            var pos = kk - 1u;
            loop {
                if (pos == 0u || !better(k, j, lk[pos - 1u], li[pos - 1u])) {
                    break;
                }
                lk[pos] = lk[pos - 1u];
                li[pos] = li[pos - 1u];
                pos -= 1u;
            }
            lk[pos] = k;
            li[pos] = j;
        }
    }
    var h = 0u;
    for (var r = 0u; r < kk; r++) {
        var ck = 0u;
        var ci = NONE;
        if (h < kk) {
            ck = lk[h];
            ci = li[h];
        }
        let best = reduce_best(lid, ck, ci);
        if (best.y != NONE && best.y % WG == lid) {
            h += 1u;
        }
        if (lid == 0u) {
            let o = row * p.k + r;
            if (best.y < p.v) {
                vals[o] = x[base + best.y];
                ids[o] = best.y;
            } else {
                vals[o] = 0.0;
                ids[o] = NONE;
            }
        }
    }
}

@compute @workgroup_size(WG)
fn mean_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * WG + lid;
    let c = p.k;
    if (i >= p.rows * c) {
        return;
    }
    let b = i / c;
    let col = i - b * c;
    var s = 0.0;
    for (var n = 0u; n < p.v; n++) {
        s += x[(b * p.v + n) * c + col];
    }
    mean[i] = s / f32(p.v);
}
