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
// Each invocation computes a TMxTN register block of outputs; a 16x16 workgroup covers (16*TM)x(16*TN)
// outputs. Accumulation is f32, in k order per output.

override W_F16: bool = false;
const TM: u32 = 4u; // output rows per invocation
const TN: u32 = 4u; // output columns per invocation

struct Params {
    m: u32,       // rows of x / out
    n: u32,       // total columns of out (row stride of out)
    k: u32,       // reduction length
    n_off: u32,   // first output column of this weight chunk
    n_rows: u32,  // weight rows (output columns) in this chunk
    flags: u32,   // bit 0: add bias; bit 1: exact GELU
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;          // (M, K)
@group(0) @binding(2) var<storage, read> w: array<u32>;          // (n_rows, K) chunk, f32 bits or packed f16
@group(0) @binding(3) var<storage, read> bias: array<f32>;       // (N) (unused unless flags & 1)
@group(0) @binding(4) var<storage, read_write> out: array<f32>;  // (M, N)

fn w_at(e: u32) -> f32 {
    if (W_F16) {
        let pair = unpack2x16float(w[e >> 1u]);
        return select(pair.x, pair.y, (e & 1u) == 1u);
    }
    return bitcast<f32>(w[e]);
}

// erf with |error| <= 1.5e-7 (Abramowitz & Stegun 7.1.26), below f32's resolution of GELU's output scale.
fn erf_approx(v: f32) -> f32 {
    let s = sign(v);
    let a = abs(v);
    let t = 1.0 / (1.0 + 0.3275911 * a);
    let y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t
        + 0.254829592) * t * exp(-a * a);
    return s * y;
}

fn gelu(v: f32) -> f32 {
    return 0.5 * v * (1.0 + erf_approx(v * 0.70710678118654752));
}

fn epilogue(v: f32, col: u32) -> f32 {
    var r = v;
    if ((p.flags & 1u) != 0u) {
        r = r + bias[col];
    }
    if ((p.flags & 2u) != 0u) {
        r = gelu(r);
    }
    return r;
}

@compute @workgroup_size(16, 16)
fn linear(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j0 = gid.x * TN; // local weight row (chunk column)
    let m0 = gid.y * TM;
    if (j0 >= p.n_rows || m0 >= p.m) {
        return;
    }
    var acc: array<array<f32, 4>, 4>;
    for (var i = 0u; i < TM; i++) {
        for (var j = 0u; j < TN; j++) {
            acc[i][j] = 0.0;
        }
    }
    // Clamp row/column indices so every load is in bounds; results of clamped lanes are not stored.
    var xr: array<u32, 4>;
    var wr: array<u32, 4>;
    for (var i = 0u; i < TM; i++) {
        xr[i] = min(m0 + i, p.m - 1u) * p.k;
    }
    for (var j = 0u; j < TN; j++) {
        wr[j] = min(j0 + j, p.n_rows - 1u) * p.k;
    }
    for (var kk = 0u; kk < p.k; kk++) {
        var a: array<f32, 4>;
        var b: array<f32, 4>;
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
            out[m * p.n + col] = epilogue(acc[i][j], col);
        }
    }
}
