// The linear kernels' epilogue (`#include linear_epilogue`): the bias, then the activation, chosen by
// `p.flags` (bit 0: add `bias[col]`; bit 1: exact GELU). The including shader declares `p` (with
// `flags`) and the `bias` binding.

#include gelu

fn epilogue(v: f32, col: u32) -> f32 {
    var r = v;
    if ((p.flags & 1u) != 0u) {
        r = r + bias[col];
    }
    if ((p.flags & 2u) != 0u) {
        r = gelu_f32(r);
    }
    return r;
}
