// K/V bindings and loads of the vec4 attention shaders (attention_rows, attention_flash;
// `#include attn_kv4`). K and V are f32, or, in the KV_F16 variant, IEEE halves packed two per u32 (the
// decoder's KV caches and cross-attention K/V when the weights are not fp32: half the bytes of f32). Either
// way `k4(i)` / `v4(i)` return four consecutive channels as vec4<f32>: the arithmetic stays f32, and
// `unpack2x16float` needs no `shader-f16`. Indices count groups of four channels in both variants (a
// vec4<f32> or a vec2<u32> element), so the callers' strides and offsets do not change.

#if KV_F16
@group(0) @binding(2) var<storage, read> k: array<vec2<u32>>;  // (Bk, Tk, row/4) 4 halves per element
@group(0) @binding(3) var<storage, read> v: array<vec2<u32>>;  // (Bk, Tk, row/4) 4 halves per element

fn k4(i: u32) -> vec4<f32> {
    let w = k[i];
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}
fn v4(i: u32) -> vec4<f32> {
    let w = v[i];
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}
#else
@group(0) @binding(2) var<storage, read> k: array<vec4<f32>>;  // (Bk, Tk, row/4)
@group(0) @binding(3) var<storage, read> v: array<vec4<f32>>;  // (Bk, Tk, row/4)

fn k4(i: u32) -> vec4<f32> {
    return k[i];
}
fn v4(i: u32) -> vec4<f32> {
    return v[i];
}
#endif
