// Bench-only (scripts/bench/gemv.rs): the read-bandwidth ceiling of the adapter's storage loads. Every
// invocation XORs `per` vec4<u32> words and writes one u32. CONTIG: the 64 lanes of a workgroup sweep
// the workgroup's run of 64*per words together, lane l reading words l, l + 64, l + 128, ... (each load
// instruction of a SIMD group reads consecutive words); otherwise lane i reads its own run
// i*per .. (i+1)*per (a stream per lane, like a GEMV row).

struct Params {
    per: u32,   // words per invocation
    total: u32, // invocations
    _p0: u32,
    _p1: u32,
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

override CONTIG: bool = true;
override CHUNK: bool = false; // each 8-lane SIMD chunk sweeps its own run, lanes on consecutive words

// WG, the workgroup size: from the bench (READ's consts in scripts/bench/gemv.rs).
@compute @workgroup_size(WG)
fn read_words(@builtin(global_invocation_id) gid: vec3<u32>,
              @builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = gid.x;
    if (i >= p.total) {
        return;
    }
    var a = vec4<u32>();
    for (var t = 0u; t < p.per; t++) {
        var idx = i * p.per + t;
        if (CONTIG) {
            idx = (wid.x * p.per + t) * WG + lid;
        }
        if (CHUNK) {
            idx = (i / 8u) * p.per * 8u + t * 8u + i % 8u;
        }
        a ^= src[idx];
    }
    dst[i] = a.x ^ a.y ^ a.z ^ a.w;
}
