// Scaled dot-product attention for CPU adapters (lavapipe): no workgroup memory, no barriers.
//
// Same contract as `attention` in attention.wgsl (KV_F16: k/v packed f16, widened on load, include/
// attn_kv4.wgsl): q (B, Tq, H*D), k/v (Bk, Tk, H*D) with Bk = B or 1,
// out (B, Tq, H*D), heads interleaved in columns (head h owns columns h*D .. h*D + D), optional causal
// rule (key j visible to query row i iff j < kv_len and j <= q_offset + i), additive mask (Tq, Tk), masked
// scores contribute exactly 0 and a row that sees no key outputs zeros.
//
// Why: on lavapipe a workgroupBarrier is a coroutine switch and shared-memory tiles do not pay (see
// window_attn.wgsl, the same idea for DaViT windows). Here each invocation keeps QPI (<= 4) query rows of one
// (batch row, head) in registers (pre-scaled) together with their running outputs, and streams that head's
// keys and values once for all its rows with an online softmax (running max m, sum l; the output is
// rescaled by exp(m_old - m_new) on every key). One vec4 load of k or v feeds 4*QPI multiply-adds.
// Invocations are ordered (batch row, head, group of QPI rows), row groups fastest, so the lanes of a
// subgroup mostly read the same key rows. D4 = head_dim / 4 (<= MAXD4) and QPI are override constants so
// the inner loops unroll and the register arrays need no dynamic indexing. The grid is folded by
// `grid_1d`: invocation g = (wid.x + wid.y * nwg.x) * WG + lid.
//
// Bounds (this shader is compiled without naga's run-time checks, `TRUSTED_SHADERS` in src/gpu/kernel.rs;
// the index clamps kept Mesa from unrolling: encoder-shaped call 0.66 s -> 0.48 s). Every access is in
// bounds for any input `ops::attention::attention_variant` accepts, because it checks q/out (B, Tq, H*D),
// k/v (Bk, Tk, H*D) with Bk in {1, B}, H*D = heads * D, D % 4 == 0, D4 = D/4 <= MAXD4, 1 <= QPI <= MAXQ,
// kv_len <= Tk, mask (Tq, Tk) when has_mask, and returns before dispatch when B or Tq is 0:
// - invocations g >= B*H*n_qgroups return first, so b < B, h < H, and kb = 0 or b < Bk;
// - q rows i = min(.., Tq - 1) < Tq; columns h*D4 + e < H*D4 since e < D4: q index < B*Tq*H*D4;
// - keys j < kend = max over rows of lim <= kv_len <= Tk: k/v index < Bk*Tk*H*D4 (the element count
//   of k/v in both variants: a vec4<f32> or, KV_F16, a vec2<u32> holds four channels);
//   (DYN_LEN: kv_len() is clamped to Tk in the shader; the launcher checks that dyn_len holds >= 2 u32s);
// - mask row[r] < Tq, j < Tk: index < Tq*Tk, read only when has_mask (the mask binding is then (Tq, Tk));
// - out rows i < Tq (checked): index < B*Tq*H*D4;
// - private arrays: r < QPI <= MAXQ = 4 and e < D4 <= MAXD4 = 20, so r*MAXD4 + e < 80; s, m, l, lim, row,
//   corr, pj are indexed by r < 4.

// From the launcher (src/ops/attention.rs, ROWS_SHADER's consts): MAX_WG, the largest workgroup; MAXD4,
// head_dim / 4 at most (head_dim <= 80); MAXQ, the most query rows per invocation.
override WG: u32 = MAX_WG;
override D4: u32 = 16;   // head_dim / 4
override QPI: u32 = MAXQ; // query rows per invocation (1..=MAXQ)

#include attn_params
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;          // (B, Tq, H*D/4)
// k, v (bindings 2, 3): (Bk, Tk, H*D/4) groups of four channels, f32 or packed f16 (KV_F16), read
// through k4 / v4.
@group(0) @binding(4) var<storage, read> mask: array<f32>;             // (Tq, Tk) additive; unused unless has_mask
@group(0) @binding(5) var<storage, read_write> out: array<vec4<f32>>;  // (B, Tq, H*D/4)

#include attn_len
#include attn_kv4

@compute @workgroup_size(WG)
fn attention_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let g = (wid.x + wid.y * nwg.x) * WG + lid;
    if (g >= p.batch * p.heads * p.n_qblocks) {
        return;
    }
    let qg = g % p.n_qblocks;
    let bh = g / p.n_qblocks;
    let h = bh % p.heads;
    let b = bh / p.heads;
    let hd4 = p.heads * D4;
    let kb = select(b, 0u, p.bk == 1u);
    let hoff = h * D4;

    var qr: array<vec4<f32>, MAXQ * MAXD4>;  // (MAXQ, MAXD4) scaled queries
    var o: array<vec4<f32>, MAXQ * MAXD4>;   // (MAXQ, MAXD4) unnormalised outputs
    var m: array<f32, MAXQ>;
    var l: array<f32, MAXQ>;
    var lim: array<u32, MAXQ>;        // keys visible to each row: j < lim[r]
    var row: array<u32, MAXQ>;        // clamped query row
    var kend = 0u;
    for (var r = 0u; r < QPI; r++) {
        let i = min(qg * QPI + r, p.tq - 1u);
        row[r] = i;
        let qb = (b * p.tq + i) * hd4 + hoff;
        for (var e = 0u; e < D4; e++) {
            qr[r * MAXD4 + e] = q[qb + e] * p.scale;
            o[r * MAXD4 + e] = vec4<f32>(0.0);
        }
        m[r] = NEG;
        l[r] = 0.0;
        var lr = kv_len();
        if (p.causal != 0u) {
            lr = min(lr, q_offset() + i + 1u);
        }
        lim[r] = lr;
        kend = max(kend, lr);
    }

    for (var j = 0u; j < kend; j++) {
        let kbase = (kb * p.tk + j) * hd4 + hoff;
        var s: array<f32, MAXQ>;
        for (var r = 0u; r < QPI; r++) {
            s[r] = 0.0;
        }
        for (var e = 0u; e < D4; e++) {
            let kv = k4(kbase + e);
            for (var r = 0u; r < QPI; r++) {
                s[r] += dot(qr[r * MAXD4 + e], kv);
            }
        }
        var corr: array<f32, MAXQ>;
        var pj: array<f32, MAXQ>;
        for (var r = 0u; r < QPI; r++) {
            var sr = s[r];
            if (p.has_mask != 0u) {
                sr += mask[row[r] * p.tk + j];
            }
            let vis = j < lim[r] && sr > VISIBLE;
            let mn = select(m[r], max(m[r], sr), vis);
            corr[r] = exp(m[r] - mn);
            pj[r] = select(0.0, exp(sr - mn), vis);
            l[r] = l[r] * corr[r] + pj[r];
            m[r] = mn;
        }
        for (var e = 0u; e < D4; e++) {
            let vv = v4(kbase + e);
            for (var r = 0u; r < QPI; r++) {
                o[r * MAXD4 + e] = o[r * MAXD4 + e] * corr[r] + pj[r] * vv;
            }
        }
    }

    for (var r = 0u; r < QPI; r++) {
        let i = qg * QPI + r;
        if (i < p.tq) {
            var inv = 0.0;
            if (l[r] > 0.0) {
                inv = 1.0 / l[r];
            }
            let ob = (b * p.tq + i) * hd4 + hoff;
            for (var e = 0u; e < D4; e++) {
                out[ob + e] = o[r * MAXD4 + e] * inv;
            }
        }
    }
}
