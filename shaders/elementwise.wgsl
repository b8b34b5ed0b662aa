// Element-wise kernels over flat f32 arrays: out = a + b, out = a * s.
//
// Each invocation handles one element; the grid is folded into (x, y) by `grid_1d` on the host when the
// array needs more than 65535 workgroups, so the flat index is rebuilt from both grid dimensions.

override WG: u32 = 256;

struct Params {
    n: u32,      // element count
    scale: f32,  // multiplier for `scale`
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;        // (n)
@group(0) @binding(2) var<storage, read> b: array<f32>;        // (n)
@group(0) @binding(3) var<storage, read_write> out: array<f32>; // (n)

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
