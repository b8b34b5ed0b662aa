// Model bench in Node.js: the same task as scripts/bench/browser_model.mjs through the package's Node entry
// (pkg/node.js, the CPU backend in wasm), on the same checkpoint directory, so the two can be compared
// in one run (scripts/bench/browser_model.sh runs both when BENCH_NODE=1). Prints the wasm build that
// ran, the load time, the task's phase timings and the wall time of load + task.
//   node scripts/bench/node_model.mjs MODEL_DIR IMAGE
// BENCH_WASM=relaxed forces the relaxed-SIMD build (the package picks it where its probe passes: Node 22;
// Node 20 needs --experimental-wasm-relaxed-simd, a draft whose integer dot differs: fp16/fp32 only).
// BENCH_TASK (<CAPTION>), BENCH_MAX (20 new tokens), BENCH_BEAMS (1), BENCH_DTYPE (fp16), BENCH_DEVICE
// (wasm: the wasm's CPU backend; cpu: the native addon), BENCH_PKG (pkg: the package directory),
// BENCH_PROFILE=1: a second task with `profile: true`, its ops' wall times summed per phase and op.
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
const pkg = await import(pathToFileURL(path.resolve(ROOT, env("BENCH_PKG", "pkg"), "node.js")).href);
const { Florence2 } = pkg;
if (env("BENCH_WASM", "") === "relaxed") {
  await pkg.init({ module_or_path: readFileSync(path.resolve(ROOT, env("BENCH_PKG", "pkg"), "florence2_wasm_relaxed_bg.wasm")) });
}
const t0 = performance.now();
const model = await Florence2.load(path.resolve(modelDir), {
  device: env("BENCH_DEVICE", "wasm"),
  dtype: env("BENCH_DTYPE", "fp16"),
});
const loadS = (performance.now() - t0) / 1000;
const t1 = performance.now();
const out = await model.runTask(readFileSync(image), env("BENCH_TASK", "<CAPTION>"), {
  maxNewTokens: Number(env("BENCH_MAX", "20")),
  numBeams: Number(env("BENCH_BEAMS", "1")),
});
const taskS = (performance.now() - t1) / 1000;
const build = env("BENCH_WASM", "") === "relaxed" ? "relaxed-simd (forced)"
  : typeof pkg.wasmBuild === "function" ? pkg.wasmBuild() : "simd128 (no wasmBuild)";
console.log(`node ${process.version}, device: ${out.memory?.device}, engine: ${out.memory?.engine}, wasm: ${build}`);
console.log(`tokens: ${out.tokenIds?.length ?? "?"}  text: ${JSON.stringify(out.text).slice(0, 80)}`);
for (const [k, v] of Object.entries(out.timings ?? {})) {
  console.log(`  ${k}: ${typeof v === "number" ? `${v.toFixed(1)} ms` : v}`);
}
console.log(`load: ${loadS.toFixed(1)} s, task: ${taskS.toFixed(1)} s`);
console.log(`wall (load + task): ${(loadS + taskS).toFixed(1)} s`);
if (env("BENCH_PROFILE", "0") === "1") {
  const { profile } = await model.runTask(readFileSync(image), env("BENCH_TASK", "<CAPTION>"), {
    maxNewTokens: Number(env("BENCH_MAX", "20")),
    numBeams: Number(env("BENCH_BEAMS", "1")),
    profile: true,
  });
  if (!profile?.available) throw new Error(`no profile: ${profile?.reason}`);
  for (const ph of profile.phases) {
    console.log(`phase ${ph.phase}: ${ph.ms.toFixed(1)} ms over ${ph.dispatches} ops`);
    const byOp = new Map();
    for (const e of profile.entries.filter((x) => x.phase === ph.phase)) {
      const [n, ms] = byOp.get(e.op) ?? [0, 0];
      byOp.set(e.op, [n + 1, ms + e.ms]);
    }
    for (const [op, [n, ms]] of [...byOp].sort((a, b) => b[1][1] - a[1][1]).slice(0, 10)) {
      console.log(`  ${ms.toFixed(1).padStart(9)} ms ${(100 * ms / ph.ms).toFixed(1).padStart(5)}%  ${String(n).padStart(5)}x  ${op}`);
    }
  }
}
model.dispose();
