// Register-blocked linear without subgroups and without workgroup memory (K % 8 == 0): the fast GEMM for
// adapters that expose no subgroups (SwiftShader, Chromium's CPU WebGPU) and a barrier-free candidate for
// GPUs. Requires `matmul_common.wgsl` in front (Params, bindings, `w_load8`, the epilogue).
//
// Each invocation computes an RM x 4 block of outputs (RM = 4, 8 or 16, an override constant: the tuner's
// variants reg4x4 / reg8x4 / reg16x4). Per 8-wide step along K it loads RM rows of x as two vec4 each and
// the 4 weight rows as two vec4 each (`w_load8`: f32, packed f16 or q8/q4 dequantized in registers), then
// does RM * 4 * 8 multiply-adds: 16x4 does 256 per 20 vec4 loads, four times the arithmetic per load of
// a 1x4 GEMV, which is what bounds a CPU adapter (every load whose address differs per lane is a gather)
// and a GPU's cache bandwidth alike. The accumulators are plain vec4 locals (one per row, the 4 columns in
// the lanes), never an array indexed in a loop, so they stay in registers; the rows beyond RM sit behind
// `if (RM >= ..)` on an override constant, which the compilers fold away at pipeline creation (the loop
// body is thus fully unrolled for each RM). The 4x4 block of one step is `a * B` with B a mat4x4 whose
// columns are the 4 weight quads: component c of a vec4 times mat4x4 is dot(a, B[c]).
//
// Grid: x walks N (WG invocations x 4 columns per workgroup), y walks M (RM rows per workgroup), so
// consecutive workgroups share the same RM rows of x (hot in cache) and stream different weight rows; all
// invocations of a workgroup read the same x addresses (uniform loads).
//
// Bounds (this module is compiled WITHOUT run-time bounds checks, `TRUSTED_SHADERS` in
// src/gpu/pipeline.rs): the launcher (`ops::matmul::linear_variant`) guarantees M >= 1, K >= 8,
// K % 8 == 0 (K % 32 == 0 for q8/q4), 1 <= n_rows, n_off + n_rows <= N, x bound whole with M*K f32, w
// bound with n_rows whole rows of its format, out (M, N) whole, bias (N) whenever flags & 1 and the
// residual (M, N) whenever flags & 4. With kq = K/4:
// - x: every row index is clamped to min(row, M-1), so the largest index read is
//   (M-1)*kq + 2*(K/8 - 1) + 1 = M*kq - 1.
// - w: weight rows are clamped to min(j, n_rows-1) and read through `w_load8(base, k8)` with
//   k8 < K/8, exactly as in `matmul_sg.wgsl` (whose header carries the proof for each format): every
//   word read lies below (row + 1) * (row words) <= the bound words.
// - out / bias / res: touched only for m < M and j < n_rows, at m*N + n_off + j < M*N and
//   bias[n_off + j] with n_off + j < N.

override WG: u32 = 64u;
override RM: u32 = 4u; // output rows per invocation: 4, 8 or 16

// Store one output row's 4 columns (row m, chunk columns j0..j0+4), skipping what lies outside.
fn store_row(v: vec4<f32>, m: u32, j0: u32) {
    if (m >= p.m) {
        return;
    }
    for (var c = 0u; c < 4u; c++) {
        let j = j0 + c;
        if (j < p.n_rows) {
            let col = p.n_off + j;
            out[m * p.n + col] = epilogue(v[c], m, col);
        }
    }
}

@compute @workgroup_size(WG)
fn linear_rb(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let j0 = (wid.x * WG + lid) * 4u;
    if (j0 >= p.n_rows) {
        return;
    }
    let m0 = wid.y * RM;
    let kq = p.k / 4u;
    let last = p.m - 1u;
    // Row bases of x, clamped: rows past the end recompute the last row and are not stored.
    let x0 = min(m0, last) * kq;
    let x1 = min(m0 + 1u, last) * kq;
    let x2 = min(m0 + 2u, last) * kq;
    let x3 = min(m0 + 3u, last) * kq;
    let x4 = min(m0 + 4u, last) * kq;
    let x5 = min(m0 + 5u, last) * kq;
    let x6 = min(m0 + 6u, last) * kq;
    let x7 = min(m0 + 7u, last) * kq;
    let x8 = min(m0 + 8u, last) * kq;
    let x9 = min(m0 + 9u, last) * kq;
    let x10 = min(m0 + 10u, last) * kq;
    let x11 = min(m0 + 11u, last) * kq;
    let x12 = min(m0 + 12u, last) * kq;
    let x13 = min(m0 + 13u, last) * kq;
    let x14 = min(m0 + 14u, last) * kq;
    let x15 = min(m0 + 15u, last) * kq;
    let jl = p.n_rows - 1u;
    let wb0 = w_row_base(min(j0, jl));
    let wb1 = w_row_base(min(j0 + 1u, jl));
    let wb2 = w_row_base(min(j0 + 2u, jl));
    let wb3 = w_row_base(min(j0 + 3u, jl));
    var c0 = vec4<f32>(0.0);
    var c1 = vec4<f32>(0.0);
    var c2 = vec4<f32>(0.0);
    var c3 = vec4<f32>(0.0);
    var c4 = vec4<f32>(0.0);
    var c5 = vec4<f32>(0.0);
    var c6 = vec4<f32>(0.0);
    var c7 = vec4<f32>(0.0);
    var c8 = vec4<f32>(0.0);
    var c9 = vec4<f32>(0.0);
    var c10 = vec4<f32>(0.0);
    var c11 = vec4<f32>(0.0);
    var c12 = vec4<f32>(0.0);
    var c13 = vec4<f32>(0.0);
    var c14 = vec4<f32>(0.0);
    var c15 = vec4<f32>(0.0);
    for (var k8 = 0u; k8 < p.k / 8u; k8++) {
        let b0 = w_load8(wb0, k8);
        let b1 = w_load8(wb1, k8);
        let b2 = w_load8(wb2, k8);
        let b3 = w_load8(wb3, k8);
        // Columns of lo/hi: the 4 weight rows' k-quads 2 k8 and 2 k8 + 1.
        let lo = mat4x4<f32>(b0[0], b1[0], b2[0], b3[0]);
        let hi = mat4x4<f32>(b0[1], b1[1], b2[1], b3[1]);
        let o = 2u * k8;
        c0 += x[x0 + o] * lo + x[x0 + o + 1u] * hi;
        c1 += x[x1 + o] * lo + x[x1 + o + 1u] * hi;
        c2 += x[x2 + o] * lo + x[x2 + o + 1u] * hi;
        c3 += x[x3 + o] * lo + x[x3 + o + 1u] * hi;
        if (RM >= 8u) {
            c4 += x[x4 + o] * lo + x[x4 + o + 1u] * hi;
            c5 += x[x5 + o] * lo + x[x5 + o + 1u] * hi;
            c6 += x[x6 + o] * lo + x[x6 + o + 1u] * hi;
            c7 += x[x7 + o] * lo + x[x7 + o + 1u] * hi;
        }
        if (RM >= 16u) {
            c8 += x[x8 + o] * lo + x[x8 + o + 1u] * hi;
            c9 += x[x9 + o] * lo + x[x9 + o + 1u] * hi;
            c10 += x[x10 + o] * lo + x[x10 + o + 1u] * hi;
            c11 += x[x11 + o] * lo + x[x11 + o + 1u] * hi;
            c12 += x[x12 + o] * lo + x[x12 + o + 1u] * hi;
            c13 += x[x13 + o] * lo + x[x13 + o + 1u] * hi;
            c14 += x[x14 + o] * lo + x[x14 + o + 1u] * hi;
            c15 += x[x15 + o] * lo + x[x15 + o + 1u] * hi;
        }
    }
    store_row(c0, m0, j0);
    store_row(c1, m0 + 1u, j0);
    store_row(c2, m0 + 2u, j0);
    store_row(c3, m0 + 3u, j0);
    if (RM >= 8u) {
        store_row(c4, m0 + 4u, j0);
        store_row(c5, m0 + 5u, j0);
        store_row(c6, m0 + 6u, j0);
        store_row(c7, m0 + 7u, j0);
    }
    if (RM >= 16u) {
        store_row(c8, m0 + 8u, j0);
        store_row(c9, m0 + 9u, j0);
        store_row(c10, m0 + 10u, j0);
        store_row(c11, m0 + 11u, j0);
        store_row(c12, m0 + 12u, j0);
        store_row(c13, m0 + 13u, j0);
        store_row(c14, m0 + 14u, j0);
        store_row(c15, m0 + 15u, j0);
    }
}
