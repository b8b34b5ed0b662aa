// Workgroup tree reductions for kernels that give one workgroup to each row (`#include row_reduce`).
// Every invocation of the workgroup must call them (they contain barriers) and gets the result. The
// including shader declares `override WG: u32` (a power of two: the workgroup size); the scratch array is
// sized by it, so the launcher's workgroup size is the only place that size is written.

var<workgroup> red: array<f32, WG>;

fn reduce_sum(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            red[lid] = red[lid] + red[lid + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier(); // `red` is reused by the next reduction
    return r;
}

fn reduce_max(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}
