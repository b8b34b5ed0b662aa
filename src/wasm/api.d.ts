
/** The instance type of the global class `Name` where the program's libs declare it (`ImageBitmap` with
 * the DOM or web worker lib), else `never`: the declarations name browser-only classes exactly as the
 * DOM lib types them, and still compile without it (Node.js with `lib: ["es2022"]`, `types: ["node"]`). */
export type GlobalType<Name extends string> =
  typeof globalThis extends { [K in Name]: { prototype: infer T } } ? T : never;
/** `WebAssembly.Name` (a class of the `WebAssembly` namespace) where the libs declare it, else `never`. */
export type WebAssemblyType<Name extends string> =
  typeof globalThis extends { WebAssembly: { [K in Name]: { prototype: infer T } } } ? T : never;
/** What `WebAssembly` compiles from (`BufferSource` with the DOM lib), else the buffers and their views. */
export type WebAssemblySource =
  typeof globalThis extends { WebAssembly: { validate(bytes: infer B): boolean } } ? B : ArrayBuffer | ArrayBufferView;
/** `{ [Symbol.dispose](): void }` where the libs declare `Symbol.dispose` (lib `esnext.disposable`,
 * @types/node), else `{}`: `Florence2` and `EncodedImage` are `Disposable` (`using model = ...`) wherever
 * the program knows the symbol, and the declarations compile where it does not (lib ES2022). */
export type DisposableMember =
  SymbolConstructor extends { readonly dispose: infer S extends symbol } ? { [K in S]: () => void } : {};

/** A Florence-2 task marker. */
export type TaskMarker =
  | "<CAPTION>" | "<DETAILED_CAPTION>" | "<MORE_DETAILED_CAPTION>" | "<OCR>" | "<OCR_WITH_REGION>"
  | "<OD>" | "<DENSE_REGION_CAPTION>" | "<REGION_PROPOSAL>" | "<CAPTION_TO_PHRASE_GROUNDING>"
  | "<REFERRING_EXPRESSION_SEGMENTATION>" | "<REGION_TO_SEGMENTATION>" | "<OPEN_VOCABULARY_DETECTION>"
  | "<REGION_TO_CATEGORY>" | "<REGION_TO_DESCRIPTION>" | "<REGION_TO_OCR>";

/** `[x1, y1, x2, y2]` in original-image pixels. */
export type Box = [number, number, number, number];
/** `[x1, y1, x2, y2, x3, y3, x4, y4]` in original-image pixels. */
export type QuadBox = [number, number, number, number, number, number, number, number];
/** A flat `[x, y, x, y, ...]` polygon in original-image pixels. */
export type Polygon = number[];

/** `<OCR_WITH_REGION>`. */
export interface OcrResult { quad_boxes: QuadBox[]; labels: string[]; }
/** `<OD>`, `<DENSE_REGION_CAPTION>`, `<REGION_PROPOSAL>`, `<CAPTION_TO_PHRASE_GROUNDING>`. */
export interface BoxesResult { bboxes: Box[]; labels: string[]; }
/** `<REFERRING_EXPRESSION_SEGMENTATION>`, `<REGION_TO_SEGMENTATION>`: polygons per instance. */
export interface PolygonsResult { polygons: Polygon[][]; labels: string[]; }
/** `<OPEN_VOCABULARY_DETECTION>`: boxes or polygons. */
export interface BoxesOrPolygonsResult {
  bboxes: Box[]; bboxes_labels: string[]; polygons: Polygon[][]; polygons_labels: string[];
}

/** The post-processed answer type of each task. */
export interface TaskResultTypes {
  "<CAPTION>": string;
  "<DETAILED_CAPTION>": string;
  "<MORE_DETAILED_CAPTION>": string;
  "<OCR>": string;
  "<OCR_WITH_REGION>": OcrResult;
  "<OD>": BoxesResult;
  "<DENSE_REGION_CAPTION>": BoxesResult;
  "<REGION_PROPOSAL>": BoxesResult;
  "<CAPTION_TO_PHRASE_GROUNDING>": BoxesResult;
  "<REFERRING_EXPRESSION_SEGMENTATION>": PolygonsResult;
  "<REGION_TO_SEGMENTATION>": PolygonsResult;
  "<OPEN_VOCABULARY_DETECTION>": BoxesOrPolygonsResult;
  "<REGION_TO_CATEGORY>": string;
  "<REGION_TO_DESCRIPTION>": string;
  "<REGION_TO_OCR>": string;
}

/** Exactly `post_process_generation`'s value: `{ [task]: answer }`, e.g. `{"<OD>": {bboxes, labels}}`. */
export type TaskResultOf<T extends TaskMarker> = { [K in T]: TaskResultTypes[K] };
/** The result of any task (discriminate on the output's `task`). */
export type TaskResult = { [T in TaskMarker]: TaskResultOf<T> }[TaskMarker];

/** Milliseconds spent per stage of one `runTask` call. */
export interface TaskTimings {
  /** Image read/decode + resize + normalise (none on an `EncodedImage`), prompt tokenization. */
  preprocess: number;
  /** The vision tower (none on an `EncodedImage`), projector and encoder, until the GPU finished them
   * (`queue.onSubmittedWorkDone()`), so this is their GPU time, not the time to submit them. */
  encode: number;
  /** Decoding (greedy or beam search) until the last token was read back. */
  decode: number;
  total: number;
}

/** What `runTask` resolves to for task `T`. */
export interface TaskOutputOf<T extends TaskMarker> {
  task: T;
  /** A human-readable rendering of `result`. */
  text: string;
  result: TaskResultOf<T>;
  /** The generation decoded with special tokens kept. */
  generatedText: string;
  /** Generated ids, decoder start token first (as the reference's `generate`). */
  tokenIds: number[];
  timings: TaskTimings;
  /** GPU memory at the end of the call, with the peak reached during it. */
  memory: MemoryInfo;
  /** Per-dispatch GPU times: only with the `profile: true` option. */
  profile?: RunProfile;
  /** What a tiled run chose: only with the `tiles` option other than off. A tiled answer has no single
   * generation (`generatedText` and `tokenIds` are empty). */
  tiles?: TilesReport;
}
/** `auto`, `off` or a grid of rows x columns (2 to 16 tiles). */
export type TilesOption = "auto" | "off" | `${number}x${number}`;
/** The grid a tiled run used (`tile`: its [width, height] in image pixels), or why it ran one view. */
export type TilesReport =
  | { rows: number; cols: number; overlap: number; views: number; tile: [number, number]; capped: boolean }
  | { off: string };
/** What `runTask` resolves to for a model's own task marker (a fine-tune's `<GENERATE_TAGS>`, ...): the
 * answer is pure text. Cast a `TaskOutput` to it when `task` is not a built-in marker. */
export interface CustomTaskOutput {
  task: string;
  text: string;
  result: Record<string, string>;
  generatedText: string;
  tokenIds: number[];
  timings: TaskTimings;
  /** Per-dispatch GPU times: only with the `profile: true` option. */
  profile?: RunProfile;
}
/** What `runTask` resolves to: a union discriminated by `task`. */
export type TaskOutput = { [T in TaskMarker]: TaskOutputOf<T> }[TaskMarker];

/** The task marker a prompt starts with: `"<OD>"` for `"<OD>"`, `"<CAPTION_TO_PHRASE_GROUNDING>"` for
 * `"<CAPTION_TO_PHRASE_GROUNDING>a dog"`. */
export type MarkerOf<P extends string> = P extends `${infer M}>${string}` ? `${M}>` : never;
/** What `runTask(image, prompt)` resolves to for a prompt of type `P`: a literal prompt that starts with
 * a built-in marker gives that task's output (`(await model.runTask(img, "<OD>")).result["<OD>"].bboxes`
 * needs no narrowing); a literal prompt with another marker (a fine-tune's own) gives
 * `CustomTaskOutput`; a `string` prompt gives the `TaskOutput` union (discriminate on `task`). */
export type TaskOutputFor<P extends string> = string extends P
  ? TaskOutput
  : MarkerOf<P> extends TaskMarker
    ? TaskOutputOf<MarkerOf<P>>
    : CustomTaskOutput;

/** Decoded RGBA8 pixels, row by row (`ImageData`'s shape, for runtimes without `ImageData` such as
 * Node.js): `data.length` is `4 * width * height`. */
export interface RgbaImage {
  data: Uint8Array | Uint8ClampedArray;
  width: number;
  height: number;
}

/** Any image `runTask` accepts: an encoded file (`Blob`/`File`, or its bytes as a `Uint8Array` (a Node
 * `Buffer`) or `ArrayBuffer`: PNG and JPEG always; WebP, AVIF, GIF (first frame), BMP, ... when the
 * browser decodes them; EXIF orientation applied), an image URL (fetched; in Node.js also a file path or a
 * `file:` URL), decoded pixels, the current frame of a `<video>`, or a `VideoFrame`. The DOM classes
 * (`ImageBitmap`, `HTMLImageElement`, ...) are members where the program's libs declare them. */
export type ImageInput =
  | Blob | Uint8Array | ArrayBuffer | string | URL | RgbaImage | GlobalType<"ImageBitmap"> | GlobalType<"ImageData">
  | GlobalType<"HTMLImageElement"> | GlobalType<"HTMLCanvasElement"> | GlobalType<"OffscreenCanvas">
  | GlobalType<"HTMLVideoElement"> | GlobalType<"VideoFrame">;

/** A Hugging Face model id (`"microsoft/Florence-2-base-ft"`, resolved with `revision`, `remoteHost`,
 * `remotePathTemplate`), a hub page URL (`https://huggingface.co/ORG/NAME[/tree/REV]`), a model directory
 * URL (`config.json`, `tokenizer.json`, `model.safetensors` or `model.safetensors.index.json` + shards,
 * optional `preprocessor_config.json`, `generation_config.json`; a relative URL starts with `/` or `.`),
 * or an object mapping each file name to its URL. In Node.js also a directory path (absolute, starting
 * with `./` or `../`, or an existing directory) or a `file:` URL. */
export type ModelSource = string | URL | Record<string, string | URL>;

/** A download progress event (shaped like transformers.js's). After each file event (`initiate`,
 * `download`, `progress`, `done`) comes a `progress_total` event over every file seen so far: `loaded`
 * and `total` are their sums and `files` holds each one's bytes, for one progress bar over the whole
 * model. */
export interface ProgressEvent {
  status: "initiate" | "download" | "progress" | "done" | "dtype" | "tuning" | "ready" | "progress_total" | "cache_error";
  /** The model source (base URL). */
  name: string;
  /** The file this event is about (empty for `ready` and `progress_total`). */
  file: string;
  /** Bytes received so far (`progress_total`: over all files). */
  loaded: number;
  /** Content-Length (0 when unknown; `progress_total`: the sum of the files' known sizes, which grows
   * as files start). */
  total: number;
  /** Percent, 0..100. */
  progress: number;
  /** True when the file came from the Cache API instead of the network (`progress_total`: when any
   * file did). */
  cached: boolean;
  /** `progress_total` only: bytes per file name so far. */
  files?: Record<string, { loaded: number; total: number }>;
  /** `cache_error` only: why storing `file` in the Cache API failed (e.g. `QuotaExceededError: ...`); the
   * load goes on, the file is not cached, and `Florence2.cacheInfo()` lists the failure. */
  message?: string;
  /** `dtype` only (sent when the weights start, after the small files): the resident format the load
   * uses (a mix as its text form), and with `dtype: "auto"` why it was chosen (`reason`; empty for an
   * explicit format). */
  dtype?: WeightDType | WeightDTypeLabel;
  reason?: string;
}

export interface LoadLimits {
  /** Largest accepted `width * height` of an input image (default 50 000 000). */
  maxImagePixels?: number;
}

/** Resident format of the matrix weights on the GPU: f32, f16 (half the bytes, f32 arithmetic), or
 * block-quantized 8-bit / 4-bit (32 weights per block, one f16 scale). Any checkpoint converts into any
 * of them while it streams in. */
export type WeightDType = "fp32" | "fp16" | "q8" | "q4";

/** A part of the model with its own weight format: the DaViT vision tower, the projector (image
 * projection and position tables), the text encoder, the text decoder, the shared token embedding / LM
 * head; `text` stands for encoder, decoder and embed. */
export type ModelPart = "vision" | "projector" | "encoder" | "decoder" | "embed" | "text";

/** A format per part, e.g. `{vision: "fp16", text: "q4"}`. Parts not named take `default` (fp16 when
 * absent), except the projector, which follows `vision` when only that is named. */
export type WeightDTypeMix = { [P in ModelPart | "default"]?: WeightDType };

/** A mixed format as the engine reports it: `vision=FORMAT` then the other parts
 * (`"vision=fp16,text=q4"`, `"vision=q4,encoder=q4,decoder=q4,embed=q8"`). The same text is accepted
 * as a `dtype` option. */
export type WeightDTypeLabel = `vision=${string}`;

/** A `dtype` option: a format; a format per part (an object, or its text form
 * `"vision=fp16,text=q4"`); or "auto": the best-quality format whose estimate
 * (`Florence2.estimate`) fits the device, fp16, q8, then q4 with the text model in q8
 * (`"vision=q4,text=q8"`), q4 with the embeddings in q8, then q4 (fp32 only when asked for), judged
 * against the adapter's buffer limits and the device class's memory budget (README "Weight
 * precision"). Nothing fitting rejects with a `Florence2LoadError` that names the closest format; an
 * unknown part or format rejects with a `Florence2InputError` listing the valid names. */
export type WeightDTypeOption = WeightDType | "auto" | WeightDTypeMix | WeightDTypeLabel;

/** GPU bytes held by the model's tensors, counted by the engine. */
export interface MemoryInfo {
  /** The resident weight format (a mix as its text form, `"vision=fp16,text=q4"`). */
  dtype: WeightDType | WeightDTypeLabel;
  /** The device the model runs on (`device` load option): WebGPU, a GPU through the native Node.js
   * addon's wgpu ("gpu", Node.js only) or a CPU backend. Bytes are GPU memory on "webgpu" and "gpu" and
   * host memory on "cpu". */
  device: "webgpu" | "gpu" | "cpu";
  /** Node.js only: which build ran, the native addon or the wasm (the fallback when no addon fits the
   * platform, or `device: "wasm"`). Absent in browsers, where it is always the wasm. */
  engine?: "native" | "wasm";
  /** Weights now resident. */
  weightsBytes: number;
  /** Activations, caches and scratch now live (including `EncodedImage`s). */
  activationsBytes: number;
  currentBytes: number;
  /** Highest weights + activations since the model loaded (`model.memory()`) or since the `runTask`
   * call started (in its result). */
  peakBytes: number;
  peakActivationsBytes: number;
  /** Tensor buffers created so far. */
  allocations: number;
}

export interface LoadOptions {
  /** Resident weight format; default "fp16". Any checkpoint loads into any format; a quantized checkpoint
   * (`scripts/fixtures/convert_checkpoint.py --dtype q8|q4`) is copied straight into GPU buffers in its own format and
   * dequantized while it streams into the others. A format per part (`{vision: "fp16", text: "q4"}`)
   * loads each part exactly as that part's uniform format would. "auto" picks the format that fits the
   * device before anything is downloaded (the choice is in the `dtype` progress event and
   * `memory().dtype`). */
  dtype?: WeightDTypeOption;
  /** Advanced (tests, or a page that knows its platform better): the device limits `dtype: "auto"` judges
   * against, over what the adapter reports (`class`, `budgetBytes`, `maxBufferSize`,
   * `maxStorageBufferBindingSize`). */
  adapterLimits?: AdapterLimits;
  /** Where the model runs: "auto" (default) takes WebGPU on a hardware adapter and the CPU backend
   * otherwise (no `navigator.gpu`, no adapter, or only a software/fallback one); "webgpu" requires WebGPU
   * (`WebGPUUnavailableError` without it); "cpu" runs the same model on the CPU backend (wasm, one
   * thread, SIMD128). `model.adapterInfo` names the device that was chosen.
   * In Node.js the package loads the native addon (its per-platform optional package) when one fits:
   * "auto" takes a hardware GPU through wgpu, else the native CPU backend, else (no addon) the wasm;
   * "gpu" and "cpu" need the addon (`Florence2LoadError` saying why without it); "wasm" runs the wasm
   * build; "webgpu" is the wasm's WebGPU, which Node.js lacks. In browsers "gpu" means "webgpu" and
   * "wasm" is not a device (`Florence2InputError`). A result's `memory.engine` says which build ran. */
  device?: "auto" | "webgpu" | "cpu" | "gpu" | "wasm";
  onProgress?: (event: ProgressEvent) => void;
  /** Read and write the Cache API (`caches.open("florence2-wasm-v1")`); default true. A complete cached
   * model loads without the network. Where there is no Cache API (Node.js, insecure pages) nothing is
   * cached, without an error. */
  cache?: boolean;
  /** Ask the browser for persistent storage (`navigator.storage.persist()`) before loading, so the cached
   * model is not evicted under storage pressure; default false. The answer shows in
   * `Florence2.cacheInfo().storage.persisted`; a refusal is not an error. */
  persist?: boolean;
  /** Check cached files of a branch or tag revision (`.../resolve/main/...`) against the server before
   * using them: one `HEAD` request per file; a file whose ETag (else Last-Modified, else length) changed
   * is downloaded again. Commit revisions never change and are not checked; offline, the cached copies
   * are used. Default true. */
  revalidate?: boolean;
  /** Task markers of a fine-tuned model, on top of the 15 built-in ones and those its processor config
   * declares (`task_prompts_without_inputs`, `task_prompts_with_input`, `tasks`): a list of markers
   * (the prompt goes to the encoder as written), or `{marker: text}` where the text replaces the marker and
   * `{input}` in it takes the text after the marker. Their answers are pure text:
   * `{task, result: {[marker]: string}}` (see `CustomTaskOutput`). */
  tasks?: string[] | Record<string, string>;
  /** Git revision of a hub model id: branch, tag or commit (default `"main"`). */
  revision?: string;
  /** Hub base URL for model ids (default `"https://huggingface.co/"`): a mirror or a self-hosted copy. */
  remoteHost?: string;
  /** Path of a model's files below `remoteHost`, with `{model}` and `{revision}` (default
   * `"{model}/resolve/{revision}/"`). */
  remotePathTemplate?: string;
  signal?: AbortSignal;
  limits?: LoadLimits;
  /** Kernel tuning at load: "auto" (default) times the candidate kernels for this model's shapes on this
   * device once and caches the choice (Cache API, per adapter and package version); "off" keeps the
   * static choices; "exhaustive" ignores the cache and times every candidate at full size. The result is
   * in `model.tuningTable`. */
  tuning?: "auto" | "off" | "exhaustive";
  /** What fetches the model files instead of `globalThis.fetch` (e.g. to add headers): called as
   * `fetch(url, init)` and must resolve to a `Response` (404/410 for an absent optional file). In Node.js
   * the package reads `file:` URLs itself and hands other URLs to this function. */
  fetch?: (url: string, init: RequestInit) => Promise<Response>;
  /** After the GPU device is lost (`DeviceLostError`), load the model again on the next call (from the
   * Cache API when `cache` is on, so without a download); default true. With false, calls reject with
   * `DeviceLostError` until `reload()`. */
  autoRecover?: boolean;
}

/** Options of `Florence2.estimate`: the load's source settings, the device it would run on, and the
 * format (default "fp16"; "auto": the one `load` would choose). */
export interface EstimateOptions {
  dtype?: WeightDTypeOption;
  device?: "auto" | "webgpu" | "cpu";
  adapterLimits?: AdapterLimits;
  revision?: string;
  remoteHost?: string;
  remotePathTemplate?: string;
  fetch?: (url: string, init: RequestInit) => Promise<Response>;
  /** The requests the peak is for: new tokens (default 1024, capped by the position table) and beams
   * (default: the model's generation config). */
  maxNewTokens?: number;
  numBeams?: number;
  /** Read the small files from (and write them to) the Cache API, as `load` does; default true. */
  cache?: boolean;
  signal?: AbortSignal;
  onProgress?: (event: ProgressEvent) => void;
}

/** Options of `reload()`. */
export interface ReloadOptions {
  onProgress?: (event: ProgressEvent) => void;
  signal?: AbortSignal;
}

export interface EncodeImageOptions {
  signal?: AbortSignal;
}

export interface RunTaskOptions {
  /** Default 1024 (also bounded by the model's position table). */
  maxNewTokens?: number;
  /** Beam width, 1..64; default: the model's `generation_config.json` (3 for Florence-2); 1 is greedy. */
  numBeams?: number;
  signal?: AbortSignal;
  /** Called once per generated token with its text (empty while a multi-byte character is incomplete)
   * and its id: as each token is chosen with greedy decoding (`numBeams: 1`), at the end with beam search
   * (whose tokens are only final then). */
  onToken?: (text: string, tokenId: number) => void;
  /** Time every GPU dispatch of this call with timestamp queries: the result gets `profile` (per op,
   * shape and variant, summed per phase; `available: false` with the reason where the adapter has no
   * timestamp queries). Off by default (timing adds a little work per dispatch). */
  profile?: boolean;
  /** Tiling for `<OCR>`, `<OCR_WITH_REGION>`, `<OD>`, `<DENSE_REGION_CAPTION>`, `<REGION_PROPOSAL>`: the
   * image (not an `EncodedImage`) is covered with overlapping tiles at the model's resolution plus the
   * whole-image view, run as one batch, the answers merged in image coordinates. "auto" tiles an image
   * larger than 1.5x the model's input; "RxC" asks for a grid. Default "off" (one view; another task
   * with tiles set rejects with `Florence2PromptError`). */
  tiles?: TilesOption;
}
