// Subgroup linear for K % 8 == 0 (needs wgpu's SUBGROUP feature and subgroups of at least 8 lanes; the
// launcher checks). Same 8x8 register block per invocation as `matmul_v4.wgsl`, but x is not loaded by
// every lane: all invocations of a workgroup share the same 8 rows, so lane l of each subgroup loads only
// row (l mod 8)'s next 8 k-values and the subgroup shares them with `subgroupBroadcast` from constant lanes
// 0..7. On CPU adapters (lavapipe) a storage load whose address is not a compile-time constant becomes a
// scalar loop over the lanes, so this cuts x's loads 8-fold; on GPUs it saves cache bandwidth.
// No barriers, no shared memory. Broadcasts run in uniform control flow: out-of-range lanes are clamped,
// never returned early. Requires `matmul_common.wgsl` in front.

override WG: u32 = 32u;

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
    let m0 = wid.x * 8u;
    let j0 = (wid.y * WG + lid) * 8u;
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
