// Shared by the attention shaders (attention, attention_rows, attention_flash): how many keys are
// valid and where the query rows sit, from the params uniform or, in the DYN_LEN variant, from a
// buffer; and the running-max / mask thresholds of the online softmax. Needs `p` with tk, kv_len and
// q_offset declared before the include.

#if DYN_LEN
// Dynamic length (a recorded decode step, replayed with the same bind group every step): the key count
// and the query position come from a buffer written per step, not from the params uniform.
// dyn_len[0] = kv_len (clamped to tk, so every bound below still holds), dyn_len[1] = q_offset.
@group(0) @binding(6) var<storage, read> dyn_len: array<u32>;  // (2)
fn kv_len() -> u32 {
    return min(dyn_len[0], p.tk);
}
fn q_offset() -> u32 {
    return dyn_len[1];
}
#else
fn kv_len() -> u32 {
    return p.kv_len;
}
fn q_offset() -> u32 {
    return p.q_offset;
}
#endif

const NEG: f32 = -3.0e38;      // running-max start: below any real score
const VISIBLE: f32 = -1.0e38;  // scores at or below this are masked (additive -inf / finfo.min masks)
