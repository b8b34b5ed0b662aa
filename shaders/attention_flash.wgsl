// Scaled dot-product attention for GPUs: K/V tiles in workgroup memory shared by the workgroup's query
// rows, one query row's state in each invocation's registers, online softmax once per tile, vec4 loads.
//
// Same contract as `attention` in attention.wgsl (encoder self-attention, decoder self/cross-attention;
// KV_F16: k/v packed f16, widened to f32 on load, include/attn_kv4.wgsl):
// q (B, Tq, H*D), k/v (Bk, Tk, H*D) with Bk = B or 1, out (B, Tq, H*D), head h owns columns h*D .. h*D+D;
// key j is visible to query row i iff j < kv_len and, when causal, j <= q_offset + i; an optional additive
// mask (Tq, Tk) is added to the scaled score; masked scores contribute exactly 0 (scores at or below
// VISIBLE count as masked: -inf and finfo.min masks), and a row that sees no key outputs zeros.
// DaViT window attention uses the same entry on the qkv Linear's fused output: row strides and column
// offsets are uniforms, so q, k and v may be one buffer (nW, T, 3C) bound three times (read-only) with
// k at column offset C and v at 2C, B = Bk = nW windows, Tq = Tk = T tokens.
//
// Why this shape (FlashAttention-2 in WGSL): a workgroup owns one (batch row, head, block of QB query
// rows). Keys are consumed in tiles of KT rows; the whole workgroup stages a tile of K and V in workgroup
// memory with coalesced vec4 loads, so every key row is read from global memory once per QB query rows
// instead of once per row. Each invocation keeps its query row (pre-scaled, as the reference scales q
// before q k^T) and its unnormalised output in registers (D/4 vec4 each), computes its scores for the tile
// into registers, then updates its running max m and sum l once per tile: o and l are rescaled by
// exp(m_old - m_new) and the tile's exp(s - m_new) are added. Scores never leave registers, so Tk is
// unbounded and only two barriers are paid per tile.
//
// Few query rows (decode: Tq = 1 per batch row) would leave most invocations idle, so a row may be split
// across S invocations (WG = QB * S): invocation (r, s) takes keys s, s + S, ... of every tile with its
// own (m, l, o), and the S partial states of a row are merged at the end by halving rounds through
// workgroup memory (the flash-decoding merge: m = max(m1, m2), l = l1 e^(m1-m) + l2 e^(m2-m), likewise o).
// S = 1 (encoder, windows) skips the merge.
//
// Sizes: D4 = D / 4 (<= MAXD4), QB, S, KT are override constants chosen by the launcher
// (`ops::attention`): QB * S = WG <= 64, KT * D4 <= KV4, KT / S <= MAXKPL and a multiple of S, and
// (WG / 2) * D4 <= 2 * KV4 for the merge (it reuses the K/V tile memory). Workgroup memory: 2 * KV4 vec4
// + 2 * MAX_WG f32 = 14.5 KiB, under WebGPU's guaranteed 16 KiB. From the launcher
// (src/ops/attention.rs, FLASH_SHADER's consts): MAX_WG, the largest workgroup; MAXD4, head dim / 4 at
// most (head dim <= 64); MAXKPL, keys per invocation per tile; KV4, the vec4 capacity of each of the K
// and V tiles.

override WG: u32 = MAX_WG;
override D4: u32 = 16;  // head dim / 4
override QB: u32 = 64;  // query rows per workgroup
override S: u32 = 1;    // invocations per query row (key split)
override KT: u32 = 28;  // keys per tile

#include attn_params
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;          // (B, Tq, q_stride)
// k, v (bindings 2, 3): (Bk, Tk, kv_stride) groups of four channels, f32 or packed f16 (KV_F16), read
// through k4 / v4.
@group(0) @binding(4) var<storage, read> mask: array<f32>;             // (Tq, Tk) additive; unused unless has_mask
@group(0) @binding(5) var<storage, read_write> out: array<vec4<f32>>;  // (B, Tq, out_stride)

#include attn_len
#include attn_kv4

var<workgroup> ks: array<vec4<f32>, KV4>;  // (KT, D4) key tile; merge scratch for partial outputs
var<workgroup> vs: array<vec4<f32>, KV4>;  // (KT, D4) value tile; merge scratch, continued
var<workgroup> mm: array<f32, MAX_WG>;     // (WG) merge scratch: partial running max
var<workgroup> ll: array<f32, MAX_WG>;     // (WG) merge scratch: partial running sum

@compute @workgroup_size(WG)
fn attention_flash(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    // Workgroup-uniform part: which (batch row, head, row block) this workgroup owns.
    let g = wid.x + wid.y * nwg.x;
    if (g >= p.batch * p.heads * p.n_qblocks) {
        return;
    }
    let qblk = g % p.n_qblocks;
    let bh = g / p.n_qblocks;
    let h = bh % p.heads;
    let b = bh / p.heads;
    let kb = select(b, 0u, p.bk == 1u);
    let hoff = h * D4;
    let row0 = qblk * QB;
    let rows = min(QB, p.tq - row0);
    var kend = kv_len();
    if (p.causal != 0u) {
        kend = min(kend, q_offset() + row0 + rows);
    }

    // This invocation: query row r of the block, key split s.
    let r = lid / S;
    let s = lid % S;
    let live = r < rows;
    let qrow = row0 + min(r, rows - 1u);
    var lim = 0u;  // keys visible to this row: j < lim
    if (live) {
        lim = kv_len();
        if (p.causal != 0u) {
            lim = min(lim, q_offset() + qrow + 1u);
        }
    }
    var qr: array<vec4<f32>, MAXD4>;  // (MAXD4) scaled query
    var o: array<vec4<f32>, MAXD4>;   // (MAXD4) unnormalised output
    let qbase = (b * p.tq + qrow) * p.q_stride + hoff;
    for (var e = 0u; e < D4; e++) {
        qr[e] = q[qbase + e] * p.scale;
        o[e] = vec4<f32>(0.0);
    }
    var m = NEG;
    var l = 0.0;

    for (var t0 = 0u; t0 < kend; t0 += KT) {
        let kn = min(KT, kend - t0);
        // Stage the tile: KT rows of D4 vec4s each for K and V, consecutive invocations on consecutive
        // vec4s of a row (coalesced); rows past the end are zero-filled and never visible.
        for (var i = lid; i < KT * D4; i += WG) {
            let j = i / D4;
            var kx = vec4<f32>(0.0);
            var vx = vec4<f32>(0.0);
            if (j < kn) {
                let row = (kb * p.tk + t0 + j) * p.kv_stride + hoff + i % D4;
                kx = k4(row + p.k_off);
                vx = v4(row + p.v_off);
            }
            ks[i] = kx;
            vs[i] = vx;
        }
        workgroupBarrier();

        // Scores of this invocation's keys j = s + c * S of the tile, and their max.
        var sc: array<f32, MAXKPL>;
        var smax = NEG;
        for (var c = 0u; c < KT / S; c++) {
            let j = s + c * S;
            let key = t0 + j;
            var dot4 = vec4<f32>(0.0);
            for (var e = 0u; e < D4; e++) {
                dot4 += qr[e] * ks[j * D4 + e];
            }
            var x = dot4.x + dot4.y + dot4.z + dot4.w;
            let in_range = j < kn && key < lim;
            if (p.has_mask != 0u && in_range) {
                x += mask[qrow * p.tk + key];
            }
            x = select(NEG, x, in_range && x > VISIBLE);
            sc[c] = x;
            smax = max(smax, x);
        }
        // Online softmax, once per tile: rescale the running sum and output to the new max.
        let mn = max(m, smax);
        let corr = exp(m - mn);
        m = mn;
        l *= corr;
        for (var e = 0u; e < D4; e++) {
            o[e] *= corr;
        }
        for (var c = 0u; c < KT / S; c++) {
            let x = sc[c];
            let pj = select(0.0, exp(x - mn), x > VISIBLE);
            l += pj;
            let j = s + c * S;
            for (var e = 0u; e < D4; e++) {
                o[e] += pj * vs[j * D4 + e];
            }
        }
        // The next tile overwrites ks / vs.
        workgroupBarrier();
    }

    // Merge the S partial states of each row: in each round the upper half of the remaining splits
    // publishes (m, l, o) and the lower half folds them in. The scratch reuses the tile memory.
    for (var w = S / 2u; w > 0u; w = w / 2u) {
        let slot = r * w + (s - w);  // (QB, w) for publishers s in [w, 2w)
        if (s >= w && s < 2u * w) {
            mm[slot] = m;
            ll[slot] = l;
            for (var e = 0u; e < D4; e++) {
                let at = slot * D4 + e;
                if (at < KV4) {
                    ks[at] = o[e];
                } else {
                    vs[at - KV4] = o[e];
                }
            }
        }
        workgroupBarrier();
        if (s < w) {
            let src = r * w + s;
            let m2 = mm[src];
            let l2 = ll[src];
            let mn = max(m, m2);
            let c1 = exp(m - mn);
            let c2 = exp(m2 - mn);
            m = mn;
            l = l * c1 + l2 * c2;
            for (var e = 0u; e < D4; e++) {
                let at = src * D4 + e;
                var o2 = vec4<f32>(0.0);
                if (at < KV4) {
                    o2 = ks[at];
                } else {
                    o2 = vs[at - KV4];
                }
                o[e] = o[e] * c1 + o2 * c2;
            }
        }
        workgroupBarrier();
    }

    if (live && s == 0u) {
        var inv = 0.0;
        if (l > 0.0) {
            inv = 1.0 / l;
        }
        let obase = (b * p.tq + qrow) * p.out_stride + hoff;
        for (var e = 0u; e < D4; e++) {
            out[obase + e] = o[e] * inv;
        }
    }
}
