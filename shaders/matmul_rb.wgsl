#include matmul_common
// Register-blocked linear without subgroups and without workgroup memory (K % 8 == 0): the fast GEMM for
// adapters that expose no subgroups (SwiftShader, Chromium's CPU WebGPU) and a barrier-free candidate for
// GPUs. Params, bindings, `w_load8` and the epilogue: `#include matmul_common`.
//
// Each invocation computes an RM x RN block of outputs (override constants; the tuner's variants reg4x4,
// reg8x8, reg16x8, reg16x16; 16x4 measured below 16x8 on both CPU adapters and was dropped). Per 8-wide step along K it loads RM rows of x as two vec4 each and
// the RN weight rows as two vec4 each (`w_load8`: f32, packed f16 or q8/q4 dequantized in registers), then
// does RM * RN * 8 multiply-adds: 2 (RM + RN) loads for them, against 2 (1 + RN) for a 1 x RN GEMV. Loads
// are what bounds a CPU adapter (a load whose address differs per lane is a gather) and a GPU's cache
// bandwidth alike; the larger blocks trade registers for fewer loads per multiply-add (on a GPU the
// 16-row/column blocks likely exceed the register file, which the tuner's timing will show; on
// SwiftShader 16x16 and 16x8 measured fastest, `scripts/bench/browser_kernels.rs`). The accumulators are plain vec4
// locals (c<r> for row r, columns 0..3; d, e, f for columns 4..15), never an array indexed in a loop, so
// they stay in registers; the rows and columns beyond RM / RN sit behind `if`s on the override constants,
// which the compilers fold away at kernel creation (the loop body is fully unrolled for each block).
// The 4x4 part of one step is `a * B` with B a mat4x4 whose columns are 4 weight quads: component c of
// a vec4 times mat4x4 is dot(a, B[c]).
//
// Grid: x walks N (WG invocations x RN columns per workgroup), y walks M (RM rows per workgroup), so
// consecutive workgroups share the same RM rows of x (hot in cache) and stream different weight rows; all
// invocations of a workgroup read the same x addresses (uniform loads).
//
// Bounds (this module is compiled WITHOUT run-time bounds checks, `TRUSTED_SHADERS` in
// src/gpu/kernel.rs): the launcher (`ops::matmul::linear_variant`) guarantees M >= 1, K >= 8,
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

override WG: u32 = RB_MAX_WG; // a power of two <= RB_MAX_WG (from the launcher, src/ops/matmul.rs: rb_wg)
override RM: u32 = 4u; // output rows per invocation: 4, 8 or 16
override RN: u32 = 4u; // output columns per invocation: 4, 8 or 16

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

// Store one output row's RN columns (row m, chunk columns j0..j0+RN) from its 1, 2 or 4 accumulators.
// RN is an override constant, so the branches fold away when the kernel is built.
fn store_cols(c: vec4<f32>, d: vec4<f32>, e: vec4<f32>, f: vec4<f32>, m: u32, j0: u32) {
    store_row(c, m, j0);
    if (RN >= 8u) {
        store_row(d, m, j0 + 4u);
    }
    if (RN >= 16u) {
        store_row(e, m, j0 + 8u);
        store_row(f, m, j0 + 12u);
    }
}

@compute @workgroup_size(WG)
fn linear_rb(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    // No early return for lanes past the last column: they recompute the last one (clamped below) and
    // store nothing, so every lane stays active and the x addresses, which depend only on the workgroup,
    // stay uniform across the lanes.
    let j0 = (wid.x * WG + lid) * RN;
    let m0 = wid.y * RM;
    let kq = p.k / 4u;
    let last = p.m - 1u;
    // Row bases of x, clamped: rows past the end recompute the last row and are not stored.
    let x0 = min(m0 + 0u, last) * kq;
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
    let wb0 = w_row_base(min(j0 + 0u, jl));
    let wb1 = w_row_base(min(j0 + 1u, jl));
    let wb2 = w_row_base(min(j0 + 2u, jl));
    let wb3 = w_row_base(min(j0 + 3u, jl));
    let wb4 = w_row_base(min(j0 + 4u, jl));
    let wb5 = w_row_base(min(j0 + 5u, jl));
    let wb6 = w_row_base(min(j0 + 6u, jl));
    let wb7 = w_row_base(min(j0 + 7u, jl));
    let wb8 = w_row_base(min(j0 + 8u, jl));
    let wb9 = w_row_base(min(j0 + 9u, jl));
    let wb10 = w_row_base(min(j0 + 10u, jl));
    let wb11 = w_row_base(min(j0 + 11u, jl));
    let wb12 = w_row_base(min(j0 + 12u, jl));
    let wb13 = w_row_base(min(j0 + 13u, jl));
    let wb14 = w_row_base(min(j0 + 14u, jl));
    let wb15 = w_row_base(min(j0 + 15u, jl));
    // Accumulators: c<r> holds row r, columns 0..3 of the block; d<r> columns 4..7 (RN >= 8); e<r> and
    // f<r> columns 8..11 and 12..15 (RN = 16).
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
    var d0 = vec4<f32>(0.0);
    var d1 = vec4<f32>(0.0);
    var d2 = vec4<f32>(0.0);
    var d3 = vec4<f32>(0.0);
    var d4 = vec4<f32>(0.0);
    var d5 = vec4<f32>(0.0);
    var d6 = vec4<f32>(0.0);
    var d7 = vec4<f32>(0.0);
    var d8 = vec4<f32>(0.0);
    var d9 = vec4<f32>(0.0);
    var d10 = vec4<f32>(0.0);
    var d11 = vec4<f32>(0.0);
    var d12 = vec4<f32>(0.0);
    var d13 = vec4<f32>(0.0);
    var d14 = vec4<f32>(0.0);
    var d15 = vec4<f32>(0.0);
    var e0 = vec4<f32>(0.0);
    var e1 = vec4<f32>(0.0);
    var e2 = vec4<f32>(0.0);
    var e3 = vec4<f32>(0.0);
    var e4 = vec4<f32>(0.0);
    var e5 = vec4<f32>(0.0);
    var e6 = vec4<f32>(0.0);
    var e7 = vec4<f32>(0.0);
    var e8 = vec4<f32>(0.0);
    var e9 = vec4<f32>(0.0);
    var e10 = vec4<f32>(0.0);
    var e11 = vec4<f32>(0.0);
    var e12 = vec4<f32>(0.0);
    var e13 = vec4<f32>(0.0);
    var e14 = vec4<f32>(0.0);
    var e15 = vec4<f32>(0.0);
    var f0 = vec4<f32>(0.0);
    var f1 = vec4<f32>(0.0);
    var f2 = vec4<f32>(0.0);
    var f3 = vec4<f32>(0.0);
    var f4 = vec4<f32>(0.0);
    var f5 = vec4<f32>(0.0);
    var f6 = vec4<f32>(0.0);
    var f7 = vec4<f32>(0.0);
    var f8 = vec4<f32>(0.0);
    var f9 = vec4<f32>(0.0);
    var f10 = vec4<f32>(0.0);
    var f11 = vec4<f32>(0.0);
    var f12 = vec4<f32>(0.0);
    var f13 = vec4<f32>(0.0);
    var f14 = vec4<f32>(0.0);
    var f15 = vec4<f32>(0.0);
    for (var k8 = 0u; k8 < p.k / 8u; k8++) {
        // Column c of lo<g> / hi<g>: weight row 4 g + c's k-quads 2 k8 and 2 k8 + 1.
        var lo0: mat4x4<f32>;
        var hi0: mat4x4<f32>;
        var lo1: mat4x4<f32>;
        var hi1: mat4x4<f32>;
        var lo2: mat4x4<f32>;
        var hi2: mat4x4<f32>;
        var lo3: mat4x4<f32>;
        var hi3: mat4x4<f32>;
        let b0 = w_load8(wb0, k8);
        let b1 = w_load8(wb1, k8);
        let b2 = w_load8(wb2, k8);
        let b3 = w_load8(wb3, k8);
        lo0 = mat4x4<f32>(b0[0], b1[0], b2[0], b3[0]);
        hi0 = mat4x4<f32>(b0[1], b1[1], b2[1], b3[1]);
        if (RN >= 8u) {
            let b4 = w_load8(wb4, k8);
            let b5 = w_load8(wb5, k8);
            let b6 = w_load8(wb6, k8);
            let b7 = w_load8(wb7, k8);
            lo1 = mat4x4<f32>(b4[0], b5[0], b6[0], b7[0]);
            hi1 = mat4x4<f32>(b4[1], b5[1], b6[1], b7[1]);
        }
        if (RN >= 16u) {
            let b8 = w_load8(wb8, k8);
            let b9 = w_load8(wb9, k8);
            let b10 = w_load8(wb10, k8);
            let b11 = w_load8(wb11, k8);
            lo2 = mat4x4<f32>(b8[0], b9[0], b10[0], b11[0]);
            hi2 = mat4x4<f32>(b8[1], b9[1], b10[1], b11[1]);
            let b12 = w_load8(wb12, k8);
            let b13 = w_load8(wb13, k8);
            let b14 = w_load8(wb14, k8);
            let b15 = w_load8(wb15, k8);
            lo3 = mat4x4<f32>(b12[0], b13[0], b14[0], b15[0]);
            hi3 = mat4x4<f32>(b12[1], b13[1], b14[1], b15[1]);
        }
        let o = 2u * k8;
        let a0 = x[x0 + o];
        let h0 = x[x0 + o + 1u];
        c0 += a0 * lo0 + h0 * hi0;
        if (RN >= 8u) {
            d0 += a0 * lo1 + h0 * hi1;
        }
        if (RN >= 16u) {
            e0 += a0 * lo2 + h0 * hi2;
            f0 += a0 * lo3 + h0 * hi3;
        }
        let a1 = x[x1 + o];
        let h1 = x[x1 + o + 1u];
        c1 += a1 * lo0 + h1 * hi0;
        if (RN >= 8u) {
            d1 += a1 * lo1 + h1 * hi1;
        }
        if (RN >= 16u) {
            e1 += a1 * lo2 + h1 * hi2;
            f1 += a1 * lo3 + h1 * hi3;
        }
        let a2 = x[x2 + o];
        let h2 = x[x2 + o + 1u];
        c2 += a2 * lo0 + h2 * hi0;
        if (RN >= 8u) {
            d2 += a2 * lo1 + h2 * hi1;
        }
        if (RN >= 16u) {
            e2 += a2 * lo2 + h2 * hi2;
            f2 += a2 * lo3 + h2 * hi3;
        }
        let a3 = x[x3 + o];
        let h3 = x[x3 + o + 1u];
        c3 += a3 * lo0 + h3 * hi0;
        if (RN >= 8u) {
            d3 += a3 * lo1 + h3 * hi1;
        }
        if (RN >= 16u) {
            e3 += a3 * lo2 + h3 * hi2;
            f3 += a3 * lo3 + h3 * hi3;
        }
        if (RM >= 8u) {
            let a4 = x[x4 + o];
            let h4 = x[x4 + o + 1u];
            c4 += a4 * lo0 + h4 * hi0;
            if (RN >= 8u) {
                d4 += a4 * lo1 + h4 * hi1;
            }
            if (RN >= 16u) {
                e4 += a4 * lo2 + h4 * hi2;
                f4 += a4 * lo3 + h4 * hi3;
            }
            let a5 = x[x5 + o];
            let h5 = x[x5 + o + 1u];
            c5 += a5 * lo0 + h5 * hi0;
            if (RN >= 8u) {
                d5 += a5 * lo1 + h5 * hi1;
            }
            if (RN >= 16u) {
                e5 += a5 * lo2 + h5 * hi2;
                f5 += a5 * lo3 + h5 * hi3;
            }
            let a6 = x[x6 + o];
            let h6 = x[x6 + o + 1u];
            c6 += a6 * lo0 + h6 * hi0;
            if (RN >= 8u) {
                d6 += a6 * lo1 + h6 * hi1;
            }
            if (RN >= 16u) {
                e6 += a6 * lo2 + h6 * hi2;
                f6 += a6 * lo3 + h6 * hi3;
            }
            let a7 = x[x7 + o];
            let h7 = x[x7 + o + 1u];
            c7 += a7 * lo0 + h7 * hi0;
            if (RN >= 8u) {
                d7 += a7 * lo1 + h7 * hi1;
            }
            if (RN >= 16u) {
                e7 += a7 * lo2 + h7 * hi2;
                f7 += a7 * lo3 + h7 * hi3;
            }
        }
        if (RM >= 16u) {
            let a8 = x[x8 + o];
            let h8 = x[x8 + o + 1u];
            c8 += a8 * lo0 + h8 * hi0;
            if (RN >= 8u) {
                d8 += a8 * lo1 + h8 * hi1;
            }
            if (RN >= 16u) {
                e8 += a8 * lo2 + h8 * hi2;
                f8 += a8 * lo3 + h8 * hi3;
            }
            let a9 = x[x9 + o];
            let h9 = x[x9 + o + 1u];
            c9 += a9 * lo0 + h9 * hi0;
            if (RN >= 8u) {
                d9 += a9 * lo1 + h9 * hi1;
            }
            if (RN >= 16u) {
                e9 += a9 * lo2 + h9 * hi2;
                f9 += a9 * lo3 + h9 * hi3;
            }
            let a10 = x[x10 + o];
            let h10 = x[x10 + o + 1u];
            c10 += a10 * lo0 + h10 * hi0;
            if (RN >= 8u) {
                d10 += a10 * lo1 + h10 * hi1;
            }
            if (RN >= 16u) {
                e10 += a10 * lo2 + h10 * hi2;
                f10 += a10 * lo3 + h10 * hi3;
            }
            let a11 = x[x11 + o];
            let h11 = x[x11 + o + 1u];
            c11 += a11 * lo0 + h11 * hi0;
            if (RN >= 8u) {
                d11 += a11 * lo1 + h11 * hi1;
            }
            if (RN >= 16u) {
                e11 += a11 * lo2 + h11 * hi2;
                f11 += a11 * lo3 + h11 * hi3;
            }
            let a12 = x[x12 + o];
            let h12 = x[x12 + o + 1u];
            c12 += a12 * lo0 + h12 * hi0;
            if (RN >= 8u) {
                d12 += a12 * lo1 + h12 * hi1;
            }
            if (RN >= 16u) {
                e12 += a12 * lo2 + h12 * hi2;
                f12 += a12 * lo3 + h12 * hi3;
            }
            let a13 = x[x13 + o];
            let h13 = x[x13 + o + 1u];
            c13 += a13 * lo0 + h13 * hi0;
            if (RN >= 8u) {
                d13 += a13 * lo1 + h13 * hi1;
            }
            if (RN >= 16u) {
                e13 += a13 * lo2 + h13 * hi2;
                f13 += a13 * lo3 + h13 * hi3;
            }
            let a14 = x[x14 + o];
            let h14 = x[x14 + o + 1u];
            c14 += a14 * lo0 + h14 * hi0;
            if (RN >= 8u) {
                d14 += a14 * lo1 + h14 * hi1;
            }
            if (RN >= 16u) {
                e14 += a14 * lo2 + h14 * hi2;
                f14 += a14 * lo3 + h14 * hi3;
            }
            let a15 = x[x15 + o];
            let h15 = x[x15 + o + 1u];
            c15 += a15 * lo0 + h15 * hi0;
            if (RN >= 8u) {
                d15 += a15 * lo1 + h15 * hi1;
            }
            if (RN >= 16u) {
                e15 += a15 * lo2 + h15 * hi2;
                f15 += a15 * lo3 + h15 * hi3;
            }
        }
    }
    store_cols(c0, d0, e0, f0, m0 + 0u, j0);
    store_cols(c1, d1, e1, f1, m0 + 1u, j0);
    store_cols(c2, d2, e2, f2, m0 + 2u, j0);
    store_cols(c3, d3, e3, f3, m0 + 3u, j0);
    if (RM >= 8u) {
        store_cols(c4, d4, e4, f4, m0 + 4u, j0);
        store_cols(c5, d5, e5, f5, m0 + 5u, j0);
        store_cols(c6, d6, e6, f6, m0 + 6u, j0);
        store_cols(c7, d7, e7, f7, m0 + 7u, j0);
    }
    if (RM >= 16u) {
        store_cols(c8, d8, e8, f8, m0 + 8u, j0);
        store_cols(c9, d9, e9, f9, m0 + 9u, j0);
        store_cols(c10, d10, e10, f10, m0 + 10u, j0);
        store_cols(c11, d11, e11, f11, m0 + 11u, j0);
        store_cols(c12, d12, e12, f12, m0 + 12u, j0);
        store_cols(c13, d13, e13, f13, m0 + 13u, j0);
        store_cols(c14, d14, e14, f14, m0 + 14u, j0);
        store_cols(c15, d15, e15, f15, m0 + 15u, j0);
    }
}
