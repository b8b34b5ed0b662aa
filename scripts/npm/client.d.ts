import type { LoadOptions, ModelSource, RunTaskOptions, TaskOutput, CacheInfo, ImageInput } from "./florence2_wasm.js";

/** Load options a worker can receive (callbacks and the signal stay on the page). */
export type WorkerLoadOptions = LoadOptions;

/** A Florence-2 model running in a Web Worker that imports `florence2-wasm/worker`. Same results as
 * `Florence2`; images that are DOM elements are sent as an `ImageBitmap` of their pixels. */
export declare class Florence2Worker {
  private constructor();
  /** Load `source` in `worker` (a module worker whose script imports "florence2-wasm/worker"). */
  static load(worker: Worker, source: ModelSource, options?: WorkerLoadOptions): Promise<Florence2Worker>;
  /** `Florence2.runTask` in the worker; `transfer` moves ImageBitmaps/VideoFrames instead of copying. */
  runTask(image: ImageInput, prompt: string, options?: RunTaskOptions, transfer?: Transferable[]): Promise<TaskOutput>;
  cacheInfo(source?: ModelSource, options?: LoadOptions): Promise<CacheInfo>;
  clearCache(source?: ModelSource, options?: LoadOptions): Promise<boolean>;
  dispose(): Promise<void>;
  readonly disposed: boolean;
  /** The GPU adapter the worker uses. */
  readonly adapterInfo: string;
  /** Stop the worker; pending calls reject with an AbortError. */
  terminate(): void;
}
