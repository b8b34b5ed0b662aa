// Florence-2 projector position terms, fused into one pass over the image tokens:
//   out[b, y*w + x, c] = (feats[b, y*w + x, c] + pos2d[y, x, c]) + temporal[0, c]
// where pos2d[y, x] = concat(column_embeddings[x] (ccol wide), row_embeddings[y] (C - ccol wide)): the
// COLUMN (x) half comes first, as in the reference's `torch.cat([x_emb, y_emb], dim=-1)`; and temporal
// row 0 is the cosine table's first row (sin 0, cos 0, ... = 0, 1, 0, 1, ...), added to every token of the
// single frame. The additions happen in the reference's order.
// One invocation per output element; the grid is folded by `grid_1d` (flat workgroup = wid.x + wid.y*nwg.x).

// WG, the workgroup size: from the launcher (src/ops/pos_embed.rs, SHADER's consts).

struct Params {
    n: u32,      // B*h*w*C output elements
    h: u32,      // token grid height
    w: u32,      // token grid width
    c: u32,      // channels C
    ccol: u32,   // width of the column half (C - C/2)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> feats: array<f32>;        // (B, h*w, C)
@group(0) @binding(2) var<storage, read> col_emb: array<f32>;      // (P, ccol)
@group(0) @binding(3) var<storage, read> row_emb: array<f32>;      // (P, C - ccol)
@group(0) @binding(4) var<storage, read> temporal: array<f32>;     // (T, C); row 0 used
@group(0) @binding(5) var<storage, read_write> out: array<f32>;    // (B, h*w, C)

@compute @workgroup_size(WG)
fn pos2d_temporal_add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * WG + lid;
    if (i >= p.n) {
        return;
    }
    let ch = i % p.c;
    let tok = (i / p.c) % (p.h * p.w);
    let y = tok / p.w;
    let x = tok % p.w;
    var pos: f32;
    if (ch < p.ccol) {
        pos = col_emb[x * p.ccol + ch];
    } else {
        pos = row_emb[y * (p.c - p.ccol) + (ch - p.ccol)];
    }
    out[i] = (feats[i] + pos) + temporal[ch];
}
