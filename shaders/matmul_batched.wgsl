// Batched matrix multiply out[b] = a[b] @ b[b] with a (B, M, K), b (B, K, N), out (B, M, N), all f32
// row-major. Portable (no subgroups): each invocation computes a 4x4 register block; the batch index is
// the grid's z dimension. Accumulation is f32 in k order. The block (TM x TN outputs per invocation) and
// the workgroup (EDGE x EDGE invocations) come from the launcher (src/ops/matmul.rs, SHADER_BATCHED's consts).

struct Params {
    m: u32,
    n: u32,
    k: u32,
    batch: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;          // (B, M, K)
@group(0) @binding(2) var<storage, read> b: array<f32>;          // (B, K, N)
@group(0) @binding(3) var<storage, read_write> out: array<f32>;  // (B, M, N)

@compute @workgroup_size(EDGE, EDGE)
fn bmm(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n0 = gid.x * TN;
    let m0 = gid.y * TM;
    let bi = gid.z;
    if (n0 >= p.n || m0 >= p.m || bi >= p.batch) {
        return;
    }
    let a_base = bi * p.m * p.k;
    let b_base = bi * p.k * p.n;
    var acc: array<array<f32, TN>, TM>;
    for (var i = 0u; i < TM; i++) {
        for (var j = 0u; j < TN; j++) {
            acc[i][j] = 0.0;
        }
    }
    var ar: array<u32, TM>;
    var bc: array<u32, TN>;
    for (var i = 0u; i < TM; i++) {
        ar[i] = a_base + min(m0 + i, p.m - 1u) * p.k;
    }
    for (var j = 0u; j < TN; j++) {
        bc[j] = b_base + min(n0 + j, p.n - 1u);
    }
    for (var kk = 0u; kk < p.k; kk++) {
        var av: array<f32, TM>;
        var bv: array<f32, TN>;
        for (var i = 0u; i < TM; i++) {
            av[i] = a[ar[i] + kk];
        }
        let row = kk * p.n;
        for (var j = 0u; j < TN; j++) {
            bv[j] = b[bc[j] + row];
        }
        for (var i = 0u; i < TM; i++) {
            for (var j = 0u; j < TN; j++) {
                acc[i][j] = fma(av[i], bv[j], acc[i][j]);
            }
        }
    }
    let o_base = bi * p.m * p.n;
    for (var i = 0u; i < TM; i++) {
        let m = m0 + i;
        if (m >= p.m) {
            break;
        }
        for (var j = 0u; j < TN; j++) {
            let n = n0 + j;
            if (n >= p.n) {
                break;
            }
            out[o_base + m * p.n + n] = acc[i][j];
        }
    }
}
