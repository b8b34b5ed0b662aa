// Which of the package's two wasm builds this engine runs. Both are the same crate with one glue
// (florence2_wasm.js): `florence2_wasm_relaxed_bg.wasm` is built with relaxed SIMD (`+relaxed-simd`: the
// CPU backend's GEMM fuses its multiply-adds, `f32x4.relaxed_madd`), `florence2_wasm_bg.wasm` with
// SIMD128 only. An engine without relaxed SIMD refuses the whole relaxed module, so the choice is made
// before instantiating, by running a tiny probe module.

/** A module exporting `d()`: it runs `f32x4.relaxed_madd` (result dropped) and returns lane 0 of
 * `i32x4.relaxed_dot_i8x16_i7x16_add_s` of two constant vectors, whose b operand is 7-bit (0..127), so
 * the specification defines the result exactly: -127 * 0 + 5 * 15 - 3 * 7 + 100 * 8 = 854. */
const RELAXED_PROBE = new Uint8Array([
  0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // "\0asm", version 1
  0x01, 0x05, 0x01, 0x60, 0x00, 0x01, 0x7f, // type 0: () -> i32
  0x03, 0x02, 0x01, 0x00, // function 0 of type 0
  0x07, 0x05, 0x01, 0x01, 0x64, 0x00, 0x00, // export "d": function 0
  0x0a, 0x7a, 0x01, 0x78, 0x00, // code: one body of 120 bytes, no locals
  ...v128Const(new Array(16).fill(0)), ...v128Const(new Array(16).fill(0)), ...v128Const(new Array(16).fill(0)),
  0xfd, 0x85, 0x02, // f32x4.relaxed_madd (0x105)
  0x1a, // drop
  ...v128Const([0x81, 5, 0xfd, 100, 7, 0xf8, 0, 1, 127, 0x81, 50, 0xce, 2, 3, 4, 5]), // a: i8 (-127, 5, -3, 100, ...)
  ...v128Const([0, 15, 7, 8, 1, 2, 3, 4, 15, 15, 0, 1, 9, 10, 11, 12]), // b: 0..127
  ...v128Const(new Array(16).fill(0)), // c: zero
  0xfd, 0x93, 0x02, // i32x4.relaxed_dot_i8x16_i7x16_add_s (0x113)
  0xfd, 0x1b, 0x00, // i32x4.extract_lane 0
  0x0b, // end
]);

/** `v128.const` of 16 bytes. */
function v128Const(bytes) {
  return [0xfd, 0x0c, ...bytes];
}

let relaxed = null;

/** Whether this engine runs relaxed SIMD as specified: the probe compiles and its dot product is the
 * specification's (an engine with an earlier draft of the proposal, such as Node.js 20 behind
 * `--experimental-wasm-relaxed-simd`, computes another value and gets the SIMD128 build). False where
 * WebAssembly is missing or the probe throws. Computed once. */
export function relaxedSimd() {
  if (relaxed === null) {
    try {
      relaxed = new WebAssembly.Instance(new WebAssembly.Module(RELAXED_PROBE)).exports.d() === 854;
    } catch {
      relaxed = false;
    }
  }
  return relaxed;
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
