// A Node.js user of the package, type-checked (never run) by scripts/ci/npm_package_test.sh's `types` part:
// `tsc --noEmit` with the ES2022 lib and @types/node only (no DOM lib) and skipLibCheck off, so the
// package's own .d.ts files must compile there too. `@ts-expect-error` lines check that the types still
// reject what the package rejects.
import { readFile } from "node:fs/promises";
import {
  Florence2,
  isFlorence2Error,
  type Box,
  type CustomTaskOutput,
  type Florence2ErrorName,
  type ImageInput,
  type MemoryEstimate,
  type MemoryInfo,
  type ProgressEvent,
  type RgbaImage,
  type SupportInfo,
  type TaskOutput,
} from "florence2-wasm";

const support: SupportInfo = await Florence2.isSupported();
const device: "webgpu" | "cpu" = support.device;

const model: Florence2 = await Florence2.load("./models/Florence-2-base-ft", {
  device: "cpu",
  dtype: "q8",
  onProgress: (e: ProgressEvent) => console.log(e.status, e.file, e.progress.toFixed(0)),
  signal: AbortSignal.timeout(60_000),
});
console.log(model.adapterInfo, device);

// The memory per format before loading; "auto" picks the format that fits, and load takes "auto" too.
const est: MemoryEstimate = await Florence2.estimate("./models/Florence-2-base-ft", {
  dtype: "auto",
  adapterLimits: { class: "mobile", maxBufferSize: 256 << 20 },
});
const fits: boolean = est.fits && est.peakBytes <= est.device.budgetBytes;
console.log(est.dtype, est.weightsBytes, est.estimates?.length, fits);
const auto: Florence2 = await Florence2.load("./models/Florence-2-base-ft", { dtype: "auto" });
// @ts-expect-error "q2" is not a weight format
await Florence2.estimate("./models/Florence-2-base-ft", { dtype: "q2" });
// @ts-expect-error "tablet" is not a device class
await Florence2.estimate("./models/Florence-2-base-ft", { adapterLimits: { class: "tablet" } });
console.log(auto.memory().dtype);

// Encoded bytes: a Buffer is a Uint8Array.
const png: Buffer = await readFile("scene.png");
const bytes: Uint8Array = new Uint8Array(png);
const od: TaskOutput = await model.runTask(bytes, "<OD>", { maxNewTokens: 64, numBeams: 1 });
if (od.task === "<OD>") {
  const boxes: Box[] = od.result["<OD>"].bboxes;
  const labels: string[] = od.result["<OD>"].labels;
  for (const [i, [x1, y1, x2, y2]] of boxes.entries()) console.log(labels[i], x1, y1, x2 - x1, y2 - y1);
}

// A literal prompt narrows the output to its task; a fine-tune's own marker gives pure text; a `string`
// prompt gives the union.
const narrowed = await model.runTask(bytes, "<OD>");
const narrowedBoxes: Box[] = narrowed.result["<OD>"].bboxes;
const grounded = await model.runTask(bytes, "<CAPTION_TO_PHRASE_GROUNDING>a red car");
const phrases: string[] = grounded.result["<CAPTION_TO_PHRASE_GROUNDING>"].labels;
// @ts-expect-error an <OD> output holds no <CAPTION> result
console.log(narrowed.result["<CAPTION>"]);
// @ts-expect-error an <OCR> answer is a string, not boxes
const notBoxes: Box[] = (await model.runTask(bytes, "<OCR>")).result["<OCR>"];
const tags: CustomTaskOutput = await model.runTask(bytes, "<GENERATE_TAGS>");
const someMarker: string = process.argv[2] ?? "<OD>";
const anyOutput: TaskOutput = await model.runTask(bytes, someMarker);
console.log(narrowedBoxes.length, phrases, notBoxes, tags.text, anyOutput.task);
// Errors the package's own JavaScript raises are in the union too.
const jsErrors: Florence2ErrorName[] = ["Florence2InitError", "Florence2WorkerError"];
console.log(jsErrors);

// Decoded RGBA pixels.
const width = 64;
const height = 48;
const rgba: RgbaImage = { data: new Uint8ClampedArray(4 * width * height), width, height };
const caption = await model.runTask(rgba, "<CAPTION>", {
  onToken: (text: string, tokenId: number) => process.stdout.write(`${tokenId}:${text} `),
});
if (caption.task === "<CAPTION>") {
  const text: string = caption.result["<CAPTION>"];
  console.log(text, caption.text, caption.tokenIds.length, caption.timings.total);
}
const memory: MemoryInfo = caption.memory;
console.log(memory.device, memory.peakBytes);

// A file path, an encoded image reused by several tasks.
const path: ImageInput = "scene.jpg";
const encoded = await model.encodeImage(path);
const ocr = await model.runTask(encoded, "<OCR_WITH_REGION>");
if (ocr.task === "<OCR_WITH_REGION>") console.log(ocr.result["<OCR_WITH_REGION>"].quad_boxes.length);
encoded.dispose();
// `using` frees an encoding at the end of its block (@types/node declares `Symbol.dispose`).
{
  using again = await model.encodeImage(rgba);
  console.log((await model.runTask(again, "<REGION_PROPOSAL>")).text, again.width);
}

// Named errors.
try {
  await model.runTask(Buffer.from("not an image"), "<OD>");
} catch (e: unknown) {
  if (isFlorence2Error(e)) {
    const name: Florence2ErrorName = e.name;
    if (e.name === "Florence2ImageError") console.log("bad image:", e.message);
    else console.log(name, e.message);
  } else {
    throw e;
  }
}
model.dispose();

// @ts-expect-error: a number is no image.
void model.runTask(42, "<OD>");
// @ts-expect-error: RGBA needs its height.
void model.runTask({ data: new Uint8Array(16), width: 2 }, "<OD>");
// @ts-expect-error: no such device.
void Florence2.load("./model", { device: "tpu" });

// The engines of Node.js: the native addon on a GPU or the CPU, or the wasm; `memory.engine` says which ran.
const onGpu: Florence2 = await Florence2.load("./model", { device: "gpu" });
const onWasm: Florence2 = await Florence2.load("./model", { device: "wasm" });
const engine: "native" | "wasm" | undefined = onWasm.memory().engine;
const ran: "webgpu" | "gpu" | "cpu" = onGpu.memory().device;
const addon: boolean | undefined = support.addon;
const nativeGpu: boolean | undefined = support.gpu;
console.log(engine, ran, addon, support.addonReason, support.wasm, nativeGpu, support.gpuAdapter);
// @ts-expect-error: the engine is "native" or "wasm".
const notEngine: "gpu" | undefined = onWasm.memory().engine;
console.log(notEngine);
