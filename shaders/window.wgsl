// DaViT window partition / reverse over channels-last tokens.
//
// `window_partition`: (B, H, W, C) -> (B*nWh*nWw, ws*ws, C). The image is conceptually zero-padded at the
// bottom and right up to multiples of ws (as the reference's F.pad does), then cut into ws x ws windows
// in row-major window order (b, window row, window column), tokens row-major inside each window.
// `window_reverse`: the inverse gather, (B*nWh*nWw, ws*ws, C) -> (B, H, W, C), dropping the padding.
//
// Both are pure gathers: one invocation per OUTPUT element computes which input element it copies (or a
// zero for padding), so writes are contiguous and no invocation races another. The grid is folded by
// `grid_1d` (flat workgroup = wid.x + wid.y * nwg.x).
//
// Variant VEC4 (C % 4 == 0; src/gpu/preprocess.rs): each invocation moves 4 channels of one token; `p.c`
// is then C/4 and `p.n` the output element count / 4. On CPU adapters a vec4 load costs about what a
// scalar one does.

// WG, the workgroup size: from the launcher (src/ops/window.rs, SHADER's consts).

struct Params {
    n: u32,    // output elements
    h: u32,    // image height (unpadded)
    w: u32,    // image width (unpadded)
    c: u32,    // channels
    ws: u32,   // window size
    nwh: u32,  // windows per column = ceil(h / ws)
    nww: u32,  // windows per row = ceil(w / ws)
    _pad0: u32,
}

#include lanes

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<F>;           // partition: (B, H, W, C); reverse: (B*nWh*nWw, ws*ws, C)
@group(0) @binding(2) var<storage, read_write> dst: array<F>;     // partition: (B*nWh*nWw, ws*ws, C); reverse: (B, H, W, C)

fn flat(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.x + wid.y * nwg.x) * WG + lid;
}

@compute @workgroup_size(WG)
fn window_partition(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i >= p.n) {
        return;
    }
    let ch = i % p.c;
    let tok = i / p.c;                 // b*nW*ws*ws + win*ws*ws + t
    let wsz = p.ws * p.ws;
    let t = tok % wsz;
    let win_all = tok / wsz;           // b*nW + win
    let nw = p.nwh * p.nww;
    let win = win_all % nw;
    let b = win_all / nw;
    let y = (win / p.nww) * p.ws + t / p.ws;
    let x = (win % p.nww) * p.ws + t % p.ws;
    var v = F(0.0);
    if (y < p.h && x < p.w) {
        v = src[((b * p.h + y) * p.w + x) * p.c + ch];
    }
    dst[i] = v;
}

@compute @workgroup_size(WG)
fn window_reverse(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i >= p.n) {
        return;
    }
    let ch = i % p.c;
    let pix = i / p.c;                 // (b*h + y)*w + x
    let x = pix % p.w;
    let by = pix / p.w;
    let y = by % p.h;
    let b = by / p.h;
    let win = (b * p.nwh + y / p.ws) * p.nww + x / p.ws;
    let t = (y % p.ws) * p.ws + x % p.ws;
    dst[i] = src[(win * p.ws * p.ws + t) * p.c + ch];
}
