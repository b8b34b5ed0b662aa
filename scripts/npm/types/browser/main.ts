// A browser user of the package (bundler resolution, DOM lib), type-checked (never run) by
// scripts/ci/npm_package_test.sh's `types` part with skipLibCheck off: images of every DOM kind, streaming
// tokens, and the worker client driving model-worker.ts. `@ts-expect-error` lines check that the types
// still reject what the package rejects.
import init, {
  Florence2,
  Florence2Worker,
  WorkerEncodedImage,
  drawResult,
  regionTokens,
  isFlorence2Error,
  type BoxesResult,
  type ImageInput,
  type InitInput,
  type InitOutput,
  type SyncInitInput,
  type TaskOutput,
} from "florence2-wasm";

// With the DOM lib the declarations use the DOM's own types (they degrade only where it is absent).
type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
const exact: [
  Equal<Parameters<Florence2Worker["runTask"]>[3], Transferable[] | undefined>,
  Equal<Parameters<typeof Florence2Worker.load>[0], Worker>,
  Equal<InitInput, RequestInfo | URL | Response | BufferSource | WebAssembly.Module>,
  Equal<SyncInitInput, BufferSource | WebAssembly.Module>,
  Equal<InitOutput["memory"], WebAssembly.Memory>,
  Equal<Extract<ImageInput, object>, Blob | Uint8Array | ArrayBuffer | URL | { data: Uint8Array | Uint8ClampedArray; width: number; height: number } | ImageBitmap | ImageData | HTMLImageElement | HTMLCanvasElement | OffscreenCanvas | HTMLVideoElement | VideoFrame>,
] = [true, true, true, true, true, true];
console.log(exact, await init());

const model = await Florence2.load("microsoft/Florence-2-base-ft", {
  device: "auto",
  onProgress: (e) => console.log(e.file, e.loaded, e.total, e.cached),
  fetch: (url: string, init: RequestInit): Promise<Response> => fetch(url, { ...init, credentials: "omit" }),
});

const blob: Blob = await (await fetch("/scene.png")).blob();
const bitmap: ImageBitmap = await createImageBitmap(blob);
const img: HTMLImageElement = document.createElement("img");
const canvas: HTMLCanvasElement = document.createElement("canvas");
const offscreen = new OffscreenCanvas(8, 8);
const video: HTMLVideoElement = document.createElement("video");
const pixels: ImageData = new ImageData(8, 8);
const inputs: ImageInput[] = [blob, bitmap, img, canvas, offscreen, video, new VideoFrame(bitmap, { timestamp: 0 }), pixels];

// Streaming tokens of a caption.
let streamed = "";
const caption: TaskOutput = await model.runTask(bitmap, "<CAPTION>", {
  numBeams: 1,
  onToken: (text, tokenId) => {
    streamed += text;
    console.log(tokenId);
  },
});
if (caption.task === "<CAPTION>") console.log(caption.result["<CAPTION>"], streamed);

// The same model in a Web Worker (model-worker.ts imports "florence2-wasm/worker").
const worker = new Worker(new URL("./model-worker.ts", import.meta.url), { type: "module" });
const fitting = await Florence2Worker.estimate(worker, "./model/", { dtype: "auto" });
const remote: Florence2Worker = await Florence2Worker.load(worker, "./model/", { dtype: fitting.dtype });
// @ts-expect-error a fetch option cannot cross threads
await Florence2Worker.estimate(worker, "./model/", { fetch: (u: string) => fetch(u) });
for (const image of inputs) {
  const out = await remote.runTask(image, "<OD>", { onToken: (text) => console.log(text) });
  if (out.task === "<OD>") {
    const od: BoxesResult = out.result["<OD>"];
    console.log(od.bboxes.length, out.timings.decode);
  }
}
// The worker's output type follows the prompt too.
const workerBoxes: BoxesResult = (await remote.runTask(canvas, "<OD>")).result["<OD>"];
console.log(workerBoxes.labels);
// drawResult takes a canvas, an OffscreenCanvas or either's 2D context, and a task output.
const drawnOnCanvas: number = drawResult(canvas, await remote.runTask(canvas, "<OD>"), { imageWidth: 640 });
const offCanvas = new OffscreenCanvas(64, 64);
const offCtx = offCanvas.getContext("2d");
if (offCtx) console.log(drawnOnCanvas, drawResult(offCtx, workerBoxes, { scale: 0.1, labels: false }));
console.log(drawResult(offCanvas, workerBoxes, { colors: ["#f00"], fillAlpha: 0 }));
const regionPrompt: string = `<REGION_TO_DESCRIPTION>${regionTokens([10, 20, 300, 200], 640, 480)}`;
console.log(regionPrompt);
// @ts-expect-error: a WebGL context is not a 2D one.
drawResult(document.createElement("canvas").getContext("webgl2")!, workerBoxes);
const frame = await createImageBitmap(canvas);
const moved = await remote.runTask(frame, "<DENSE_REGION_CAPTION>", { signal: AbortSignal.timeout(5000) }, [frame]);
console.log(moved.text, remote.adapterInfo, (await remote.cacheInfo()).bytes);
// Encoded images, memory, reload, tuning table and support, all through the worker.
const support = await Florence2Worker.isSupported(worker);
console.log(support.webgpu, support.device, support.limits.maxBufferSize);
const encoded: WorkerEncodedImage = await remote.encodeImage(bitmap);
const onEncoded: BoxesResult = (await remote.runTask(encoded, "<OD>", { profile: true })).result["<OD>"];
console.log(onEncoded.bboxes, encoded.width, encoded.height, encoded.encodingId);
await encoded.dispose();
const mem = await remote.memory();
console.log(mem.weightsBytes, mem.peakBytes, remote.tuningTable.length);
await remote.reload({ onProgress: (e) => console.log(e.status) });
// @ts-expect-error: functions cannot cross to the worker.
void Florence2Worker.load(worker, "./model/", { fetch: (url: string, init: RequestInit) => fetch(url, init) });
try {
  await remote.runTask(img, "<NOT_A_TASK>");
} catch (e) {
  if (isFlorence2Error(e) && e.name === "Florence2PromptError") console.log(e.message);
}
await remote.dispose();
remote.terminate();

// @ts-expect-error: a worker client needs a Worker.
void Florence2Worker.load({}, "./model/");
// @ts-expect-error: a number is no image.
void model.runTask(42, "<OD>");
