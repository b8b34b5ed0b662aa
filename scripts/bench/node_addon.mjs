// One task in Node.js through the package's Node entry (pkg/node.js): the native addon or the wasm build, for scripts/bench/node_addon.sh.
// Prints one JSON line: {engine, device, loadS, taskS, timings, tokenIds, peakRssKiB}; the task runs
// BENCH_WARM (1) times untimed after the load, then once timed (the CLI's `run` times one cold task, so
// node_addon.sh reports both the cold first task and the warm one).
//   node scripts/bench/node_addon.mjs addon|wasm MODEL_DIR IMAGE
// BENCH_TASK (<CAPTION>), BENCH_MAX (20), BENCH_BEAMS (1), BENCH_DTYPE (fp16); FLORENCE2_NODE_ADDON names
// the addon's .node file for `addon`.
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const env = (k, d) => process.env[k] ?? d;
const [engine, modelDir, image] = process.argv.slice(2);
if (!["addon", "wasm"].includes(engine) || !modelDir || !image) {
  console.error("usage: node scripts/bench/node_addon.mjs addon|wasm MODEL_DIR IMAGE");
  process.exit(2);
}
// The package's Node entry, as a user imports it: `device: "cpu"` is the native addon, "wasm" the wasm build.
const { Florence2 } = await import(pathToFileURL(path.join(ROOT, "pkg/node.js")).href);
const device = engine === "addon" ? "cpu" : "wasm";

/** Peak resident set of this process so far, KiB (VmHWM). */
function peakRssKiB() {
  const line = readFileSync("/proc/self/status", "utf8")
    .split("\n")
    .find((l) => l.startsWith("VmHWM:"));
  return line ? Number(line.split(/\s+/)[1]) : null;
}

const opts = {
  maxNewTokens: Number(env("BENCH_MAX", "20")),
  numBeams: Number(env("BENCH_BEAMS", "1")),
};
const task = env("BENCH_TASK", "<CAPTION>");
const bytes = readFileSync(image);
const t0 = performance.now();
const model = await Florence2.load(path.resolve(modelDir), { device, dtype: env("BENCH_DTYPE", "fp16") });
const loadS = (performance.now() - t0) / 1000;
let t1 = performance.now();
let out = await model.runTask(bytes, task, opts);
const coldS = (performance.now() - t1) / 1000;
for (let i = 1; i < Number(env("BENCH_WARM", "1")) + 1; i++) {
  t1 = performance.now();
  out = await model.runTask(bytes, task, opts);
}
const warmS = (performance.now() - t1) / 1000;
console.log(
  JSON.stringify({
    engine,
    device: out.memory?.device,
    engineRan: out.memory?.engine,
    loadS,
    coldS,
    warmS,
    timings: out.timings,
    tokenIds: out.tokenIds,
    peakRssKiB: peakRssKiB(),
  }),
);
model.dispose();
