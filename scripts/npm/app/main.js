// A small app as a user writes it: the package imported by name, no init(), a model loaded from the app's
// own server, one task run on the page's thread and one through the package's worker module. Built by
// scripts/npm/bundler_test.mjs with Vite (production build and dev server) and webpack 5.
import { Florence2, Florence2Worker } from "florence2-wasm";

async function main() {
  const model = await Florence2.load("./model/tiny2/", { cache: false });
  const blob = await (await fetch("./scene.png")).blob();
  const out = await model.runTask(blob, "<CAPTION>", { maxNewTokens: 24 });
  model.dispose();

  const worker = new Worker(new URL("./model-worker.js", import.meta.url), { type: "module" });
  const events = [];
  const remote = await Florence2Worker.load(worker, "./model/tiny2/", {
    cache: false,
    onProgress: (e) => events.push(e.status),
  });
  const viaWorker = await remote.runTask(blob, "<CAPTION>", { maxNewTokens: 24 });
  await remote.dispose();
  remote.terminate();
  return { out, viaWorker, events };
}

window.__result = main().catch((e) => ({ error: String((e && e.stack) || e), name: e && e.name }));
window.__result.then((r) => { document.getElementById("out").textContent = JSON.stringify(r); });
