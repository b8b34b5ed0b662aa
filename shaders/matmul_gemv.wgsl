#include matmul_common
// Matrix-vector linear for decode (a few rows: one token per beam or per request), K % 8 == 0, portable. One output
// column per invocation: a single fma chain over K reading the weight row w[j, :] as vec4 (the (N, K)
// checkpoint layout is already the right one: each lane streams its own contiguous row). The MR rows of x
// are the same for every lane (they stay in cache). Memory-bound: the weights are read exactly once.
// Params, bindings, weight loads and the epilogue: `#include matmul_common`.

// From the launcher (src/ops/matmul.rs, SHADER_GEMV's consts): GEMV_WG, the workgroup size of
// `linear_gemv` and `linear_gemv_wg`; MAX_MR, the most rows of x; RW, the output columns per workgroup of
// `linear_gemv_wg`.
override WG: u32 = GEMV_WG;
override MR: u32 = 1u; // rows of x per row group (1..MAX_MR), = min(M, MAX_MR)

// Row groups: M rows run as ceil(M / MR) groups of MR along grid z (a batched decode step: the rows of
// several requests). Row r of group g is x row g * MR + r; a row past M reads row M - 1 again and stores
// nothing. Every row goes through the same arithmetic whatever M is, so a row's result does not depend
// on the other rows (the batched decoder's bit-identity rests on this).
fn gemv_row(g: u32, r: u32) -> u32 {
    return min(g * MR + r, p.m - 1u);
}

fn gemv_stores(g: u32, r: u32) -> bool {
    return g * MR + r < p.m;
}

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
            let xi = gemv_row(wid.z, r) * kq + 2u * k8;
            acc[r] = fma(x[xi], b[0], acc[r]);
            acc[r] = fma(x[xi + 1u], b[1], acc[r]);
        }
    }
    let col = p.n_off + j;
    for (var r = 0u; r < MR; r++) {
        if (gemv_stores(wid.z, r)) {
            let a = acc[r];
            let row = wid.z * MR + r;
            out[row * p.n + col] = epilogue((a.x + a.y) + (a.z + a.w), row, col);
        }
    }
}

// linear_gemv_wg: the multi-row GEMV for GPUs (decode steps; the LM head's 51289 rows). The GEMV above
// gives each lane its own weight row, so neighbouring lanes read addresses K*4 bytes apart: right for a
// CPU adapter (each lane is a SIMD slot streaming its own row from cache), uncoalesced on a GPU. Here a
// workgroup of WG lanes computes RW = 4 consecutive output columns for all MR rows of x, splitting K:
// lane l takes k-octets l, l + WG, l + 2 WG, ..., so at each step the lanes read one contiguous run of
// a weight row (coalesced), and the WG partial sums are reduced in workgroup memory (log2 WG steps).
// WG must be a power of two <= GEMV_WG.

var<workgroup> part: array<vec4<f32>, MAX_MR * GEMV_WG>; // [r * WG + lane], components over the RW columns

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
                    let xi = gemv_row(wid.z, r) * kq + 2u * k8;
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
        if (j < p.n_rows && gemv_stores(wid.z, r)) {
            let col = p.n_off + j;
            let row = wid.z * MR + r;
            out[row * p.n + col] = epilogue(part[r * WG][lid % RW], row, col);
        }
    }
}

// linear_gemv_blk: the decode GEMV for CPU adapters (lavapipe, SwiftShader), whose cost follows the
// weight bytes it reads. Measured on lavapipe (`scripts/bench/gemv.rs`), two things set a GEMV's speed
// there:
// - A storage load whose address differs per lane becomes a loop over the SIMD lanes with one scalar
//   load per 32-bit component, so a load costs its number of u32 components whatever they hold. Here K
//   is walked in 32-weight blocks and every weight word loaded is used whole: f32 reads 8 vec4<u32> per
//   block, f16 4, q8 2, q4 1 (the older kernels load a whole vec4 for every 8 weights and keep half or a
//   quarter of it for q8/q4, plus a scale vec4 per 8 weights). q8/q4 block scales are loaded once per 8
//   blocks (one vec4<u32> holds 8 f16 scales) and applied once per block to the block's partial dot
//   product instead of once per weight.
// - The CPU's prefetcher follows long sequential streams per lane, not short ones: a shader reading
//   64 MiB with 4 KiB per lane ran 4.4x faster than with 1 KiB per lane. A weight row is short (432 bytes
//   for q4 at K = 768), so each lane computes RL consecutive rows one after the other: its stream is RL
//   rows long.
// With SG (subgroups of >= 8 lanes), lane l loads only x's k-quad (l mod 8) of each block and the others
// get it by `subgroupBroadcast`, so the MR rows of x cost one vec4 per block instead of eight. Lanes
// past the end compute the last row again (broadcasts need every lane) and store nothing.

// The 8 k-quads of block kb of weight row `base` (unscaled for q8/q4: the integers themselves).
fn w_block(base: u32, kb: u32) -> array<vec4<f32>, 8> {
    var b: array<vec4<f32>, 8>;
    if (W_Q == 8u) {
        let u0 = w[base + 2u * kb];
        let u1 = w[base + 2u * kb + 1u];
        b[0] = i8x4(u0.x);
        b[1] = i8x4(u0.y);
        b[2] = i8x4(u0.z);
        b[3] = i8x4(u0.w);
        b[4] = i8x4(u1.x);
        b[5] = i8x4(u1.y);
        b[6] = i8x4(u1.z);
        b[7] = i8x4(u1.w);
    } else if (W_Q == 4u) {
        let u = w[base + kb];
        let n0 = nib8(u.x);
        let n1 = nib8(u.y);
        let n2 = nib8(u.z);
        let n3 = nib8(u.w);
        b[0] = n0[0];
        b[1] = n0[1];
        b[2] = n1[0];
        b[3] = n1[1];
        b[4] = n2[0];
        b[5] = n2[1];
        b[6] = n3[0];
        b[7] = n3[1];
    } else if (W_F16) {
        for (var i = 0u; i < 4u; i++) {
            let u = w[base + 4u * kb + i];
            b[2u * i] = vec4<f32>(unpack2x16float(u.x), unpack2x16float(u.y));
            b[2u * i + 1u] = vec4<f32>(unpack2x16float(u.z), unpack2x16float(u.w));
        }
    } else {
        for (var i = 0u; i < 8u; i++) {
            b[i] = bitcast<vec4<f32>>(w[base + 8u * kb + i]);
        }
    }
    return b;
}

override RL: u32 = 1u; // consecutive weight rows per lane, done one after the other

@compute @workgroup_size(WG)
fn linear_gemv_blk(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
#if SG
                   @builtin(subgroup_invocation_id) sl: u32,
#endif
                   @builtin(local_invocation_index) lid: u32) {
    let lane = (wid.x + wid.y * nwg.x) * WG + lid;
    let kq = p.k / 4u;
    let nb = p.k / 32u;
    for (var rr = 0u; rr < RL; rr++) {
        let j = lane * RL + rr;
        let wb = w_row_base(min(j, p.n_rows - 1u));
        var acc = array<vec4<f32>, 4>();
        // Scale groups of 8 blocks (q8/q4: one vec4<u32> of 8 f16 scales each).
        for (var g = 0u; g < (nb + 7u) / 8u; g++) {
            var sv = vec4<u32>();
            if (W_Q != 0u) {
                sv = w[wb + q_quant_words() + g];
            }
            for (var bi = 0u; bi < min(8u, nb - 8u * g); bi++) {
                let kb = 8u * g + bi;
                let wq = w_block(wb, kb);
                for (var r = 0u; r < MR; r++) {
#if SG
                    let v = x[gemv_row(wid.z, r) * kq + 8u * kb + (sl & 7u)];
                    var s = subgroupBroadcast(v, 0u) * wq[0];
                    s = fma(subgroupBroadcast(v, 1u), wq[1], s);
                    s = fma(subgroupBroadcast(v, 2u), wq[2], s);
                    s = fma(subgroupBroadcast(v, 3u), wq[3], s);
                    s = fma(subgroupBroadcast(v, 4u), wq[4], s);
                    s = fma(subgroupBroadcast(v, 5u), wq[5], s);
                    s = fma(subgroupBroadcast(v, 6u), wq[6], s);
                    s = fma(subgroupBroadcast(v, 7u), wq[7], s);
#else
                    let xb = gemv_row(wid.z, r) * kq + 8u * kb;
                    var s = x[xb] * wq[0];
                    for (var i = 1u; i < 8u; i++) {
                        s = fma(x[xb + i], wq[i], s);
                    }
#endif
                    if (W_Q != 0u) {
                        let d = unpack2x16float(sv[bi / 2u])[bi % 2u];
                        acc[r] = fma(vec4<f32>(d), s, acc[r]);
                    } else {
                        acc[r] += s;
                    }
                }
            }
        }
        if (j < p.n_rows) {
            let col = p.n_off + j;
            for (var r = 0u; r < MR; r++) {
                if (gemv_stores(wid.z, r)) {
                    let a = acc[r];
                    let row = wid.z * MR + r;
                    out[row * p.n + col] = epilogue((a.x + a.y) + (a.z + a.w), row, col);
                }
            }
        }
    }
}
