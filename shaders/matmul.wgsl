// Portable matrix multiplies (no subgroups, no f16 arithmetic): the fallback used in the browser and the
// reference every faster variant is tested against.
//
// linear: out[m, n_off + j] = act(sum_k x[m, k] * w[j, k] + bias[n_off + j]) for j in the bound weight
// rows. `w` is PyTorch's Linear layout (N, K); the launcher may bind only a row range of it (a chunk that
// fits one storage binding, e.g. the 51328x768 LM head) and dispatch once per chunk, writing the chunk's
// output columns starting at `n_off`. Weights are read as u32 words: f32 via bitcast, f16 stored packed two
// per word and widened with `unpack2x16float` (core WGSL; no shader-f16 needed). The element index inside
// the chunk is relative to the binding's start, which the host keeps 4-byte (even-element) aligned.
//
// Each invocation computes a TMxTN register block of outputs; an EDGE x EDGE workgroup covers
// (EDGE*TM)x(EDGE*TN) outputs. Accumulation is f32, in k order per output. TM, TN, EDGE and the tiled
// kernel's TILED_WG, TN_T and MAX_RM come from the launcher (src/ops/matmul.rs, SHADER's consts).

override W_F16: bool = false;

#include linear_params
@group(0) @binding(1) var<storage, read> x: array<f32>;          // (M, K)
@group(0) @binding(2) var<storage, read> w: array<u32>;          // (n_rows, K) chunk, f32 bits or packed f16
@group(0) @binding(3) var<storage, read> bias: array<f32>;       // (N) (unused unless flags & 1)
@group(0) @binding(4) var<storage, read_write> out: array<f32>;  // (M, N)
@group(0) @binding(5) var<storage, read> res: array<f32>;        // (M, N) (unused unless flags & 4)

fn w_at(e: u32) -> f32 {
    if (W_F16) {
        let pair = unpack2x16float(w[e >> 1u]);
        return select(pair.x, pair.y, (e & 1u) == 1u);
    }
    return bitcast<f32>(w[e]);
}

#include linear_epilogue

@compute @workgroup_size(EDGE, EDGE)
fn linear(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j0 = gid.x * TN; // local weight row (chunk column)
    let m0 = gid.y * TM;
    if (j0 >= p.n_rows || m0 >= p.m) {
        return;
    }
    var acc: array<array<f32, TN>, TM>;
    for (var i = 0u; i < TM; i++) {
        for (var j = 0u; j < TN; j++) {
            acc[i][j] = 0.0;
        }
    }
    // Clamp row/column indices so every load is in bounds; results of clamped lanes are not stored.
    var xr: array<u32, TM>;
    var wr: array<u32, TN>;
    for (var i = 0u; i < TM; i++) {
        xr[i] = min(m0 + i, p.m - 1u) * p.k;
    }
    for (var j = 0u; j < TN; j++) {
        wr[j] = min(j0 + j, p.n_rows - 1u) * p.k;
    }
    for (var kk = 0u; kk < p.k; kk++) {
        var a: array<f32, TM>;
        var b: array<f32, TN>;
        for (var i = 0u; i < TM; i++) {
            a[i] = x[xr[i] + kk];
        }
        for (var j = 0u; j < TN; j++) {
            b[j] = w_at(wr[j] + kk);
        }
        for (var i = 0u; i < TM; i++) {
            for (var j = 0u; j < TN; j++) {
                acc[i][j] = fma(a[i], b[j], acc[i][j]);
            }
        }
    }
    for (var i = 0u; i < TM; i++) {
        let m = m0 + i;
        if (m >= p.m) {
            break;
        }
        for (var j = 0u; j < TN; j++) {
            let jj = j0 + j;
            if (jj >= p.n_rows) {
                break;
            }
            let col = p.n_off + jj;
            out[m * p.n + col] = epilogue(acc[i][j], m, col);
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// linear_tiled: the GPU-class GEMM. A workgroup of 256 invocations (16 x 16) computes a (16*RM) x 64
// output tile (RM = 4: 64x64 tiles with 4x4 per invocation; RM = 8: 128x64 tiles with 8x4). K is walked
// in slices of TK = 16: the workgroup first copies the x and w slices it needs into workgroup memory
// (each element read from global memory once per tile instead of once per invocation that uses it),
// then every invocation reads its RM rows and 4 columns from there as vec4s and accumulates RM x 4
// products per k. This is the shape of the fast public WebGPU GEMMs: global traffic is cut by the tile
// edge (64-128x) and the inner loop is register-resident.
//
// Double buffering in registers: the next K slice is loaded from global memory into registers right
// after the barrier that publishes the current slice, so those loads are in flight while the invocation
// computes. Loads past M, N or K read zero, so any shape works, including K = 147 (the 7x7x3 conv
// stem after im2col) and ragged M / N edges; results outside the matrix are not stored.

override RM: u32 = 4u; // output rows per invocation (4 or MAX_RM)
const TK: u32 = 16u;   // K slice held in workgroup memory
// TN_T output columns per workgroup: COL_GROUPS invocations across of 4 columns each, TILED_WG /
// COL_GROUPS down of RM rows each.
const COL_GROUPS: u32 = TN_T / 4u;
const ROW_GROUPS: u32 = TILED_WG / COL_GROUPS;

// Slices stored k-major so an invocation's 4 consecutive rows (columns) are one vec4:
// xs[kk * (TM / 4) + r / 4][r % 4] = x[m0 + r, k0 + kk], ws likewise for w rows.
var<workgroup> xs: array<vec4<f32>, TK * (ROW_GROUPS * MAX_RM) / 4u>;
var<workgroup> ws: array<vec4<f32>, TK * TN_T / 4u>;

// Element `idx` of a (rows x TK) slice as (row, kk): consecutive invocations take consecutive k of one
// row, so global reads are contiguous.
fn x_at(row: u32, kk: u32) -> f32 {
    if (row < p.m && kk < p.k) {
        return x[row * p.k + kk];
    }
    return 0.0;
}

fn wt_at(row: u32, kk: u32) -> f32 {
    if (row < p.n_rows && kk < p.k) {
        return w_at(row * p.k + kk);
    }
    return 0.0;
}

@compute @workgroup_size(TILED_WG)
fn linear_tiled(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let tm = ROW_GROUPS * RM;
    let tx = lid % COL_GROUPS; // column group: columns 4 tx .. 4 tx + 4
    let ty = lid / COL_GROUPS; // row group: rows RM ty .. RM ty + RM
    // Grid x walks N, so consecutive workgroups share the same x rows (cache-friendly for both).
    let n0 = wid.x * TN_T;
    let m0 = wid.y * tm;
    // Each invocation moves RM elements of the x slice and 4 of the w slice per K step.
    var xr: array<f32, 8>;
    var wr: array<f32, 4>;
    for (var i = 0u; i < RM; i++) {
        let e = i * TILED_WG + lid;
        xr[i] = x_at(m0 + e / TK, e % TK);
    }
    for (var i = 0u; i < 4u; i++) {
        let e = i * TILED_WG + lid;
        wr[i] = wt_at(n0 + e / TK, e % TK);
    }
    var acc: array<vec4<f32>, 8>;
    for (var k0 = 0u; k0 < p.k; k0 += TK) {
        workgroupBarrier(); // everyone is done reading the previous slice
        for (var i = 0u; i < RM; i++) {
            let e = i * TILED_WG + lid;
            let r = e / TK;
            xs[(e % TK) * (tm / 4u) + r / 4u][r % 4u] = xr[i];
        }
        for (var i = 0u; i < 4u; i++) {
            let e = i * TILED_WG + lid;
            let r = e / TK;
            ws[(e % TK) * (TN_T / 4u) + r / 4u][r % 4u] = wr[i];
        }
        workgroupBarrier(); // the slice is published
        // Prefetch the next slice into registers while computing on this one.
        let k1 = k0 + TK;
        if (k1 < p.k) {
            for (var i = 0u; i < RM; i++) {
                let e = i * TILED_WG + lid;
                xr[i] = x_at(m0 + e / TK, k1 + e % TK);
            }
            for (var i = 0u; i < 4u; i++) {
                let e = i * TILED_WG + lid;
                wr[i] = wt_at(n0 + e / TK, k1 + e % TK);
            }
        }
        for (var kk = 0u; kk < TK; kk++) {
            let b = ws[kk * (TN_T / 4u) + tx];
            let a0 = xs[kk * (tm / 4u) + ty * (RM / 4u)];
            acc[0] = fma(vec4<f32>(a0.x), b, acc[0]);
            acc[1] = fma(vec4<f32>(a0.y), b, acc[1]);
            acc[2] = fma(vec4<f32>(a0.z), b, acc[2]);
            acc[3] = fma(vec4<f32>(a0.w), b, acc[3]);
            if (RM == MAX_RM) {
                let a1 = xs[kk * (tm / 4u) + ty * 2u + 1u];
                acc[4] = fma(vec4<f32>(a1.x), b, acc[4]);
                acc[5] = fma(vec4<f32>(a1.y), b, acc[5]);
                acc[6] = fma(vec4<f32>(a1.z), b, acc[6]);
                acc[7] = fma(vec4<f32>(a1.w), b, acc[7]);
            }
        }
    }
    for (var i = 0u; i < RM; i++) {
        let m = m0 + ty * RM + i;
        if (m >= p.m) {
            break;
        }
        for (var c = 0u; c < 4u; c++) {
            let j = n0 + tx * 4u + c;
            if (j < p.n_rows) {
                let col = p.n_off + j;
                out[m * p.n + col] = epilogue(acc[i][c], m, col);
            }
        }
    }
}
