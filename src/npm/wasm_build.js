// Which of the package's two wasm builds this engine runs. Both are the same crate with one glue
// (florence2_wasm.js): `florence2_wasm_relaxed_bg.wasm` is built with relaxed SIMD (`+relaxed-simd`: the
// CPU backend's GEMM fuses its multiply-adds, `f32x4.relaxed_madd`), `florence2_wasm_bg.wasm` with
// SIMD128 only. An engine without relaxed SIMD refuses the whole relaxed module, so the choice is made
// before instantiating, by validating a tiny probe module.

/** A module whose one function returns `f32x4.relaxed_madd` of its three v128 parameters. */
const RELAXED_PROBE = new Uint8Array([
  0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // "\0asm", version 1
  0x01, 0x08, 0x01, 0x60, 0x03, 0x7b, 0x7b, 0x7b, 0x01, 0x7b, // type: (v128, v128, v128) -> v128
  0x03, 0x02, 0x01, 0x00, // one function of that type
  0x0a, 0x0d, 0x01, 0x0b, 0x00, // code: one body of 11 bytes, no locals
  0x20, 0x00, 0x20, 0x01, 0x20, 0x02, // local.get 0, 1, 2
  0xfd, 0x85, 0x02, // f32x4.relaxed_madd (0xfd 0x105)
  0x0b, // end
]);

/** Whether this engine runs relaxed SIMD (false where WebAssembly is missing or validation throws). */
export function relaxedSimd() {
  try {
    return WebAssembly.validate(RELAXED_PROBE);
  } catch {
    return false;
  }
}

/** The build this engine runs: "relaxed-simd" or "simd128". */
export function wasmBuild() {
  return relaxedSimd() ? "relaxed-simd" : "simd128";
}

/** The URL of the build this engine runs, next to this module. Each URL is written out in full, so
 * bundlers (webpack 5, Vite, Rollup, Parcel) see both files and emit them. */
export function wasmUrl() {
  return relaxedSimd()
    ? new URL("./florence2_wasm_relaxed_bg.wasm", import.meta.url)
    : new URL("./florence2_wasm_bg.wasm", import.meta.url);
}
