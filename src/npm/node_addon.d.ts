// Types of src/npm/node_addon.js: the `Florence2` API on the native Node addon.

import type { MemoryInfo, ProgressEvent } from "./florence2_wasm.js";

// Errors carry the facade's names (`Florence2ErrorName` of the package's types) as `error.name`.

/** The engine to load on: a hardware GPU else the CPU backend, any GPU adapter, or the CPU backend. */
export type NativeDevice = "auto" | "gpu" | "cpu";

export interface NativeLoadOptions {
  device?: NativeDevice;
  /** Called for each file read (`done`, `cached: true`) or downloaded into the Hugging Face cache
   * (`download`, `progress`, `done`), each followed by `progress_total`, then `{status: "dtype", dtype,
   * reason}` and `{status: "ready"}`: the wasm build's events. */
  onProgress?: (event: ProgressEvent) => void;
  /** "auto", "fp32", "fp16", "q8" or "q4", or a format per part: `{vision: "fp16", text: "q4"}` or its
   * text form "vision=fp16,text=q4" (parts: vision, projector, encoder, decoder, embed, text). */
  dtype?:
    | "auto"
    | "fp32"
    | "fp16"
    | "q8"
    | "q4"
    | `vision=${string}`
    | { [P in "vision" | "projector" | "encoder" | "decoder" | "embed" | "text" | "default"]?: "fp32" | "fp16" | "q8" | "q4" };
  signal?: AbortSignal;
}

export interface NativeTaskOptions {
  maxNewTokens?: number;
  numBeams?: number;
  noRepeatNgramSize?: number;
  /** Tiling for `<OCR>`, `<OCR_WITH_REGION>`, `<OD>`, `<DENSE_REGION_CAPTION>`, `<REGION_PROPOSAL>` on an
   * image (not an encoding): "auto", "off" (the default) or "RxC" such as "2x3". */
  tiles?: TilesOption;
  signal?: AbortSignal;
  /** Each token's text and id, on the JS thread, all before the task's promise settles. */
  onToken?: (text: string, tokenId: number) => void;
}

/** A path, a `file:` URL, a PNG/JPEG/WebP/GIF/BMP file's bytes, or RGBA pixels. */
export type NativeImage =
  | string
  | URL
  | ArrayBuffer
  | ArrayBufferView
  | { data: ArrayBufferView; width: number; height: number };

/** The memory report of the package's types, as the native addon fills it. */
export interface NativeMemory extends MemoryInfo {
  /** Which device ran: "gpu" (native wgpu) or "cpu" (the native CPU backend). */
  device: "gpu" | "cpu";
  /** Always "native" (the wasm build's results say "wasm" in Node.js). */
  engine: "native";
}

/** The wasm build's result shape. */
export interface NativeTaskResult {
  task: string;
  text: string;
  result: Record<string, unknown>;
  generatedText: string;
  tokenIds: number[];
  timings: { preprocess: number; encode: number; decode: number; total: number };
  memory: NativeMemory;
  /** What a tiled run chose (only with `tiles` other than off). */
  tiles?: TilesReport;
}

/** `auto`, `off` or a grid of rows x columns (2 to 16 tiles). */
export type TilesOption = "auto" | "off" | `${number}x${number}`;
/** The grid a tiled run used (`tile`: its [width, height] in image pixels), or why it ran one view. */
export type TilesReport =
  | { rows: number; cols: number; overlap: number; views: number; tile: [number, number]; capped: boolean }
  | { off: string };

export declare const PLATFORM_PACKAGES: Record<string, string>;
export declare function platformTriple(): string;
export declare function loadAddon(): { addon: unknown | null; reason: string };
/** The addon's `probeGpu()`: the adapter native wgpu opens, as `device: "auto"` judges it. */
export interface GpuProbe {
  hardware: boolean;
  adapter: string;
  reason: string;
}
/** Whether the addon reads `source` itself (a directory path, a `file:` URL or a hub id). */
export declare function nativeReads(source: unknown): boolean;

/** `encodeImage`'s result: the vision tower's output, kept for this model's tasks. */
export declare class NativeEncodedImage {
  private constructor(input: unknown);
  readonly width: number;
  readonly height: number;
  readonly encodingId: number;
  readonly disposed: boolean;
  dispose(): void;
  free(): void;
  [Symbol.dispose](): void;
}

export declare class NativeFlorence2 {
  private constructor(model: unknown);
  static load(source: string | URL, options?: NativeLoadOptions): Promise<NativeFlorence2>;
  readonly adapterInfo: string;
  readonly tuningTable: string;
  readonly disposed: boolean;
  runTask(image: NativeImage | NativeEncodedImage, task: string, options?: NativeTaskOptions): Promise<NativeTaskResult>;
  encodeImage(image: NativeImage, options?: { signal?: AbortSignal }): Promise<NativeEncodedImage>;
  memory(): NativeMemory;
  reload(): Promise<void>;
  dispose(): void;
  free(): void;
  [Symbol.dispose](): void;
}
