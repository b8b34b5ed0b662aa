// Element-wise kernels over flat f32 arrays:
//   add          out = a + b
//   scale        out = x * s
//   add_row      out[r, c] = x[r, c] + row[c]            (broadcast of one (C) row, e.g. a bias)
//   add_rows_at  out[t, c] = x[t, c] + table[start + t, c] (learned positions from a (P, C) table)
// and `_inplace` variants that read and write one buffer (x == out), because WebGPU
// forbids binding one buffer both read-only and writable in the same dispatch.
//
// Each invocation handles one element; the grid is folded into (x, y) by `grid_1d` on the host when the
// array needs more than 65535 workgroups, so the flat index is rebuilt from both grid dimensions.
// Entry points use different variables at the same binding numbers (bindings are per entry point), so
// each entry's storage buffers are numbered 1.. in the order its launcher passes them.

override WG: u32 = 256;

struct Params {
    n: u32,      // element count
    scale: f32,  // multiplier for `scale`
    c: u32,      // row length C for add_row / add_rows_at
    start: u32,  // first table row for add_rows_at
}

@group(0) @binding(0) var<uniform> p: Params;

// add, add_row, add_rows_at
@group(0) @binding(1) var<storage, read> a: array<f32>;         // (n) = (R, C)
@group(0) @binding(2) var<storage, read> b: array<f32>;         // add: (n); add_row: (C); add_rows_at: (P, C)
@group(0) @binding(3) var<storage, read_write> out: array<f32>; // (n)

// scale
@group(0) @binding(2) var<storage, read_write> uout: array<f32>; // (n), with x = `a` at binding 1

// in-place variants: x and out are one buffer at binding 1, the second operand is `b` at binding 2
@group(0) @binding(1) var<storage, read_write> io: array<f32>;  // (n)

fn flat(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.x + wid.y * nwg.x) * WG + lid;
}

@compute @workgroup_size(WG)
fn add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i < p.n) {
        out[i] = a[i] + b[i];
    }
}

@compute @workgroup_size(WG)
fn scale(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i < p.n) {
        uout[i] = a[i] * p.scale;
    }
}

@compute @workgroup_size(WG)
fn scale_inplace(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i < p.n) {
        io[i] = io[i] * p.scale;
    }
}

@compute @workgroup_size(WG)
fn add_row(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i < p.n) {
        out[i] = a[i] + b[i % p.c];
    }
}

@compute @workgroup_size(WG)
fn add_row_inplace(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i < p.n) {
        io[i] = io[i] + b[i % p.c];
    }
}

@compute @workgroup_size(WG)
fn add_rows_at(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i < p.n) {
        out[i] = a[i] + b[p.start * p.c + i];
    }
}

@compute @workgroup_size(WG)
fn add_rows_at_inplace(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i < p.n) {
        io[i] = io[i] + b[p.start * p.c + i];
    }
}

@compute @workgroup_size(WG)
fn add_inplace(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i < p.n) {
        io[i] = io[i] + b[i];
    }
}

// ---- vec4 variants -------------------------------------------------------------------------------
// Chosen by the launchers when n (and C for the row ops) is a multiple of 4: a quarter of the
// invocations and one 16-byte access per 4 elements (5-10x faster on lavapipe, where every dynamically
// addressed load is a loop over the lanes). Indices below count vec4s; `p.n` and `p.c` stay in floats.

@group(0) @binding(1) var<storage, read> a4: array<vec4<f32>>;          // (n / 4)
@group(0) @binding(2) var<storage, read> b4: array<vec4<f32>>;          // (n / 4) | (C / 4) | (P * C / 4)
@group(0) @binding(3) var<storage, read_write> out4: array<vec4<f32>>;  // (n / 4)
@group(0) @binding(2) var<storage, read_write> uout4: array<vec4<f32>>; // (n / 4), scale4
@group(0) @binding(1) var<storage, read_write> io4: array<vec4<f32>>;   // (n / 4), in place

@compute @workgroup_size(WG)
fn add4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i < p.n / 4u) {
        out4[i] = a4[i] + b4[i];
    }
}

@compute @workgroup_size(WG)
fn add4_inplace(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i < p.n / 4u) {
        io4[i] = io4[i] + b4[i];
    }
}

@compute @workgroup_size(WG)
fn scale4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i < p.n / 4u) {
        uout4[i] = a4[i] * p.scale;
    }
}

@compute @workgroup_size(WG)
fn scale4_inplace(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i < p.n / 4u) {
        io4[i] = io4[i] * p.scale;
    }
}

@compute @workgroup_size(WG)
fn add_row4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i < p.n / 4u) {
        out4[i] = a4[i] + b4[i % (p.c / 4u)];
    }
}

@compute @workgroup_size(WG)
fn add_row4_inplace(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i < p.n / 4u) {
        io4[i] = io4[i] + b4[i % (p.c / 4u)];
    }
}

@compute @workgroup_size(WG)
fn add_rows_at4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i < p.n / 4u) {
        out4[i] = a4[i] + b4[p.start * (p.c / 4u) + i];
    }
}

@compute @workgroup_size(WG)
fn add_rows_at4_inplace(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i < p.n / 4u) {
        io4[i] = io4[i] + b4[p.start * (p.c / 4u) + i];
    }
}
