// Portable register-blocked linear for K % 8 == 0 (no subgroups; the browser's fast path). Each invocation
// computes an 8-row x 8-column output block, reading x and w as vec4 along K, with no shared memory and
// no barriers (both are slow on CPU adapters). Invocations of a workgroup share the same 8 rows (which
// hit in cache) and take consecutive 8-column groups; row blocks run along grid x.
// Requires `matmul_common.wgsl` in front.

override WG: u32 = 64u;

// acc[2 r + h] += a_r . b_c for the 8 columns c (4 in each half h), one k-quad.
fn fma_block(acc: ptr<function, array<vec4<f32>, 16>>, a: array<vec4<f32>, 8>, b: array<vec4<f32>, 8>) {
    for (var r = 0u; r < 8u; r++) {
        let ar = a[r];
        (*acc)[2u * r] += vec4<f32>(dot(ar, b[0]), dot(ar, b[1]), dot(ar, b[2]), dot(ar, b[3]));
        (*acc)[2u * r + 1u] += vec4<f32>(dot(ar, b[4]), dot(ar, b[5]), dot(ar, b[6]), dot(ar, b[7]));
    }
}

@compute @workgroup_size(WG)
fn linear_v4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let m0 = wid.x * 8u;
    let j0 = (wid.y * WG + lid) * 8u;
    if (j0 >= p.n_rows) {
        return;
    }
    let kq = p.k / 4u;
    var xb: array<u32, 8>;
    var wb: array<u32, 8>;
    for (var i = 0u; i < 8u; i++) {
        // Clamped: rows/columns past the end recompute the last one; their results are not stored.
        xb[i] = min(m0 + i, p.m - 1u) * kq;
        wb[i] = w_row_base(min(j0 + i, p.n_rows - 1u));
    }
    var acc: array<vec4<f32>, 16>;
    for (var k8 = 0u; k8 < p.k / 8u; k8++) {
        var alo: array<vec4<f32>, 8>;
        var ahi: array<vec4<f32>, 8>;
        var blo: array<vec4<f32>, 8>;
        var bhi: array<vec4<f32>, 8>;
        for (var i = 0u; i < 8u; i++) {
            alo[i] = x[xb[i] + 2u * k8];
            ahi[i] = x[xb[i] + 2u * k8 + 1u];
            let b = w_load8(wb[i], k8);
            blo[i] = b[0];
            bhi[i] = b[1];
        }
        fma_block(&acc, alo, blo);
        fma_block(&acc, ahi, bhi);
    }
    store_block(&acc, m0, j0);
}
