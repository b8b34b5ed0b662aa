// Element type of a kernel's float arrays (`#include lanes`): in the VEC4 variant `F` is vec4<f32>, four
// consecutive channels per element, so each access moves 16 bytes (several times faster on lavapipe,
// where every dynamically addressed load is a loop over the lanes); otherwise `F` is f32. LANES floats
// per element; sizes in `Params` that count elements are divided by LANES by the launcher or the shader,
// as each shader's header says.
#if VEC4
alias F = vec4<f32>;
const LANES: u32 = 4u;
#else
alias F = f32;
const LANES: u32 = 1u;
#endif
