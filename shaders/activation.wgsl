// Exact (erf-based) GELU, as torch.nn.GELU() / F.gelu(approximate='none'):
//   gelu(x) = 0.5 * x * (1 + erf(x / sqrt(2)))
// WGSL has no erf. `erf_f32` is the rational approximation used by Eigen / XLA for f32
// (odd degree-13 numerator over even degree-8 denominator in x, input clamped to [-4, 4] where erf
// is +-1 to f32 precision); it is accurate to a few ulp over the whole range, tested against an f64
// series in tests/kernels_activation.rs. `erf_f32` and `gelu_f32` are plain functions so other shaders
// (the matmul epilogue) can paste them.
//
// One invocation per element, grid folded by `grid_1d`.

override WG: u32 = 256;

struct Params {
    n: u32, // element count
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;         // (n)
@group(0) @binding(2) var<storage, read_write> out: array<f32>; // (n)

// gelu_inplace: x and out are one buffer
@group(0) @binding(1) var<storage, read_write> io: array<f32>;  // (n)

fn erf_f32(a: f32) -> f32 {
    let v = clamp(a, -4.0, 4.0);
    let v2 = v * v;
    var n = fma(v2, -2.72614225801306e-10, 2.77068142495902e-08);
    n = fma(v2, n, -2.10102402082508e-06);
    n = fma(v2, n, -5.69250639462346e-05);
    n = fma(v2, n, -7.34990630326855e-04);
    n = fma(v2, n, -2.95459980854025e-03);
    n = fma(v2, n, -1.60960333262415e-02);
    n = v * n;
    var d = fma(v2, -1.45660718464996e-05, -2.13374055278905e-04);
    d = fma(v2, d, -1.68282697438203e-03);
    d = fma(v2, d, -7.37332916720468e-03);
    d = fma(v2, d, -1.42647390514189e-02);
    return n / d;
}

fn gelu_f32(v: f32) -> f32 {
    return 0.5 * v * (1.0 + erf_f32(v * 0.7071067811865476));
}

fn flat(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.x + wid.y * nwg.x) * WG + lid;
}

@compute @workgroup_size(WG)
fn gelu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i < p.n) {
        out[i] = gelu_f32(x[i]);
    }
}

@compute @workgroup_size(WG)
fn gelu_inplace(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i < p.n) {
        io[i] = gelu_f32(io[i]);
    }
}

// vec4 variants (n % 4 == 0, chosen by the launcher): a quarter of the invocations and one 16-byte
// load per 4 elements. On lavapipe, where every dynamically addressed load is a loop over the lanes,
// this is 5-10x faster; on GPUs it is the usual vectorised access.
@group(0) @binding(1) var<storage, read> x4: array<vec4<f32>>;         // (n / 4)
@group(0) @binding(2) var<storage, read_write> out4: array<vec4<f32>>; // (n / 4)
@group(0) @binding(1) var<storage, read_write> io4: array<vec4<f32>>;  // (n / 4), in place

fn gelu_v4(v: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(gelu_f32(v.x), gelu_f32(v.y), gelu_f32(v.z), gelu_f32(v.w));
}

@compute @workgroup_size(WG)
fn gelu4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i < p.n / 4u) {
        out4[i] = gelu_v4(x4[i]);
    }
}

@compute @workgroup_size(WG)
fn gelu4_inplace(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let i = flat(wid, nwg, lid);
    if (i < p.n / 4u) {
        io4[i] = gelu_v4(io4[i]);
    }
}
