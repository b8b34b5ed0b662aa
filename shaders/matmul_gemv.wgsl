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
        out[r * p.n + col] = epilogue((a.x + a.y) + (a.z + a.w), r, col);
    }
}

// linear_gemv_wg: the multi-row GEMV for GPUs (decode steps; the LM head's 51289 rows). The GEMV above
// gives each lane its own weight row, so neighbouring lanes read addresses K*4 bytes apart: right for a
// CPU adapter (each lane is a SIMD slot streaming its own row from cache), uncoalesced on a GPU. Here a
// workgroup of WG lanes computes RW = 4 consecutive output columns for all MR rows of x, splitting K:
// lane l takes k-octets l, l + WG, l + 2 WG, ..., so at each step the lanes read one contiguous run of
// a weight row (coalesced), and the WG partial sums are reduced in workgroup memory (log2 WG steps).
// WG must be a power of two <= 64.

const RW: u32 = 4u; // output columns per workgroup
var<workgroup> part: array<vec4<f32>, 256>; // [r * WG + lane], components over the RW columns

@compute @workgroup_size(WG)
fn linear_gemv_wg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let j0 = (wid.x + wid.y * nwg.x) * RW;
    // Uniform per workgroup (derived from the workgroup id): no early return, the barriers below need
    // every lane.
    let valid = j0 < p.n_rows;
    let kq = p.k / 4u;
    var acc = array<vec4<f32>, 4>();
    if (valid) {
        var wb: array<u32, 4>;
        for (var c = 0u; c < RW; c++) {
            wb[c] = w_row_base(min(j0 + c, p.n_rows - 1u));
        }
        for (var k8 = lid; k8 < p.k / 8u; k8 += WG) {
            for (var c = 0u; c < RW; c++) {
                let b = w_load8(wb[c], k8);
                for (var r = 0u; r < MR; r++) {
                    let xi = r * kq + 2u * k8;
                    acc[r][c] += dot(x[xi], b[0]) + dot(x[xi + 1u], b[1]);
                }
            }
        }
    }
    for (var r = 0u; r < MR; r++) {
        part[r * WG + lid] = acc[r];
    }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            for (var r = 0u; r < MR; r++) {
                part[r * WG + lid] += part[r * WG + lid + s];
            }
        }
        workgroupBarrier();
    }
    if (valid && lid < MR * RW) {
        let r = lid / RW;
        let j = j0 + lid % RW;
        if (j < p.n_rows) {
            let col = p.n_off + j;
            out[r * p.n + col] = epilogue(part[r * WG][lid % RW], r, col);
        }
    }
}
