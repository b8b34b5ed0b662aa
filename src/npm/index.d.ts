// Types of the package entry (index.js): everything florence2_wasm.d.ts declares, plus an optional
// `init()` and the worker client.
import type { InitInput, InitOutput, SyncInitInput } from "./florence2_wasm.js";
export * from "./florence2_wasm.js";
export { Florence2Worker, WorkerEncodedImage } from "./client.js";
export { drawResult, regionTokens, DRAW_COLORS } from "./draw.js";
export type { DrawContext2D, DrawCanvas, DrawOptions } from "./draw.js";

/** Load and instantiate the wasm module (optional: `Florence2.load` does it on first use). `input`: where
 * the `.wasm` is (default: the build {@link wasmBuild} names, next to the package's JS file), or the
 * module itself. */
export function init(
  input?: { module_or_path: InitInput | Promise<InitInput> } | InitInput | Promise<InitInput>,
): Promise<InitOutput>;
export default init;
/** The wasm build this engine runs: `"relaxed-simd"` (`florence2_wasm_relaxed_bg.wasm`: the CPU
 * backend's GEMM fuses its multiply-adds) where it validates relaxed SIMD, `"simd128"`
 * (`florence2_wasm_bg.wasm`) elsewhere. `init()` fetches that file unless given another. */
export function wasmBuild(): "relaxed-simd" | "simd128";
/** Instantiate from wasm bytes or a compiled module, synchronously. */
export function initSync(module: { module: SyncInitInput } | SyncInitInput): InitOutput;
