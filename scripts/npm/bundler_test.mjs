// The packed package in bundled apps: node scripts/npm/bundler_test.mjs APP_DIR, where APP_DIR is a scratch
// npm project with the tarball installed (scripts/ci/npm_package_test.sh makes it).
//
// The app in scripts/npm/app/ (package imported by name, no init(), one task on the page and one through
// `florence2-wasm/worker` + `Florence2Worker`) is built three ways, each driven in headless Chromium:
//   - Vite production build (`vite build`), served by scripts/serve.py with an SPA fallback;
//   - Vite's dev server (`vite`; it answers missing files with 200 + index.html, and the app's vite.config.js
//     has the one documented line, `optimizeDeps.exclude`);
//   - webpack 5 production build (`webpack --mode production`, no configuration file), served like Vite's.
// Both answers of each app must equal the native CLI's (tests/fixtures/browser/cli_expected.json).
// The bundlers come from scripts/npm/bundlers/ (package-lock.json; `npm ci` by scripts/setup.sh).
import { createRequire } from "node:module";
import { readFileSync, cpSync, mkdirSync, writeFileSync, existsSync, rmSync } from "node:fs";
import { spawn, spawnSync } from "node:child_process";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createServer } from "node:net";
import assert from "node:assert/strict";

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const [installed] = process.argv.slice(2);
const require = createRequire(join(root, "www", "package.json"));
const { chromium } = require("playwright-core");
const tools = join(root, "scripts/npm/bundlers/node_modules");
const vite = join(tools, "vite/bin/vite.js");
const webpack = join(tools, "webpack-cli/bin/cli.js");
for (const t of [vite, webpack]) {
  assert.ok(existsSync(t), `${t} missing: run scripts/setup.sh (npm ci in scripts/npm/bundlers)`);
}

const want = JSON.parse(readFileSync(join(root, "tests/fixtures/browser/cli_expected.json"), "utf8"))
  .find((c) => c.model === "tiny2" && c.image === "scene.png" && c.prompt === "<CAPTION>" &&
    c.num_beams === null).cli;

// One app directory: the sources, the installed package, the model and image in public/.
const app = join(installed, "..", "bundled-app");
rmSync(app, { recursive: true, force: true });
cpSync(join(root, "scripts/npm/app"), app, { recursive: true });
cpSync(join(installed, "node_modules"), join(app, "node_modules"), { recursive: true });
writeFileSync(join(app, "package.json"), JSON.stringify({ name: "bundled-app", private: true, type: "module" }));
mkdirSync(join(app, "public/model"), { recursive: true });
cpSync(join(root, "tests/fixtures/models/tiny2"), join(app, "public/model/tiny2"), { recursive: true });
cpSync(join(root, "tests/fixtures/images/scene.png"), join(app, "public/scene.png"));

function run(cmd, args, cwd) {
  const t0 = Date.now();
  const r = spawnSync(process.execPath, [cmd, ...args], { cwd, encoding: "utf8" });
  assert.equal(r.status, 0, `${args.join(" ")} failed:\n${r.stdout}\n${r.stderr}`);
  return Date.now() - t0;
}

async function freePort() {
  return new Promise((resolve) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

async function waitFor(url, child) {
  // 120 s is only a last guard: the poll ends when the server answers.
  for (let i = 0; i < 1200; i++) {
    if (child.exitCode !== null) throw new Error(`server exited:\n${child.log}`);
    try {
      const r = await fetch(url);
      if (r.ok) return;
    } catch (_) { /* not up yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${url} did not come up:\n${child.log}`);
}

async function serve(cmd, args, cwd, url) {
  const child = spawn(cmd, args, { cwd, stdio: ["ignore", "pipe", "pipe"] });
  child.log = "";
  child.stdout.on("data", (d) => { child.log += d; });
  child.stderr.on("data", (d) => { child.log += d; });
  await waitFor(url, child);
  return child;
}

async function stop(child) {
  if (child.exitCode !== null) return;
  const exited = new Promise((r) => child.once("exit", r));
  child.kill("SIGTERM");
  await exited;
}

function staticServer(dir, port) {
  return serve("python3", [join(root, "scripts/serve.py"), "--port", String(port), "--mount", `/=${dir}`,
    "--spa-fallback", "html", "--index", join(dir, "index.html")], root, `http://127.0.0.1:${port}/index.html`);
}

const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--enable-unsafe-webgpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic", "--disable-dev-shm-usage"],
});

async function check(name, url) {
  const page = await browser.newPage();
  const errors = [];
  page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
  page.on("pageerror", (e) => errors.push(String(e)));
  try {
    await page.goto(url);
    const r = await page.waitForFunction(() => window.__result, null, { timeout: 300_000 })
      .then(() => page.evaluate(() => window.__result));
    assert.ok(!r.error, `${name}: ${r.name}: ${r.error}\n${errors.join("\n")}`);
    for (const [how, out] of [["page", r.out], ["worker", r.viaWorker]]) {
      assert.equal(out.task, want.task, `${name} ${how}`);
      assert.deepEqual(out.tokenIds, want.token_ids, `${name} ${how}: token ids`);
      assert.equal(out.generatedText, want.generated_text, `${name} ${how}`);
      assert.deepEqual(out.result, want.result, `${name} ${how}`);
    }
    assert.equal(r.events[0], "initiate", `${name}: worker progress events`);
    assert.equal(r.events.at(-1), "ready", `${name}: worker progress events`);
    console.log(`ok - ${name}: page and worker answers equal the CLI's`);
  } finally {
    await page.close();
  }
}

let passed = 0;
try {
  // ---- Vite production build
  const viteMs = run(vite, ["build", "--outDir", "dist-vite", "--emptyOutDir"], app);
  assert.ok(existsSync(join(app, "dist-vite/index.html")));
  let port = await freePort();
  let server = await staticServer(join(app, "dist-vite"), port);
  try {
    await check(`vite build (${viteMs} ms)`, `http://127.0.0.1:${port}/index.html`);
    passed++;
  } finally {
    await stop(server);
  }

  // ---- Vite dev server (SPA fallback for missing files)
  port = await freePort();
  server = await serve(process.execPath, [vite, "--port", String(port), "--strictPort", "--host", "127.0.0.1"],
    app, `http://127.0.0.1:${port}/`);
  try {
    const probe = await fetch(`http://127.0.0.1:${port}/model/tiny2/model.safetensors.index.json`);
    assert.equal(probe.status, 200, "the dev server answers a missing file with 200");
    assert.match(probe.headers.get("content-type") || "", /text\/html/);
    await check("vite dev server", `http://127.0.0.1:${port}/`);
    passed++;
  } finally {
    await stop(server);
  }

  // ---- webpack 5, no configuration file
  const wpMs = run(webpack, ["--mode", "production", "--entry", "./main.js", "--output-path",
    join(app, "dist-webpack"), "--output-filename", "main.js"], app);
  cpSync(join(app, "public"), join(app, "dist-webpack"), { recursive: true });
  writeFileSync(join(app, "dist-webpack/index.html"), readFileSync(join(app, "index.html"), "utf8")
    .replace('<script type="module" src="./main.js"></script>', '<script src="./main.js"></script>'));
  port = await freePort();
  server = await staticServer(join(app, "dist-webpack"), port);
  try {
    await check(`webpack 5 (${wpMs} ms)`, `http://127.0.0.1:${port}/index.html`);
    passed++;
  } finally {
    await stop(server);
  }
  console.log(`bundler tests: ${passed} passed`);
} finally {
  await browser.close();
}
