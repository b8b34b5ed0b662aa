// Convolutions over channels-last images (B, H, W, C), the layout every DaViT stage keeps its tokens in.
//
// `im2col`: a dense convolution is a GEMM. This kernel gathers, for each output pixel (row), the
// Cin*kh*kw input values its kernel window covers (zero outside the image) into a (rows, Cin*kh*kw) matrix
// whose column order (ci, ky, kx) is exactly the flattened PyTorch weight (Cout, Cin, kh, kw). The launcher
// then runs the tuned `linear` GEMM with that weight as a (Cout, Cin*kh*kw) Linear weight. One invocation
// writes one element of the matrix; the grid is folded by `grid_1d` (flat workgroup = wid.x + wid.y*nwg.x).
// `row0` lets the launcher build the matrix in row chunks that each fit one storage binding. Rows are
// `kp` >= Cin*kh*kw wide: the columns past Cin*kh*kw are zeros, so a K that is not a multiple of the fast
// GEMMs' K step (147 for the 7x7 RGB stem) is padded to one (152), and `pad_weight` pads the weight
// (Cout, K) to (Cout, kp) with zero columns to match: the padded products are exact zeros, so the GEMM's
// result is the unpadded one.
//
// `pad_weight`: wdst (Cout, kp) f32 = wsrc (Cout, K) zero-padded, wsrc f32 or (W_F16) packed f16 pairs
// over the flat element index; one invocation per output element (`p.rows` = Cout).
//
// `dwconv3x3_residual`: DaViT's depthwise positional conv (groups = C, 3x3, pad 1) with its bias and the
// residual fused: out = x + dwconv(x) + bias. The launcher transposes the weight (C, 1, 3, 3) to (9, C), so
// that tap t's weights for neighbouring channels are neighbours. One invocation per output element;
// neighbouring invocations read neighbouring channels of the same pixel, so the nine taps are contiguous
// loads across a workgroup. Variant VEC4 (C % 4 == 0; src/gpu/preprocess.rs): the arrays hold vec4<f32>,
// 4 channels of one pixel per invocation (9 x + 9 w + 1 bias vec4 loads per 4 outputs instead of 76
// scalar loads); `dp.c` is then C/4 and `dp.n` the element count / 4.

// WG, the workgroup size: from the launcher (src/ops/conv.rs, SHADER's consts).

struct Im2colParams {
    h: u32,       // input height
    w: u32,       // input width
    cin: u32,     // input channels
    ho: u32,      // output height
    wo: u32,      // output width
    kh: u32,      // kernel height
    kw: u32,      // kernel width
    stride: u32,
    pad: u32,
    row0: u32,    // first output row (b*ho*wo + oy*wo + ox) of this chunk
    rows: u32,    // rows in this chunk (pad_weight: Cout)
    kp: u32,      // row stride of cols / wdst, >= cin*kh*kw
}

struct DwParams {
    n: u32,       // B*H*W*C elements
    h: u32,
    w: u32,
    c: u32,
}

@group(0) @binding(0) var<uniform> p: Im2colParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;            // (B, H, W, Cin)
@group(0) @binding(2) var<storage, read_write> cols: array<f32>;   // (rows, kp)

// pad_weight
override W_F16: bool = false;
@group(0) @binding(1) var<storage, read> wsrc: array<u32>;         // (Cout, K) f32 bits or packed f16
@group(0) @binding(2) var<storage, read_write> wdst: array<f32>;   // (Cout, kp)

fn flat(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.x + wid.y * nwg.x) * WG + lid;
}

@compute @workgroup_size(WG)
fn im2col(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    let kk = p.kh * p.kw;
    let k = p.cin * kk;
    if (i >= p.rows * p.kp) {
        return;
    }
    let r = i / p.kp;
    let col = i - r * p.kp;
    if (col >= k) {
        cols[i] = 0.0;
        return;
    }
    let ci = col / kk;
    let t = col - ci * kk;
    let ky = t / p.kw;
    let kx = t - ky * p.kw;
    let row = p.row0 + r;
    let hw = p.ho * p.wo;
    let b = row / hw;
    let q = row - b * hw;
    let oy = q / p.wo;
    let ox = q - oy * p.wo;
    // Signed arithmetic for the padded border.
    let iy = i32(oy * p.stride + ky) - i32(p.pad);
    let ix = i32(ox * p.stride + kx) - i32(p.pad);
    var v = 0.0;
    if (iy >= 0 && ix >= 0 && iy < i32(p.h) && ix < i32(p.w)) {
        v = x[((b * p.h + u32(iy)) * p.w + u32(ix)) * p.cin + ci];
    }
    cols[i] = v;
}

#include lanes

@group(0) @binding(0) var<uniform> dp: DwParams;
@group(0) @binding(1) var<storage, read> dx: array<F>;           // (B, H, W, C)
@group(0) @binding(2) var<storage, read> dwt: array<F>;          // (9, C): weight[c, 0, ky, kx] at row ky*3+kx
@group(0) @binding(3) var<storage, read> db: array<F>;           // (C)
@group(0) @binding(4) var<storage, read_write> dout: array<F>;   // (B, H, W, C)

@compute @workgroup_size(WG)
fn dwconv3x3_residual(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i >= dp.n) {
        return;
    }
    let c = i % dp.c;
    let pix = i / dp.c;
    let xx = pix % dp.w;
    let bh = pix / dp.w;
    let y = bh % dp.h;
    let b = bh / dp.h;
    var acc = db[c];
    for (var ky = 0u; ky < 3u; ky++) {
        let iy = i32(y) + i32(ky) - 1;
        if (iy < 0 || iy >= i32(dp.h)) {
            continue;
        }
        for (var kx = 0u; kx < 3u; kx++) {
            let ix = i32(xx) + i32(kx) - 1;
            if (ix < 0 || ix >= i32(dp.w)) {
                continue;
            }
            acc += dwt[(ky * 3u + kx) * dp.c + c] * dx[((b * dp.h + u32(iy)) * dp.w + u32(ix)) * dp.c + c];
        }
    }
    dout[i] = dx[i] + acc;
}

@compute @workgroup_size(WG)
fn pad_weight(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i >= p.rows * p.kp) {
        return;
    }
    let k = p.cin * p.kh * p.kw;
    let r = i / p.kp;
    let col = i - r * p.kp;
    var v = 0.0;
    if (col < k) {
        let e = r * k + col;
        if (W_F16) {
            v = unpack2x16float(wsrc[e >> 1u])[e & 1u];
        } else {
            v = bitcast<f32>(wsrc[e]);
        }
    }
    wdst[i] = v;
}
