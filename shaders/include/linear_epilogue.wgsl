// The linear kernels' epilogue (`#include linear_epilogue`): the bias, then the activation, then the
// residual, chosen by `p.flags` (bit 0: add `bias[col]`; bit 1: exact GELU; bit 2: add `res[m, col]`,
// i.e. out = act(x W^T + b) + residual, the transformer's `x + sublayer(x)` without a separate add
// pass). The including shader declares `p` (with `flags` and `n`, the row stride of out and res) and the
// `bias` and `res` bindings.

#include gelu

fn epilogue(v: f32, m: u32, col: u32) -> f32 {
    var r = v;
    if ((p.flags & 1u) != 0u) {
        r = r + bias[col];
    }
    if ((p.flags & 2u) != 0u) {
        r = gelu_f32(r);
    }
    if ((p.flags & 4u) != 0u) {
        r = r + res[m * p.n + col];
    }
    return r;
}
