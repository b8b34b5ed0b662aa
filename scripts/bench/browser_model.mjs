// Driven by scripts/bench/browser_model.sh: opens the demo page with its automation parameters
// (?model=&image=&task=&max=&beams=&dtype=&autorun=1), waits for the answer and prints the page's
// timings. Playwright (playwright-core from www/) drives Debian's Chromium with WebGPU; a fresh profile
// each run, so nothing comes from the Cache API (the checkpoint streams from the local server).
import { mkdtempSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const { chromium } = createRequire(path.join(ROOT, "www/package.json"))("playwright-core");
const env = (k, d) => process.env[k] ?? d;
const params = {
  model: "/model/",
  image: `/fixtures/images/${path.basename(env("BENCH_IMAGE", "scene.png"))}`,
  task: env("BENCH_TASK", "<CAPTION>"),
  max: env("BENCH_MAX", "20"),
  beams: env("BENCH_BEAMS", "1"),
  dtype: env("BENCH_DTYPE", "fp16"),
  cache: "0",
  autorun: "1",
};
const url = new URL(process.env.BENCH_BASE_URL);
for (const [k, v] of Object.entries(params)) url.searchParams.set(k, v);

const dir = mkdtempSync(path.join(tmpdir(), "florence2-bench-"));
const ctx = await chromium.launchPersistentContext(dir, {
  executablePath: env("BENCH_CHROMIUM", "/usr/bin/chromium"), headless: true,
  // BENCH_WEBGPU=0: without --enable-unsafe-webgpu Chromium offers no adapter on a machine without a
  // usable GPU (the software adapter is blocklisted), so the page's `device: "auto"` runs the CPU backend.
  args: [...(env("BENCH_WEBGPU", "1") === "0" ? [] : ["--enable-unsafe-webgpu"]),
    "--no-sandbox", "--disable-dev-shm-usage", "--no-first-run"],
});
try {
  const page = await ctx.newPage();
  page.on("console", (m) => { if (m.type() === "error") console.error(`console: ${m.text()}`); });
  const t0 = performance.now();
  await page.goto(url.href);
  await page.waitForSelector('#result-json[data-status="done"], #result-json[data-status="error"]',
    { timeout: Number(env("BENCH_TIMEOUT_MS", 3_600_000)), state: "attached" });
  const wall = (performance.now() - t0) / 1000;
  const out = await page.$eval("#result-json", (e) => ({ status: e.dataset.status, json: JSON.parse(e.textContent || "null") }));
  const adapter = await page.evaluate(async () => {
    const a = await navigator.gpu?.requestAdapter();
    return a ? `${a.info?.vendor ?? ""} ${a.info?.architecture ?? ""} ${a.info?.description ?? ""}`.trim() : "none";
  });
  console.log(`adapter: ${adapter}`);
  console.log(`page: ${url.pathname}${url.search}`);
  if (out.status !== "done") {
    console.log(`FAILED: ${JSON.stringify(out.json)}`);
    process.exitCode = 1;
  } else {
    console.log(`tokens: ${out.json.tokenIds?.length ?? "?"}  text: ${JSON.stringify(out.json.text).slice(0, 80)}`);
    // The page's timings table: the task's phases and the image encoding (the vision tower, run by
    // `encodeImage` before the task).
    const rows = await page.$$eval("#timings tbody tr", (trs) => trs.map((tr) => [...tr.cells].map((c) => c.textContent)));
    for (const [k, v] of rows) console.log(`  ${k}: ${v}`);
    console.log(`wall (navigation to answer, load + tuning + task): ${wall.toFixed(1)} s`);
  }
} finally {
  await ctx.close();
  rmSync(dir, { recursive: true, force: true });
}
