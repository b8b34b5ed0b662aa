// Validate WGSL shaders with Tint, the WGSL compiler of Chromium's WebGPU, under WebGPU's default
// limits (256 invocations per workgroup, 8 storage buffers per stage, 16 KiB workgroup storage): parse,
// uniformity analysis, and one compute pipeline per entry point (layout 'auto'), for WG in {32, 64,
// 256} when the module declares `override WG`. Uses Dawn's null backend, so it needs no GPU, and
// catches what naga (wgpu's native compiler) accepts but the browser rejects, e.g. an f32 literal that
// rounds past f32::MAX.
//
// The sources in shaders/ carry preprocessing directives (`#if`, `#include`: src/gpu/preprocess.rs), so
// they are not WGSL as they stand. Without arguments this script first writes every preprocessed variant
// of every shader the launchers compile (`cargo run --example wgsl_variants`, one file per variant, named
// SHADER[+DEFINE...].wgsl) and checks all of them; with arguments it checks the given plain WGSL files.
//
// Usage (Dawn for node is the npm package `webgpu`; it is not a dependency of the crate):
//   npm install --prefix /tmp/dawn webgpu@0.6.2
//   NODE_PATH=/tmp/dawn/node_modules node scripts/ci/check_wgsl.mjs
// Each file is checked in its own child process, so one file's crash cannot hide another's result.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

let files = process.argv.slice(2);
if (files.length === 0) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'wgsl-variants-'));
  const root = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
  const r = spawnSync('cargo', ['run', '--quiet', '--example', 'wgsl_variants', '--', dir], {
    cwd: root,
    stdio: 'inherit',
  });
  if (r.status !== 0) {
    console.log(`writing the shader variants failed (exit ${r.status ?? r.signal})`);
    process.exit(1);
  }
  files = fs.readdirSync(dir).filter((f) => f.endsWith('.wgsl')).sort().map((f) => path.join(dir, f));
}
if (files.length !== 1) {
  let failed = 0;
  for (const f of files) {
    const r = spawnSync(process.execPath, [fileURLToPath(import.meta.url), f], { stdio: 'inherit' });
    if (r.status !== 0) {
      console.log(`${f}: FAILED (exit ${r.status ?? r.signal})`);
      failed++;
    }
  }
  console.log(failed ? `FAILED: ${failed} of ${files.length} files` : `all ${files.length} shaders valid for WebGPU (Tint)`);
  process.exit(failed ? 1 : 0);
}

const require = createRequire(import.meta.url);
const webgpuPath = require.resolve('webgpu', { paths: (process.env.NODE_PATH || '').split(':') });
const { create, globals } = await import(webgpuPath);
Object.assign(globalThis, globals);

const file = files[0];
// Keep the GPU instance referenced: dawn.node crashes if it is collected while the device lives.
const gpu = create(['backend=null']);
const adapter = await gpu.requestAdapter();
const device = await adapter.requestDevice();
const code = fs.readFileSync(file, 'utf8');
const module = device.createShaderModule({ code });
let bad = 0;
for (const m of (await module.getCompilationInfo()).messages) {
  console.log(`${file}:${m.lineNum}: ${m.type}: ${m.message}`);
  if (m.type === 'error') bad++;
}
const hasWG = /override\s+WG\b/.test(code);
const entries = [...code.matchAll(/@compute[^\n]*\n?\s*fn\s+(\w+)/g)].map((m) => m[1]);
for (const entry of entries) {
  for (const wg of hasWG ? [32, 64, 256] : [null]) {
    device.pushErrorScope('validation');
    device.createComputePipeline({
      layout: 'auto',
      compute: { module, entryPoint: entry, constants: wg === null ? {} : { WG: wg } },
    });
    const err = await device.popErrorScope();
    if (err) {
      console.log(`${file}: ${entry} (WG=${wg}): ${err.message.split('\n')[0]}`);
      bad++;
    }
  }
}
console.log(`${file}: ${entries.length} entry points, ${bad} errors`);
process.exit(bad ? 1 : 0);
