// Matrix-vector linear for decode (M <= 4 rows: one token per beam), K % 8 == 0, portable. One output
// column per invocation: a single fma chain over K reading the weight row w[j, :] as vec4 (the (N, K)
// checkpoint layout is already the right one: each lane streams its own contiguous row). The MR rows of x
// are the same for every lane (they stay in cache). Memory-bound: the weights are read exactly once.
// Requires `matmul_common.wgsl` in front.

override WG: u32 = 64u;
override MR: u32 = 1u; // rows of x handled (1..4), = M

@compute @workgroup_size(WG)
fn linear_gemv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let j = (wid.x + wid.y * nwg.x) * WG + lid;
    if (j >= p.n_rows) {
        return;
    }
    let kq = p.k / 4u;
    let wb = w_row_base(j);
    var acc = array<vec4<f32>, 4>();
    for (var k8 = 0u; k8 < p.k / 8u; k8++) {
        let b = w_load8(wb, k8);
        for (var r = 0u; r < MR; r++) {
            let xi = r * kq + 2u * k8;
            acc[r] = fma(x[xi], b[0], acc[r]);
            acc[r] = fma(x[xi + 1u], b[1], acc[r]);
        }
    }
    let col = p.n_off + j;
    for (var r = 0u; r < MR; r++) {
        let a = acc[r];
        out[r * p.n + col] = epilogue((a.x + a.y) + (a.z + a.w), col);
    }
}
