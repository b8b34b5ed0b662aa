// DaViT window attention, fused: reads the qkv Linear's output (nW, T, 3C) for T = ws*ws tokens per window
// (columns q | k | v, heads interleaved inside each: head h owns columns h*D .. h*D + D), and writes
// softmax(q k^T * scale) v per (window, head) into (nW, T, C), heads interleaved the same way.
//
// Why a dedicated kernel: T is small (144) and there are thousands of (window, head) pairs. Each
// invocation keeps QPI = 4 query rows of one (window, head) in registers and streams the window's keys and
// values once for all four, with an online (running max) softmax, so one vec4 load of k or v feeds 16
// multiply-adds and no workgroup memory or barrier is needed (barriers are coroutine switches on CPU
// adapters; shared-memory tiling does not pay there). `D4` (head_dim / 4, <= MAXD4) is an override so the
// inner loops unroll and the register arrays stay in registers. q is pre-scaled by `scale`.
// One invocation per (window, head, group of 4 query rows); the grid is folded by `grid_1d`.

// From the launcher (src/ops/window_attn.rs, SHADER's consts): WG, the workgroup size; MAXD4, head_dim / 4
// at most (head_dim <= 32: every released Florence-2); QPI = 4, the query rows per invocation (the s.x ..
// s.w lanes below).
override D4: u32 = MAXD4;       // head_dim / 4

struct Params {
    total: u32,   // nW * heads * nqg invocations
    t: u32,       // tokens per window
    heads: u32,
    c4: u32,      // C / 4
    nqg: u32,     // ceil(t / QPI)
    _pad0: u32,
    scale: f32,   // head_dim^-0.5
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> qkv: array<vec4<f32>>;        // (nW, T, 3C/4)
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;  // (nW, T, C/4)

@compute @workgroup_size(WG)
fn window_attention(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let g = (wid.x + wid.y * nwg.x) * WG + lid;
    if (g >= p.total) {
        return;
    }
    let qg = g % p.nqg;
    let wh = g / p.nqg;
    let h = wh % p.heads;
    let win = wh / p.heads;
    let row3 = 3u * p.c4;
    let base = win * p.t;
    let hoff = h * D4;
    var q: array<vec4<f32>, QPI * MAXD4>;
    var o: array<vec4<f32>, QPI * MAXD4>;
    var m = vec4<f32>(-3.0e38);
    var l = vec4<f32>(0.0);
    for (var r = 0u; r < QPI; r++) {
        let tq = min(qg * QPI + r, p.t - 1u);
        let qb = (base + tq) * row3 + hoff;
        for (var e = 0u; e < D4; e++) {
            q[r * MAXD4 + e] = qkv[qb + e] * p.scale;
            o[r * MAXD4 + e] = vec4<f32>(0.0);
        }
    }
    for (var j = 0u; j < p.t; j++) {
        let kb = (base + j) * row3 + p.c4 + hoff;
        let vb = kb + p.c4;
        var s = vec4<f32>(0.0);
        for (var e = 0u; e < D4; e++) {
            let kv = qkv[kb + e];
            s.x += dot(q[e], kv);
            s.y += dot(q[MAXD4 + e], kv);
            s.z += dot(q[2u * MAXD4 + e], kv);
            s.w += dot(q[3u * MAXD4 + e], kv);
        }
        let mn = max(m, s);
        let corr = exp(m - mn);
        let pj = exp(s - mn);
        l = l * corr + pj;
        m = mn;
        for (var e = 0u; e < D4; e++) {
            let vv = qkv[vb + e];
            o[e] = o[e] * corr.x + pj.x * vv;
            o[MAXD4 + e] = o[MAXD4 + e] * corr.y + pj.y * vv;
            o[2u * MAXD4 + e] = o[2u * MAXD4 + e] * corr.z + pj.z * vv;
            o[3u * MAXD4 + e] = o[3u * MAXD4 + e] * corr.w + pj.w * vv;
        }
    }
    let inv = 1.0 / l;
    for (var r = 0u; r < QPI; r++) {
        let tq = qg * QPI + r;
        if (tq >= p.t) {
            break;
        }
        let ob = (base + tq) * p.c4 + hoff;
        for (var e = 0u; e < D4; e++) {
            out[ob + e] = o[r * MAXD4 + e] * inv[r];
        }
    }
}
