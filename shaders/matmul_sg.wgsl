#include matmul_common
// Subgroup linear for K % 8 == 0 (needs wgpu's SUBGROUP feature and subgroups of at least 8 lanes; the
// launcher checks). An 8x8 register block per invocation, as `matmul_rb.wgsl`'s reg8x8, but x is not
// loaded by every lane: all invocations of a workgroup share the same 8 rows, so lane l of each subgroup
// loads only row (l mod 8)'s next 8 k-values and the subgroup shares them with `subgroupBroadcast` from
// constant lanes 0..7. On CPU adapters (lavapipe) a storage load whose address is not a compile-time
// constant becomes a scalar loop over the lanes, so this cuts x's loads 8-fold; on GPUs it saves cache
// bandwidth.
// No barriers, no shared memory. Broadcasts run in uniform control flow: out-of-range lanes are clamped,
// never returned early. Params, bindings, weight loads and the epilogue: `#include matmul_common`.
//
// This module is compiled WITHOUT run-time bounds checks (`TRUSTED_SHADERS` in src/gpu/kernel.rs), so
// every access below must be provably in bounds. The launcher (`ops::matmul::linear_variant`) guarantees:
// M >= 1, K >= 8 and K % 8 == 0 (K % 32 == 0 for `linear_gemv_sg`), 1 <= n_rows, n_off + n_rows <= N,
// x bound whole with M*K f32, w bound with n_rows*K f32 (n_rows*K/8 vec4<u32> for f16), out (M, N) whole,
// bias (N) bound whenever flags & 1, MR = min(M, 4) for the GEMV (its row groups along grid z). With kq = K/4:
// - x: row indices are clamped to min(row, M-1); the largest index read is (M-1)*kq + 2*(K/8 - 1) + 1 =
//   M*kq - 1 (GEMV: gemv_row(g, r) <= M - 1, so gemv_row*kq + 8*(K/32 - 1) + 7 <= M*kq - 1).
// - w: weight rows are clamped to min(j, n_rows-1); `w_load8(base, k8)` reads base + 2*k8 + 1 (f32,
//   base = row*kq) or base + k8 (f16, base = row*K/8), with k8 < K/8: below n_rows*kq or n_rows*K/8.
//   Quantized (W_Q = 8 or 4, K % 32 == 0): base = row*R with R = QW + SW row words (QW = K*W_Q/128 quant
//   words, SW = ceil(K/256) scale words); `q_load8` reads base + k8/2 < base + K/16 = base + QW (q8) or
//   base + k8/4 < base + K/32 = base + QW (q4), and the scale word base + QW + blk/8 with
//   blk = k8/4 < K/32, so blk/8 < ceil(K/256) = SW: all below (row + 1)*R <= n_rows*R words, which the
//   launcher binds. Vector components are indexed by values reduced mod 4 or mod 2, or by h + 1 <= 3.
// - out / bias / res: touched only for m < M and j < n_rows, at m*N + n_off + j < M*N (res: the same
//   index, bound (M, N) whenever flags & 4); bias[n_off + j] < N.
// - function-scope arrays: every index is a loop counter bounded by the array length (8, 16 or 4; xv and
//   acc of the GEMV are length 4 and indexed by r < MR <= 4).

// From the launcher (src/ops/matmul.rs, SHADER_SG's consts): SG_WG, the default workgroup size, and each
// kernel's output block per invocation, rows x columns: SG_M x SG_N (`linear_sg`), C4_M x C4_N
// (`linear_sg_c4`), R16_M x R16_N (`linear_sg_r16`).
override WG: u32 = SG_WG;

// acc[2 r + h] += broadcast(av, r) . b_c for the 8 columns c; av is this lane's row (l mod 8) k-quad.
fn fma_block_sg(acc: ptr<function, array<vec4<f32>, 16>>, av: vec4<f32>, b: array<vec4<f32>, 8>) {
    let a0 = subgroupBroadcast(av, 0u);
    (*acc)[0] += vec4<f32>(dot(a0, b[0]), dot(a0, b[1]), dot(a0, b[2]), dot(a0, b[3]));
    (*acc)[1] += vec4<f32>(dot(a0, b[4]), dot(a0, b[5]), dot(a0, b[6]), dot(a0, b[7]));
    let a1 = subgroupBroadcast(av, 1u);
    (*acc)[2] += vec4<f32>(dot(a1, b[0]), dot(a1, b[1]), dot(a1, b[2]), dot(a1, b[3]));
    (*acc)[3] += vec4<f32>(dot(a1, b[4]), dot(a1, b[5]), dot(a1, b[6]), dot(a1, b[7]));
    let a2 = subgroupBroadcast(av, 2u);
    (*acc)[4] += vec4<f32>(dot(a2, b[0]), dot(a2, b[1]), dot(a2, b[2]), dot(a2, b[3]));
    (*acc)[5] += vec4<f32>(dot(a2, b[4]), dot(a2, b[5]), dot(a2, b[6]), dot(a2, b[7]));
    let a3 = subgroupBroadcast(av, 3u);
    (*acc)[6] += vec4<f32>(dot(a3, b[0]), dot(a3, b[1]), dot(a3, b[2]), dot(a3, b[3]));
    (*acc)[7] += vec4<f32>(dot(a3, b[4]), dot(a3, b[5]), dot(a3, b[6]), dot(a3, b[7]));
    let a4 = subgroupBroadcast(av, 4u);
    (*acc)[8] += vec4<f32>(dot(a4, b[0]), dot(a4, b[1]), dot(a4, b[2]), dot(a4, b[3]));
    (*acc)[9] += vec4<f32>(dot(a4, b[4]), dot(a4, b[5]), dot(a4, b[6]), dot(a4, b[7]));
    let a5 = subgroupBroadcast(av, 5u);
    (*acc)[10] += vec4<f32>(dot(a5, b[0]), dot(a5, b[1]), dot(a5, b[2]), dot(a5, b[3]));
    (*acc)[11] += vec4<f32>(dot(a5, b[4]), dot(a5, b[5]), dot(a5, b[6]), dot(a5, b[7]));
    let a6 = subgroupBroadcast(av, 6u);
    (*acc)[12] += vec4<f32>(dot(a6, b[0]), dot(a6, b[1]), dot(a6, b[2]), dot(a6, b[3]));
    (*acc)[13] += vec4<f32>(dot(a6, b[4]), dot(a6, b[5]), dot(a6, b[6]), dot(a6, b[7]));
    let a7 = subgroupBroadcast(av, 7u);
    (*acc)[14] += vec4<f32>(dot(a7, b[0]), dot(a7, b[1]), dot(a7, b[2]), dot(a7, b[3]));
    (*acc)[15] += vec4<f32>(dot(a7, b[4]), dot(a7, b[5]), dot(a7, b[6]), dot(a7, b[7]));
}

@compute @workgroup_size(WG)
fn linear_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
             @builtin(subgroup_invocation_id) sl: u32) {
    let m0 = wid.x * SG_M;
    let j0 = (wid.y * WG + lid) * SG_N;
    let kq = p.k / 4u;
    // This lane's share of x: row m0 + (sl mod 8), clamped (rows past the end are never stored).
    let xb = min(m0 + (sl & 7u), p.m - 1u) * kq;
    var wb: array<u32, 8>;
    for (var i = 0u; i < 8u; i++) {
        wb[i] = w_row_base(min(j0 + i, p.n_rows - 1u));
    }
    var acc: array<vec4<f32>, 16>;
    for (var k8 = 0u; k8 < p.k / 8u; k8++) {
        let alo = x[xb + 2u * k8];
        let ahi = x[xb + 2u * k8 + 1u];
        var blo: array<vec4<f32>, 8>;
        var bhi: array<vec4<f32>, 8>;
        for (var i = 0u; i < 8u; i++) {
            let b = w_load8(wb[i], k8);
            blo[i] = b[0];
            bhi[i] = b[1];
        }
        fma_block_sg(&acc, alo, blo);
        fma_block_sg(&acc, ahi, bhi);
    }
    store_block(&acc, m0, j0);
}

// Narrower register block: 8 rows x 4 columns per invocation (half the accumulators of `linear_sg`, so
// fewer register spills on CPU adapters; twice the x broadcasts per flop).
fn fma_block_sg4(acc: ptr<function, array<vec4<f32>, 8>>, av: vec4<f32>, b: array<vec4<f32>, 4>) {
    let a0 = subgroupBroadcast(av, 0u);
    (*acc)[0] += vec4<f32>(dot(a0, b[0]), dot(a0, b[1]), dot(a0, b[2]), dot(a0, b[3]));
    let a1 = subgroupBroadcast(av, 1u);
    (*acc)[1] += vec4<f32>(dot(a1, b[0]), dot(a1, b[1]), dot(a1, b[2]), dot(a1, b[3]));
    let a2 = subgroupBroadcast(av, 2u);
    (*acc)[2] += vec4<f32>(dot(a2, b[0]), dot(a2, b[1]), dot(a2, b[2]), dot(a2, b[3]));
    let a3 = subgroupBroadcast(av, 3u);
    (*acc)[3] += vec4<f32>(dot(a3, b[0]), dot(a3, b[1]), dot(a3, b[2]), dot(a3, b[3]));
    let a4 = subgroupBroadcast(av, 4u);
    (*acc)[4] += vec4<f32>(dot(a4, b[0]), dot(a4, b[1]), dot(a4, b[2]), dot(a4, b[3]));
    let a5 = subgroupBroadcast(av, 5u);
    (*acc)[5] += vec4<f32>(dot(a5, b[0]), dot(a5, b[1]), dot(a5, b[2]), dot(a5, b[3]));
    let a6 = subgroupBroadcast(av, 6u);
    (*acc)[6] += vec4<f32>(dot(a6, b[0]), dot(a6, b[1]), dot(a6, b[2]), dot(a6, b[3]));
    let a7 = subgroupBroadcast(av, 7u);
    (*acc)[7] += vec4<f32>(dot(a7, b[0]), dot(a7, b[1]), dot(a7, b[2]), dot(a7, b[3]));
}

@compute @workgroup_size(WG)
fn linear_sg_c4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
                @builtin(subgroup_invocation_id) sl: u32) {
    let m0 = wid.x * C4_M;
    let j0 = (wid.y * WG + lid) * C4_N;
    let xb = min(m0 + (sl & 7u), p.m - 1u) * (p.k / 4u);
    var wb: array<u32, 4>;
    for (var i = 0u; i < 4u; i++) {
        wb[i] = w_row_base(min(j0 + i, p.n_rows - 1u));
    }
    var acc: array<vec4<f32>, 8>;
    for (var k8 = 0u; k8 < p.k / 8u; k8++) {
        let alo = x[xb + 2u * k8];
        let ahi = x[xb + 2u * k8 + 1u];
        let b0 = w_load8(wb[0], k8);
        let b1 = w_load8(wb[1], k8);
        let b2 = w_load8(wb[2], k8);
        let b3 = w_load8(wb[3], k8);
        fma_block_sg4(&acc, alo, array<vec4<f32>, 4>(b0[0], b1[0], b2[0], b3[0]));
        fma_block_sg4(&acc, ahi, array<vec4<f32>, 4>(b0[1], b1[1], b2[1], b3[1]));
    }
    for (var r = 0u; r < 8u; r++) {
        let m = m0 + r;
        if (m >= p.m) {
            return;
        }
        for (var c = 0u; c < 4u; c++) {
            let j = j0 + c;
            if (j < p.n_rows) {
                let col = p.n_off + j;
                out[m * p.n + col] = epilogue(acc[r][c], m, col);
            }
        }
    }
}

// Decode GEMV (M <= 4, K % 32 == 0) with x shared through the subgroup: one output column per lane, as
// `matmul_gemv.wgsl`, but lane l loads only x's k-quad (l mod 8) of each 32-wide k step and the others get
// it by `subgroupBroadcast`, so the MR rows of x cost one gather per 32 k instead of eight.
override MR: u32 = 1u; // rows of x per row group (grid z), = min(M, 4); see matmul_gemv.wgsl's gemv_row

fn gemv_row(g: u32, r: u32) -> u32 {
    return min(g * MR + r, p.m - 1u);
}


@compute @workgroup_size(WG)
fn linear_gemv_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32, @builtin(subgroup_invocation_id) sl: u32) {
    let j = (wid.x + wid.y * nwg.x) * WG + lid;
    // Lanes past the end compute the last column again (broadcasts need every lane) and store nothing.
    let wb = w_row_base(min(j, p.n_rows - 1u));
    let kq = p.k / 4u;
    let q = sl & 7u;
    var acc = array<vec4<f32>, 4>();
    for (var k32 = 0u; k32 < p.k / 32u; k32++) {
        var xv: array<vec4<f32>, 4>;
        for (var r = 0u; r < MR; r++) {
            xv[r] = x[gemv_row(wid.z, r) * kq + 8u * k32 + q];
        }
        let k8 = 4u * k32;
        let b0 = w_load8(wb, k8);
        let b1 = w_load8(wb, k8 + 1u);
        let b2 = w_load8(wb, k8 + 2u);
        let b3 = w_load8(wb, k8 + 3u);
        for (var r = 0u; r < MR; r++) {
            let v = xv[r];
            var a = acc[r];
            a = fma(subgroupBroadcast(v, 0u), b0[0], a);
            a = fma(subgroupBroadcast(v, 1u), b0[1], a);
            a = fma(subgroupBroadcast(v, 2u), b1[0], a);
            a = fma(subgroupBroadcast(v, 3u), b1[1], a);
            a = fma(subgroupBroadcast(v, 4u), b2[0], a);
            a = fma(subgroupBroadcast(v, 5u), b2[1], a);
            a = fma(subgroupBroadcast(v, 6u), b3[0], a);
            a = fma(subgroupBroadcast(v, 7u), b3[1], a);
            acc[r] = a;
        }
    }
    if (j >= p.n_rows) {
        return;
    }
    let col = p.n_off + j;
    for (var r = 0u; r < MR; r++) {
        let row = wid.z * MR + r;
        if (row < p.m) {
            let a = acc[r];
            out[row * p.n + col] = epilogue((a.x + a.y) + (a.z + a.w), row, col);
        }
    }
}

// Taller register block: 16 rows x 4 columns per invocation. Lane l loads k-quads of rows (l mod 8) and
// 8 + (l mod 8); x costs 2 gathers and w 4 per k-quad (f32) for 64 multiply-adds, so more of the time goes
// to arithmetic than in the 8-row kernels. Workgroups cover 16 rows (grid x) x 4*WG columns (grid y).
@compute @workgroup_size(WG)
fn linear_sg_r16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
                 @builtin(subgroup_invocation_id) sl: u32) {
    let m0 = wid.x * R16_M;
    let j0 = (wid.y * WG + lid) * R16_N;
    let kq = p.k / 4u;
    let xb0 = min(m0 + (sl & 7u), p.m - 1u) * kq;
    let xb1 = min(m0 + 8u + (sl & 7u), p.m - 1u) * kq;
    var wb: array<u32, 4>;
    for (var i = 0u; i < 4u; i++) {
        wb[i] = w_row_base(min(j0 + i, p.n_rows - 1u));
    }
    var acc0: array<vec4<f32>, 8>;
    var acc1: array<vec4<f32>, 8>;
    for (var k8 = 0u; k8 < p.k / 8u; k8++) {
        let b0 = w_load8(wb[0], k8);
        let b1 = w_load8(wb[1], k8);
        let b2 = w_load8(wb[2], k8);
        let b3 = w_load8(wb[3], k8);
        let blo = array<vec4<f32>, 4>(b0[0], b1[0], b2[0], b3[0]);
        let bhi = array<vec4<f32>, 4>(b0[1], b1[1], b2[1], b3[1]);
        fma_block_sg4(&acc0, x[xb0 + 2u * k8], blo);
        fma_block_sg4(&acc0, x[xb0 + 2u * k8 + 1u], bhi);
        fma_block_sg4(&acc1, x[xb1 + 2u * k8], blo);
        fma_block_sg4(&acc1, x[xb1 + 2u * k8 + 1u], bhi);
    }
    for (var r = 0u; r < 16u; r++) {
        let m = m0 + r;
        if (m >= p.m) {
            return;
        }
        for (var c = 0u; c < 4u; c++) {
            let j = j0 + c;
            if (j < p.n_rows) {
                let col = p.n_off + j;
                var v: f32;
                if (r < 8u) {
                    v = acc0[r][c];
                } else {
                    v = acc1[r - 8u][c];
                }
                out[m * p.n + col] = epilogue(v, m, col);
            }
        }
    }
}
