import type {
  LoadOptions, ModelSource, RunTaskOptions, TaskOutputFor, CacheInfo, ImageInput, GlobalType,
} from "./florence2_wasm.js";

/** The DOM's `Worker` where the program's libs declare it, else `never` (the client is for browsers; it
 * still type-checks in a Node.js project without the DOM lib). */
export type DomWorker = GlobalType<"Worker">;
/** What `DomWorker.postMessage` takes as its transfer list (`Transferable[]` with the DOM lib), else
 * `never`. */
export type TransferList = [DomWorker] extends [never]
  ? never
  : DomWorker extends { postMessage(message: unknown, options?: { transfer?: infer T }): void } ? T : never;

/** Load options a worker can receive (callbacks and the signal stay on the page). */
export type WorkerLoadOptions = LoadOptions;

/** A Florence-2 model running in a Web Worker that imports `florence2-wasm/worker`. Same results as
 * `Florence2`; images that are DOM elements are sent as an `ImageBitmap` of their pixels. */
export declare class Florence2Worker {
  private constructor();
  /** Load `source` in `worker` (a module worker whose script imports "florence2-wasm/worker"). */
  static load(worker: DomWorker, source: ModelSource, options?: WorkerLoadOptions): Promise<Florence2Worker>;
  /** `Florence2.runTask` in the worker; `transfer` moves ImageBitmaps/VideoFrames instead of copying. The
   * output type follows the prompt as `Florence2.runTask`'s does (`TaskOutputFor`). */
  runTask<P extends string>(
    image: ImageInput, prompt: P, options?: RunTaskOptions, transfer?: TransferList,
  ): Promise<TaskOutputFor<P>>;
  cacheInfo(source?: ModelSource, options?: LoadOptions): Promise<CacheInfo>;
  clearCache(source?: ModelSource, options?: LoadOptions): Promise<boolean>;
  dispose(): Promise<void>;
  readonly disposed: boolean;
  /** The GPU adapter the worker uses. */
  readonly adapterInfo: string;
  /** Stop the worker; pending calls reject with an AbortError. */
  terminate(): void;
}
