// Model bench in Node.js: the same task as scripts/bench/browser_model.mjs through the package's Node entry
// (pkg/node.js, the CPU backend in wasm), on the same checkpoint directory, so the two can be compared
// in one run (scripts/bench/browser_model.sh runs both when BENCH_NODE=1). Prints the load time, the
// task's phase timings and the wall time of load + task.
//   node scripts/bench/node_model.mjs MODEL_DIR IMAGE
// BENCH_TASK (<CAPTION>), BENCH_MAX (20 new tokens), BENCH_BEAMS (1), BENCH_DTYPE (fp16).
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const env = (k, d) => process.env[k] ?? d;
const [modelDir, image] = process.argv.slice(2);
if (!modelDir || !image) {
  console.error("usage: node scripts/bench/node_model.mjs MODEL_DIR IMAGE");
  process.exit(2);
}
const { Florence2 } = await import(pathToFileURL(path.join(ROOT, "pkg/node.js")).href);
const t0 = performance.now();
const model = await Florence2.load(path.resolve(modelDir), { device: "cpu", dtype: env("BENCH_DTYPE", "fp16") });
const loadS = (performance.now() - t0) / 1000;
const t1 = performance.now();
const out = await model.runTask(readFileSync(image), env("BENCH_TASK", "<CAPTION>"), {
  maxNewTokens: Number(env("BENCH_MAX", "20")),
  numBeams: Number(env("BENCH_BEAMS", "1")),
});
const taskS = (performance.now() - t1) / 1000;
console.log(`node ${process.version}, device: ${out.memory?.device}`);
console.log(`tokens: ${out.tokenIds?.length ?? "?"}  text: ${JSON.stringify(out.text).slice(0, 80)}`);
for (const [k, v] of Object.entries(out.timings ?? {})) {
  console.log(`  ${k}: ${typeof v === "number" ? `${v.toFixed(1)} ms` : v}`);
}
console.log(`load: ${loadS.toFixed(1)} s, task: ${taskS.toFixed(1)} s`);
console.log(`wall (load + task): ${(loadS + taskS).toFixed(1)} s`);
model.dispose();
