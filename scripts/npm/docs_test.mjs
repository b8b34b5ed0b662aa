// The package README's code runs as written: node scripts/npm/docs_test.mjs APP_DIR (a scratch npm project
// with the tarball installed; scripts/ci/npm_package_test.sh makes it).
//
// Every ```js / ```html block of src/npm/README.md (the package's README) is taken verbatim and either
// run or skipped with a stated reason:
//   - page blocks (they import "florence2-wasm"): a module script in a page whose import map is the
//     README's own ```html block, in headless Chromium; the hub (https://huggingface.co/...) answers with the
//     tiny2 fixture through request interception, so the README's model ids load as written;
//   - the worker pair (a block that imports "florence2-wasm/worker" is the worker file; the block that
//     creates `new Worker(new URL("./model-worker.js", ...))` is its page): the worker file's bare specifier
//     is rewritten to the installed file's path (module workers see no import map; a bundler does this);
//   - Node.js blocks (they import "node:..."): run by node in the scratch project, with the README's model
//     directory and photo made from the fixtures.
// The names a block uses without defining them (an image file, a progress bar, an AbortController) are
// given by the prelude below; a block that needs another such name fails here until the prelude (or the
// README) says what it is. Each block must finish without a page error and produce an answer.
import { createRequire } from "node:module";
import { readFileSync, writeFileSync, mkdirSync, copyFileSync, readdirSync, existsSync } from "node:fs";
import { spawn, execFileSync } from "node:child_process";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createServer } from "node:net";
import assert from "node:assert/strict";

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const [app] = process.argv.slice(2);
const require = createRequire(join(root, "www", "package.json"));
const { chromium } = require("playwright-core");
const tiny2 = join(root, "tests/fixtures/models/tiny2");

/** The README's fenced blocks: {lang, code, line}. */
function blocks(markdown) {
  const out = [];
  const lines = markdown.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const m = /^```(\w+)\s*$/.exec(lines[i]);
    if (!m) continue;
    const start = i + 1;
    while (i + 1 < lines.length && !/^```\s*$/.test(lines[i + 1])) i++;
    out.push({ lang: m[1], code: lines.slice(start, i + 1).join("\n"), line: start });
    i++;
  }
  return out;
}

const readme = blocks(readFileSync(join(root, "src/npm/README.md"), "utf8"));
const importMap = readme.find((b) => b.lang === "html" && b.code.includes('type="importmap"'));
assert.ok(importMap, "the README shows an import map");
const mapTag = /<script type="importmap">[\s\S]*?<\/script>/.exec(importMap.code)[0];

const kinds = [];
for (const b of readme.filter((x) => x.lang === "js")) {
  let kind;
  if (/^\s*"use client"|<\w+[\s>/]/m.test(b.code) && /from "react"/.test(b.code)) kind = "skip: JSX (a React component; needs a JSX build)";
  else if (/^\/\/ vite\.config/m.test(b.code)) kind = "skip: a bundler's config (the bundlers part builds with it)";
  else if (/import "florence2-wasm\/worker"/.test(b.code)) kind = "worker-file";
  else if (/new Worker\(/.test(b.code)) kind = "worker-page";
  else if (/from "node:/.test(b.code)) kind = "node";
  else if (/from "florence2-wasm"/.test(b.code)) kind = "page";
  else kind = "skip: no package import";
  kinds.push({ ...b, kind });
}

// Names the README's blocks use as given.
const PRELUDE = `
const imageFile = await (await fetch("/images/scene.png")).blob();
const blob = imageFile;
const progress = document.body.appendChild(document.createElement("progress"));
const controller = new AbortController();
`;

async function freePort() {
  return new Promise((resolve) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

const docs = join(app, "docs");
mkdirSync(docs, { recursive: true });
const port = await freePort();
const origin = `http://127.0.0.1:${port}`;
const server = spawn("python3", [join(root, "scripts/serve.py"), "--port", String(port),
  "--mount", `/node_modules/=${join(app, "node_modules")}`, "--mount", `/docs/=${docs}`,
  "--mount", `/images/=${join(root, "tests/fixtures/images")}`], { stdio: ["ignore", "ignore", "pipe"] });
let serverLog = "";
server.stderr.on("data", (d) => { serverLog += d; });
// Polls for the server's first answer; 120 s is only a last guard (a loaded machine starts it late).
let up = false;
for (let i = 0; i < 1200 && !up; i++) {
  try {
    up = (await fetch(`${origin}/images/scene.png`)).ok;
  } catch (_) { /* not up yet */ }
  if (!up) await new Promise((r) => setTimeout(r, 100));
}
if (!up) throw new Error(`serve.py did not start in 120 s:\n${serverLog}`);

const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--enable-unsafe-webgpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic", "--disable-dev-shm-usage"],
});

/** A browser context whose https://huggingface.co/ORG/NAME/resolve/REV/FILE is tiny2's FILE (404 if absent). */
async function hubContext() {
  const ctx = await browser.newContext();
  const hits = [];
  await ctx.route("https://huggingface.co/**", async (route) => {
    const url = new URL(route.request().url());
    const m = /^\/[^/]+\/[^/]+\/resolve\/[^/]+\/(.+)$/.exec(url.pathname);
    const file = m && join(tiny2, decodeURIComponent(m[1]));
    hits.push(url.pathname);
    if (!file || !existsSync(file)) {
      await route.fulfill({ status: 404, body: "Entry not found" });
      return;
    }
    const body = readFileSync(file);
    await route.fulfill({ status: 200, body, headers: { "content-type": "application/octet-stream",
      "content-length": String(body.length), etag: `"${body.length}"`, "access-control-allow-origin": "*" } });
  });
  return { ctx, hits };
}

/** Run a page whose module script is `code`; resolves with what it left in `window.__doc`. */
async function runPage(name, code) {
  const { ctx, hits } = await hubContext();
  const page = await ctx.newPage();
  const errors = [];
  const logs = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("console", (m) => {
    if (m.type() === "error" && !/Failed to load resource/.test(m.text())) errors.push(m.text());
    logs.push(m.text());
  });
  writeFileSync(join(docs, `${name}.html`), `<!doctype html><meta charset="utf-8"><title>${name}</title>
${mapTag}
<script type="module">
${PRELUDE}
${code}
window.__doc = { out: typeof out === "undefined" ? null : out };
</script>`);
  await page.goto(`${origin}/docs/${name}.html`);
  await page.waitForFunction(() => window.__doc !== undefined || window.__failed, null, { timeout: 180_000 })
    .catch(() => {});
  const doc = await page.evaluate(() => window.__doc ?? null);
  await ctx.close();
  return { doc, errors, logs, hits };
}

let passed = 0;
try {
  for (const b of kinds) {
    const where = `README.md line ${b.line}`;
    if (b.kind.startsWith("skip")) {
      console.log(`skip ${where}: ${b.kind.slice(6)}`);
      continue;
    }
    if (b.kind === "worker-file") continue; // run with its page
    if (b.kind === "page" || b.kind === "worker-page") {
      if (b.kind === "worker-page") {
        const file = kinds.find((k) => k.kind === "worker-file");
        assert.ok(file, `${where}: the worker page has no worker file block`);
        writeFileSync(join(docs, "model-worker.js"),
          file.code.replace('"florence2-wasm/worker"', '"/node_modules/florence2-wasm/worker.js"'));
      }
      const { doc, errors, logs, hits } = await runPage(`block-${b.line}`, b.code);
      assert.deepEqual(errors, [], `${where}: page errors`);
      assert.ok(doc, `${where}: the block did not finish (logs: ${logs.slice(-5).join(" | ")})`);
      assert.ok(doc.out && typeof doc.out.task === "string" && doc.out.result, `${where}: no answer`);
      assert.ok(hits.some((h) => h.endsWith("/model.safetensors")), `${where}: the README's model id loaded`);
      console.log(`ok ${++passed} - ${where} (${b.kind}): ${doc.out.task} answered`);
    } else if (b.kind === "node") {
      const dir = join(app, "docs-node");
      const model = join(dir, "models", "Florence-2-base-ft");
      mkdirSync(model, { recursive: true });
      for (const f of readdirSync(tiny2)) copyFileSync(join(tiny2, f), join(model, f));
      copyFileSync(join(root, "tests/fixtures/images/scene.jpg"), join(dir, "photo.jpg"));
      // In the scratch project, so that "florence2-wasm" resolves to the installed tarball.
      const script = join(app, `docs-block-${b.line}.mjs`);
      writeFileSync(script, `process.chdir(${JSON.stringify(dir)});\n${b.code}\n`);
      const out = execFileSync("node", [script], { cwd: app, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
      assert.ok(out.trim().length > 0, `${where}: printed nothing`);
      console.log(`ok ${++passed} - ${where} (node): ${out.trim().split("\n")[0].slice(0, 80)}`);
    }
  }
  assert.ok(passed >= 3, `only ${passed} README blocks ran`);
  console.log(`docs tests: ${passed} README blocks ran`);
} finally {
  await browser.close();
  server.kill("SIGTERM");
  if (process.exitCode) console.log(serverLog.slice(-2000));
}
