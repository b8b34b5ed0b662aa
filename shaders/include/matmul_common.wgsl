// Shared part of the vec4 linear kernels (`matmul_rb.wgsl`, `matmul_sg.wgsl`, `matmul_gemv.wgsl`;
// `#include matmul_common` at the top of each): the Params uniform, the bindings, the weight loads and
// the epilogue.
//
// out[m, n_off + j] = act(sum_k x[m, k] * w[j, k] + bias[n_off + j]), w in PyTorch Linear layout (N, K),
// possibly only a row chunk of it bound (see `matmul.wgsl`). These kernels need K % 8 == 0: x is read as
// vec4<f32>, w as vec4<u32> words holding 4 f32 (bit patterns) or 8 packed f16 values.
//
// Block-quantized weights (W_Q = 8 or 4; K % 32 == 0; format in `src/gpu/quant.rs`): each weight row is
// [quants][f16 scales][padding], a multiple of 16 bytes, so a row starts on a vec4<u32> word. Reading 8
// weights costs one scale load plus the integer unpacks; the weights are dequantized in registers and
// the arithmetic stays f32, so quantized weights cost no extra memory and read 2x (q8) or 4x (q4) fewer
// bytes than f16 from the bound buffer.

override W_F16: bool = false;
override W_Q: u32 = 0u; // 0: f32/f16 (W_F16); 8: q8 blocks; 4: q4 blocks

#include linear_params
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;    // (M, K/4)
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>;    // (n_rows, K/4) f32 bits or (n_rows, K/8) f16
@group(0) @binding(3) var<storage, read> bias: array<f32>;       // (N) (unused unless flags & 1)
@group(0) @binding(4) var<storage, read_write> out: array<f32>;  // (M, N)
@group(0) @binding(5) var<storage, read> res: array<f32>;        // (M, N) (unused unless flags & 4)

// Index of weight row `row`'s first vec4<u32> word.
fn w_row_base(row: u32) -> u32 {
    if (W_Q != 0u) {
        return row * (q_quant_words() + q_scale_words());
    }
    if (W_F16) {
        return row * (p.k / 8u);
    }
    return row * (p.k / 4u);
}

// vec4<u32> words of one quantized row's quants (K bytes for q8, K/2 for q4) and of its scales (K/32
// f16 values padded to 16 bytes).
fn q_quant_words() -> u32 {
    return p.k * W_Q / 128u;
}
fn q_scale_words() -> u32 {
    return (p.k / 16u + 15u) / 16u;
}

// Sign-extend the 4 bytes of a word (byte i = weight i) to f32.
fn i8x4(v: u32) -> vec4<f32> {
    let s = vec4<i32>(bitcast<i32>(v << 24u), bitcast<i32>(v << 16u), bitcast<i32>(v << 8u),
        bitcast<i32>(v));
    return vec4<f32>(s >> vec4<u32>(24u));
}

// The 8 nibbles of a word (nibble i = weight i, stored as q + 8) as two vec4 of q.
fn nib8(v: u32) -> array<vec4<f32>, 2> {
    let lo = (vec4<u32>(v) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u);
    let hi = (vec4<u32>(v) >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u);
    return array<vec4<f32>, 2>(vec4<f32>(lo) - 8.0, vec4<f32>(hi) - 8.0);
}

// Weights 8*k8 .. 8*k8 + 8 of the quantized row starting at word `base`.
fn q_load8(base: u32, k8: u32) -> array<vec4<f32>, 2> {
    let blk = k8 / 4u; // 32-weight block
    let sw = w[base + q_quant_words() + blk / 8u][(blk / 2u) % 4u];
    let d = unpack2x16float(sw)[blk % 2u];
    if (W_Q == 8u) {
        let q = w[base + k8 / 2u];
        let h = (k8 % 2u) * 2u;
        return array<vec4<f32>, 2>(d * i8x4(q[h]), d * i8x4(q[h + 1u]));
    }
    let n = nib8(w[base + k8 / 4u][k8 % 4u]);
    return array<vec4<f32>, 2>(d * n[0], d * n[1]);
}

// The 8 weights w[row, 8*k8 .. 8*k8 + 8] of the row starting at word `base`, as two vec4 (low, high k).
fn w_load8(base: u32, k8: u32) -> array<vec4<f32>, 2> {
    if (W_Q != 0u) {
        return q_load8(base, k8);
    }
    if (W_F16) {
        let q = w[base + k8];
        return array<vec4<f32>, 2>(
            vec4<f32>(unpack2x16float(q.x), unpack2x16float(q.y)),
            vec4<f32>(unpack2x16float(q.z), unpack2x16float(q.w)));
    }
    let i = base + 2u * k8;
    return array<vec4<f32>, 2>(bitcast<vec4<f32>>(w[i]), bitcast<vec4<f32>>(w[i + 1u]));
}

#include linear_epilogue

// Store an 8-row x 8-column register block (acc[2 r + h] holds row r, columns 4 h .. 4 h + 4) at output
// rows m0.., chunk columns j0.., skipping what lies outside the matrix.
fn store_block(acc: ptr<function, array<vec4<f32>, 16>>, m0: u32, j0: u32) {
    for (var r = 0u; r < 8u; r++) {
        let m = m0 + r;
        if (m >= p.m) {
            return;
        }
        for (var c = 0u; c < 8u; c++) {
            let j = j0 + c;
            if (j < p.n_rows) {
                let col = p.n_off + j;
                out[m * p.n + col] = epilogue((*acc)[2u * r + c / 4u][c % 4u], m, col);
            }
        }
    }
}
