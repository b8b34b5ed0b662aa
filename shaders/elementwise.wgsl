// Element-wise kernels over flat f32 arrays:
//   add          out = a + b
//   scale        out = x * s
//   add_row      out[r, c] = x[r, c] + row[c]            (broadcast of one (C) row, e.g. a bias)
//   add_rows_at  out[t, c] = x[t, c] + table[start + t, c] (learned positions from a (P, C) table)
//
// Variants (src/gpu/preprocess.rs):
// - INPLACE: x and out are one buffer, bound read_write at 1 (the second operand, if any, at 2), because
//   WebGPU forbids binding one buffer both read-only and writable in the same dispatch.
// - VEC4: chosen by the launchers when n (and C for the row ops) is a multiple of 4: the arrays hold
//   vec4<f32>, a quarter of the invocations and one 16-byte access per 4 elements (5-10x faster on
//   lavapipe, where every dynamically addressed load is a loop over the lanes). Indices count vec4s;
//   `p.n` and `p.c` stay in floats.
//
// Each invocation handles one element (or vec4); the grid is folded into (x, y) by `grid_1d` on the host
// when the array needs more than 65535 workgroups, so the flat index is rebuilt from both grid
// dimensions. Entry points use different variables at the same binding numbers (bindings are per entry
// point), so each entry's storage buffers are numbered 1.. in the order its launcher passes them.

// WG, the workgroup size: from the launcher (src/ops/elementwise.rs, SHADER's consts).

struct Params {
    n: u32,      // element count
    scale: f32,  // multiplier for `scale`
    c: u32,      // row length C for add_row / add_rows_at
    start: u32,  // first table row for add_rows_at
}

#include lanes

@group(0) @binding(0) var<uniform> p: Params;

#if INPLACE
@group(0) @binding(1) var<storage, read_write> x: array<F>;   // (n), read and overwritten
@group(0) @binding(2) var<storage, read> b: array<F>;         // add: (n); add_row: (C); add_rows_at: (P, C)

fn load(i: u32) -> F { return x[i]; }
fn store(i: u32, v: F) { x[i] = v; }
fn store_scale(i: u32, v: F) { x[i] = v; }
#else
// add, add_row, add_rows_at: a, b -> out
@group(0) @binding(1) var<storage, read> a: array<F>;         // (n) = (R, C)
@group(0) @binding(2) var<storage, read> b: array<F>;         // add: (n); add_row: (C); add_rows_at: (P, C)
@group(0) @binding(3) var<storage, read_write> out: array<F>; // (n)
// scale: a -> uout
@group(0) @binding(2) var<storage, read_write> uout: array<F>; // (n)

fn load(i: u32) -> F { return a[i]; }
fn store(i: u32, v: F) { out[i] = v; }
fn store_scale(i: u32, v: F) { uout[i] = v; }
#endif

fn flat(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.x + wid.y * nwg.x) * WG + lid;
}

@compute @workgroup_size(WG)
fn add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i < p.n / LANES) {
        store(i, load(i) + b[i]);
    }
}

@compute @workgroup_size(WG)
fn scale(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i < p.n / LANES) {
        store_scale(i, load(i) * p.scale);
    }
}

@compute @workgroup_size(WG)
fn add_row(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i < p.n / LANES) {
        store(i, load(i) + b[i % (p.c / LANES)]);
    }
}

@compute @workgroup_size(WG)
fn add_rows_at(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i < p.n / LANES) {
        store(i, load(i) + b[p.start * (p.c / LANES) + i]);
    }
}
