import type {
  LoadOptions, ModelSource, RunTaskOptions, TaskOutputFor, CacheInfo, ImageInput, GlobalType, SupportInfo,
  MemoryInfo, ReloadOptions, EncodeImageOptions, EstimateOptions, MemoryEstimate,
} from "./florence2_wasm.js";

export { drawResult, regionTokens, DRAW_COLORS } from "./draw.js";
export type { DrawContext2D, DrawCanvas, DrawOptions } from "./draw.js";

/** The DOM's `Worker` where the program's libs declare it, else `never` (the client is for browsers; it
 * still type-checks in a Node.js project without the DOM lib). */
export type DomWorker = GlobalType<"Worker">;
/** What `DomWorker.postMessage` takes as its transfer list (`Transferable[]` with the DOM lib), else
 * `never`. */
export type TransferList = [DomWorker] extends [never]
  ? never
  : DomWorker extends { postMessage(message: unknown, options?: { transfer?: infer T }): void } ? T : never;

/** Load options a worker can receive: `onProgress` and `signal` stay on the page (events and aborts are
 * forwarded); `fetch` cannot cross threads and is refused with `Florence2InputError`. */
export type WorkerLoadOptions = Omit<LoadOptions, "fetch">;

/** An image encoded in the worker (`Florence2Worker.encodeImage`): pass it to `runTask` instead of the
 * image to skip the vision tower. */
export declare class WorkerEncodedImage {
  private constructor();
  readonly encodingId: number;
  /** The original image's size in pixels. */
  readonly width: number;
  readonly height: number;
  /** Whether `dispose()` was called; `runTask` on it then rejects with `Florence2InputError`. */
  readonly disposed: boolean;
  /** Free its GPU memory in the worker. */
  dispose(): Promise<void>;
}

/** A Florence-2 model running in a Web Worker that imports `florence2-wasm/worker`. Same results as
 * `Florence2`; images that are DOM elements are sent as an `ImageBitmap` of their pixels. */
export declare class Florence2Worker {
  private constructor();
  /** `Florence2.isSupported()` as seen in `worker` (WebGPU in workers can differ from the page's); loads no
   * model. */
  static isSupported(worker: DomWorker): Promise<SupportInfo>;
  /** `Florence2.estimate` as `worker`'s device sees it; loads no model (`fetch` is refused, as for `load`). */
  static estimate(worker: DomWorker, source: ModelSource, options?: Omit<EstimateOptions, "fetch">): Promise<MemoryEstimate>;
  /** Load `source` in `worker` (a module worker whose script imports "florence2-wasm/worker"). */
  static load(worker: DomWorker, source: ModelSource, options?: WorkerLoadOptions): Promise<Florence2Worker>;
  /** `Florence2.encodeImage` in the worker. */
  encodeImage(image: ImageInput, options?: EncodeImageOptions, transfer?: TransferList): Promise<WorkerEncodedImage>;
  /** `Florence2.runTask` in the worker, on an image or a `WorkerEncodedImage`; `transfer` moves
   * ImageBitmaps/VideoFrames instead of copying. The output type follows the prompt as `Florence2.runTask`'s
   * does (`TaskOutputFor`). `profile: true` and `onToken` work as there. */
  runTask<P extends string>(
    image: ImageInput | WorkerEncodedImage, prompt: P, options?: RunTaskOptions, transfer?: TransferList,
  ): Promise<TaskOutputFor<P>>;
  /** `Florence2.memory()` in the worker (a promise: the model lives on another thread). */
  memory(): Promise<MemoryInfo>;
  /** `Florence2.reload()` in the worker; encodings made before it are released. */
  reload(options?: ReloadOptions): Promise<void>;
  cacheInfo(source?: ModelSource, options?: LoadOptions): Promise<CacheInfo>;
  clearCache(source?: ModelSource, options?: LoadOptions): Promise<boolean>;
  dispose(): Promise<void>;
  readonly disposed: boolean;
  /** The GPU adapter the worker uses. */
  readonly adapterInfo: string;
  /** The worker model's kernel choices (`Florence2.tuningTable`) as of its last load, run or reload. */
  readonly tuningTable: string;
  /** Stop the worker; pending calls reject with an AbortError. */
  terminate(): void;
}
