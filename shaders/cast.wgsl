// Element type conversion: f32 -> IEEE half, packed two per u32 (the `DType::F16` layout: element i in the
// low half of word i / 2 when i is even, the high half when odd), rounded by `pack2x16float`. Used for
// activations stored in f16: the decoder's cross-attention K/V (the Linear writes f32, this packs it
// into the cache) and the cache rows of a recorded (fixed-position) decoder step. An odd element count
// leaves the last word's high half 0. WGSL lets the conversion round to either neighbour when a value is
// not representable (a relative error below 2^-10; round-to-nearest, as lavapipe does, gives 2^-11) and
// leaves values beyond the f16 range (|x| > 65504) indeterminate: attention K/V are far inside it.
//
// One invocation per output word, grid folded by `grid_1d`.

// WG, the workgroup size: from the launcher (src/ops/cast.rs, SHADER's consts).

struct Params {
    n: u32,      // input elements
    words: u32,  // output words = ceil(n / 2)
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;          // (n)
@group(0) @binding(2) var<storage, read_write> out: array<u32>;  // (ceil(n / 2)) f16 pairs

@compute @workgroup_size(WG)
fn f32_to_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let w = (wid.x + wid.y * nwg.x) * WG + lid;
    if (w >= p.words) {
        return;
    }
    let i = 2u * w;
    var hi = 0.0;
    if (i + 1u < p.n) {
        hi = x[i + 1u];
    }
    out[w] = pack2x16float(vec2<f32>(x[i], hi));
}
