// The params uniform of the linear kernels (`#include linear_params`: matmul.wgsl and, through
// matmul_common, the vec4 ones), mirrored by `LinearParams` in src/ops/matmul.rs.

struct Params {
    m: u32,       // rows of x / out
    n: u32,       // total columns of out (row stride of out)
    k: u32,       // reduction length (a multiple of 8 for the vec4 kernels)
    n_off: u32,   // first output column of this weight chunk
    n_rows: u32,  // weight rows (output columns) in this chunk
    flags: u32,   // bit 0: add bias; bit 1: exact GELU; bit 2: add the residual
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
