// Scaled dot-product attention, flash style (online softmax), heads interleaved in columns.
//
// q (B, Tq, H*D), k/v (Bk, Tk, H*D) with Bk = B or 1 (1 = K/V shared by every batch row, e.g. the image's
// cross-attention K/V shared by all beams), out (B, Tq, H*D). Tokens are rows and head h owns columns
// h*D .. h*D+D, exactly as a Linear writes them, so no permutes are needed around the kernel.
//
// One workgroup per (batch row, head, block of QB query rows). The block's queries (pre-scaled, as the
// reference scales q before q k^T) and its running output live in workgroup memory. Keys are consumed
// in tiles of KT rows: the tile of K and V is staged in workgroup memory, the QB x KT scores are computed
// by all invocations, one invocation per query row folds them into the running max / sum (online
// softmax: rescale the old sum and output by exp(m_old - m_new)), and the output block is updated by all
// invocations. Every value is f32 (KV_F16: K and V are stored as packed halves and widened to f32 on
// load); scores are never materialised beyond one tile, so Tk is unbounded.
//
// Masking: key j is visible to query row i iff j < kv_len (KV-cache fill) and, when causal,
// j <= q_offset + i (q_offset = absolute position of query row 0). The optional additive mask (Tq, Tk)
// is added to the scaled score. Masked scores contribute exactly 0 (not exp(-huge)); a row that sees no
// key at all outputs zeros. Causal blocks stop at their last visible key, so decode (Tq = 1) and
// prefill never read past the cache fill.
//
// Decode (`attention_decode`, Tq = 1, kv_len <= 2048): one workgroup per (batch row, head). The scores of
// all visible keys go to workgroup memory (each invocation a strided subset of keys), max and sum are
// tree-reduced, and the output columns are split across invocation groups (each group a strided subset
// of keys) and summed. ~15 barriers per call instead of ~4 per key tile.
//
// Sizes: D (head dim), QB, KT are override constants chosen by the launcher so that QB*D <= Q_CAP,
// KT*D <= KV_CAP and QB*KT <= S_CAP (15.2 KiB of workgroup memory in all). WG, the workgroup-memory
// capacities (Q_CAP, KV_CAP, S_CAP, QB_MAX) and DEC_MAXK come from the launcher (src/ops/attention.rs,
// SHADER's consts). Per-call sizes are uniforms.

override D: u32 = 64;   // head dim
override QB: u32 = 16;  // query rows per workgroup (<= QB_MAX)
override KT: u32 = 16;  // keys per tile

#include attn_params
@group(0) @binding(1) var<storage, read> q: array<f32>;          // (B, Tq, H*D)
#if KV_F16
// Packed f16 K/V (two halves per u32, element i in word i / 2), read as f32: see include/attn_kv4.wgsl.
@group(0) @binding(2) var<storage, read> k: array<u32>;          // (Bk, Tk, H*D / 2)
@group(0) @binding(3) var<storage, read> v: array<u32>;          // (Bk, Tk, H*D / 2)
fn k_at(i: u32) -> f32 {
    return unpack2x16float(k[i >> 1u])[i & 1u];
}
fn v_at(i: u32) -> f32 {
    return unpack2x16float(v[i >> 1u])[i & 1u];
}
#else
@group(0) @binding(2) var<storage, read> k: array<f32>;          // (Bk, Tk, H*D)
@group(0) @binding(3) var<storage, read> v: array<f32>;          // (Bk, Tk, H*D)
fn k_at(i: u32) -> f32 {
    return k[i];
}
fn v_at(i: u32) -> f32 {
    return v[i];
}
#endif
@group(0) @binding(4) var<storage, read> mask: array<f32>;       // (Tq, Tk) additive; unused unless has_mask
@group(0) @binding(5) var<storage, read_write> out: array<f32>;  // (B, Tq, H*D)

#include attn_len

var<workgroup> qs: array<f32, Q_CAP>;      // (QB, D) scaled queries
var<workgroup> acc: array<f32, Q_CAP>;     // (QB, D) unnormalised output
var<workgroup> ks: array<f32, KV_CAP>;     // (KT, D) key tile
var<workgroup> vs: array<f32, KV_CAP>;     // (KT, D) value tile
var<workgroup> ss: array<f32, S_CAP>;      // (QB, KT) scores, then probabilities
var<workgroup> m_run: array<f32, QB_MAX>;  // (QB) running max
var<workgroup> l_run: array<f32, QB_MAX>;  // (QB) running sum
var<workgroup> alpha: array<f32, QB_MAX>;  // (QB) rescale factor of this tile

@compute @workgroup_size(WG)
fn attention(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    if (g >= p.batch * p.heads * p.n_qblocks) {
        return;
    }
    let qblk = g % p.n_qblocks;
    let bh = g / p.n_qblocks;
    let h = bh % p.heads;
    let b = bh / p.heads;
    let hd = p.heads * D;
    let kb = select(b, 0u, p.bk == 1u);
    let row0 = qblk * QB;
    let rows = min(QB, p.tq - row0);

    for (var i = lid; i < QB * D; i += WG) {
        let r = i / D;
        var val = 0.0;
        if (r < rows) {
            val = q[(b * p.tq + row0 + r) * hd + h * D + i % D] * p.scale;
        }
        qs[i] = val;
        acc[i] = 0.0;
    }
    if (lid < QB) {
        m_run[lid] = NEG;
        l_run[lid] = 0.0;
    }
    var kend = kv_len();
    if (p.causal != 0u) {
        kend = min(kend, q_offset() + row0 + rows);
    }
    workgroupBarrier();

    for (var t0 = 0u; t0 < kend; t0 += KT) {
        let kn = min(KT, kend - t0);
        for (var i = lid; i < KT * D; i += WG) {
            let j = i / D;
            var kx = 0.0;
            var vx = 0.0;
            if (j < kn) {
                let idx = (kb * p.tk + t0 + j) * hd + h * D + i % D;
                kx = k_at(idx);
                vx = v_at(idx);
            }
            ks[i] = kx;
            vs[i] = vx;
        }
        workgroupBarrier();

        for (var i = lid; i < QB * KT; i += WG) {
            let r = i / KT;
            let j = i % KT;
            let key = t0 + j;
            let qrow = row0 + r;
            var ok = r < rows && j < kn;
            if (p.causal != 0u) {
                ok = ok && key <= q_offset() + qrow;
            }
            var s = NEG;
            if (ok) {
                var dot = 0.0;
                for (var d = 0u; d < D; d++) {
                    dot += qs[r * D + d] * ks[j * D + d];
                }
                if (p.has_mask != 0u) {
                    dot += mask[qrow * p.tk + key];
                }
                s = dot;
            }
            ss[i] = s;
        }
        workgroupBarrier();

        if (lid < QB) {
            let r = lid;
            let m_old = m_run[r];
            var mx = m_old;
            for (var j = 0u; j < KT; j++) {
                mx = max(mx, ss[r * KT + j]);
            }
            let a = exp(m_old - mx);
            var sum = 0.0;
            for (var j = 0u; j < KT; j++) {
                let s = ss[r * KT + j];
                var pj = 0.0;
                if (s > VISIBLE) {
                    pj = exp(s - mx);
                }
                ss[r * KT + j] = pj;
                sum += pj;
            }
            l_run[r] = l_run[r] * a + sum;
            m_run[r] = mx;
            alpha[r] = a;
        }
        workgroupBarrier();

        for (var i = lid; i < QB * D; i += WG) {
            let r = i / D;
            let d = i % D;
            var o = acc[i] * alpha[r];
            for (var j = 0u; j < KT; j++) {
                o += ss[r * KT + j] * vs[j * D + d];
            }
            acc[i] = o;
        }
        workgroupBarrier();
    }

    // Each invocation writes the acc elements it updated itself; l_run was published by the last barrier.
    for (var i = lid; i < QB * D; i += WG) {
        let r = i / D;
        if (r < rows) {
            let l = l_run[r];
            var o = 0.0;
            if (l > 0.0) {
                o = acc[i] / l;
            }
            out[(b * p.tq + row0 + r) * hd + h * D + i % D] = o;
        }
    }
}

// ---- decode: one query row per batch row --------------------------------------------------------------

var<workgroup> dscore: array<f32, DEC_MAXK>; // (kv_len) scores, then probabilities
var<workgroup> red: array<f32, 256>;     // (WG) reduction scratch
var<workgroup> part: array<f32, 256>;    // (G, D) partial outputs, G = WG / D groups of keys

@compute @workgroup_size(WG)
fn attention_decode(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    if (g >= p.batch * p.heads) {
        return;
    }
    let h = g % p.heads;
    let b = g / p.heads;
    let hd = p.heads * D;
    let kb = select(b, 0u, p.bk == 1u);
    var kend = min(kv_len(), DEC_MAXK);
    if (p.causal != 0u) {
        kend = min(kend, q_offset() + 1u);
    }
    for (var d = lid; d < D; d += WG) {
        qs[d] = q[b * hd + h * D + d] * p.scale;
    }
    workgroupBarrier();

    var mx = NEG;
    for (var j = lid; j < kend; j += WG) {
        let base = (kb * p.tk + j) * hd + h * D;
        var dot = 0.0;
        for (var d = 0u; d < D; d++) {
            dot += qs[d] * k_at(base + d);
        }
        if (p.has_mask != 0u) {
            dot += mask[j];
        }
        var s = NEG;
        if (dot > VISIBLE) {
            s = dot;
        }
        dscore[j] = s;
        mx = max(mx, s);
    }
    red[lid] = mx;
    workgroupBarrier();
    for (var w = WG / 2u; w > 0u; w = w / 2u) {
        if (lid < w) {
            red[lid] = max(red[lid], red[lid + w]);
        }
        workgroupBarrier();
    }
    let m = red[0];
    workgroupBarrier();

    var sum = 0.0;
    for (var j = lid; j < kend; j += WG) {
        let s = dscore[j];
        var pj = 0.0;
        if (s > VISIBLE) {
            pj = exp(s - m);
        }
        dscore[j] = pj;
        sum += pj;
    }
    red[lid] = sum;
    workgroupBarrier();
    for (var w = WG / 2u; w > 0u; w = w / 2u) {
        if (lid < w) {
            red[lid] += red[lid + w];
        }
        workgroupBarrier();
    }
    let l = red[0];
    var inv = 0.0;
    if (l > 0.0) {
        inv = 1.0 / l;
    }

    let vbase = kb * p.tk * hd + h * D;
    let out_base = b * hd + h * D;
    if (D >= WG) {
        for (var d = lid; d < D; d += WG) {
            var o = 0.0;
            for (var j = 0u; j < kend; j++) {
                o += dscore[j] * v_at(vbase + j * hd + d);
            }
            out[out_base + d] = o * inv;
        }
    } else {
        let groups = WG / D;
        let grp = lid / D;
        let d = lid % D;
        var o = 0.0;
        if (grp < groups) {
            for (var j = grp; j < kend; j += groups) {
                o += dscore[j] * v_at(vbase + j * hd + d);
            }
        }
        part[lid] = o;
        workgroupBarrier();
        if (lid < D) {
            var t = 0.0;
            for (var gg = 0u; gg < groups; gg++) {
                t += part[gg * D + lid];
            }
            out[out_base + lid] = t * inv;
        }
    }
}
