#!/usr/bin/env bash
# The npm package, as a user gets it: build pkg/ (scripts/build.sh; --dev unless PKG_PROFILE=release), `npm
# pack` it, install the tarball into a scratch project with `npm install --offline`, type-check nothing but
# import it from a plain ES-module page (an import map names the installed package) served on loopback, and
# in headless Chromium's WebGPU (playwright-core from www/package.json) load the tiny2 fixture model over
# http and run `<CAPTION>` on scene.png: the answer must equal the native CLI's
# (tests/fixtures/browser/cli_expected.json); before it, `Florence2.estimate` with `dtype: "auto"` must
# estimate the resident bytes the load holds, reading only the weights file's safetensors header. Also checks the tarball's contents and that the public
# TypeScript declarations contain no `any`; drawResult (scripts/npm/draw_test.mjs) against a recording 2D context. Then, on the same tarball: `npm publish --dry-run` must be clean;
# scripts/npm/loading_test.mjs (SPA-fallback server, offline reload with the server stopped, cache API,
# corrupted cache entry, hub model ids); scripts/npm/bundler_test.mjs (the app in scripts/npm/app/ built
# with Vite (build + dev server) and webpack 5, page and worker answers equal to the CLI's);
# scripts/npm/node_test.mjs (the package imported in Node.js on the CPU backend: models from a directory
# path, a file: URL and an http URL, images as bytes and RGBA, answers equal to the native CLI's
# `--device cpu`, named errors for hostile input; `Florence2.estimate` equal to `florence2 estimate` without
# the weights sent, `dtype: "auto"` under mocked adapter limits).
# scripts/npm/docs_test.mjs (`docs`): every JS block of the package README runs as written (or is skipped
# with its reason), the hub answering with the tiny2 fixture.
# `types`: the TypeScript samples in scripts/npm/types/ (a Node.js project: ES2022 lib + @types/node, no
# DOM lib; a browser project: DOM lib, bundler resolution, the worker client) must pass `tsc --noEmit`
# with skipLibCheck off against the installed tarball (typescript and @types/node pinned in
# scripts/npm/bundlers/package-lock.json).
# `tarball`: scripts/npm/node_tarball_test.mjs: the main tarball and the native addon's linux-x64-gnu
# platform package (scripts/build/node_addon_build.sh, debug) installed offline into fresh apps: with both, the
# addon's ids equal the CLI's (every dtype, greedy and beam, memory.engine "native"; device gpu on lavapipe;
# onToken, encodeImage, a hub id from an offline Hugging Face cache); with the main tarball only, the same
# app runs on the wasm and says so, and device cpu/gpu are named errors.
# NPM_TESTS="package node tarball loading docs bundlers types" (default: all) picks parts.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$HOME/.cargo/bin:$PATH"
if [ "${PKG_PROFILE:-dev}" = release ]; then scripts/build.sh; else scripts/build.sh --dev; fi
if [ ! -d www/node_modules/playwright-core ]; then
  (cd www && npm ci --no-audit --no-fund)
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
tarball=$(cd pkg && npm pack --silent --pack-destination "$scratch" | tail -1)
echo "packed $tarball ($(du -h "$scratch/$tarball" | cut -f1))"
mkdir -p "$scratch/app"
(cd "$scratch/app" && npm init -y >/dev/null && npm install --offline --no-audit --no-fund "../$tarball" >/dev/null)
parts=" ${NPM_TESTS:-package node tarball loading docs bundlers types} "
if [[ $parts == *" package "* ]]; then
  cargo build --bin florence2
  node scripts/ci/npm_package_test.mjs "$scratch/app" "$scratch/$tarball"
  node scripts/npm/draw_test.mjs "$scratch/app"
  # A clean publish: no field npm has to correct (the login notice of a dry run is not about the package).
  dry=$(cd pkg && npm publish --dry-run 2>&1)
  if grep -Ei "warn.*(correct|invalid|normaliz)|npm error" <<<"$dry"; then
    echo "npm publish --dry-run is not clean" >&2
    exit 1
  fi
  echo "npm publish --dry-run: clean"
fi
if [[ $parts == *" node "* ]]; then
  cargo build --bin florence2
  node scripts/npm/node_test.mjs "$scratch/app"
fi
if [[ $parts == *" tarball "* ]]; then
  cargo build --bin florence2
  platform=$(scripts/build/node_addon_build.sh "$scratch/addon" | tail -1)
  node scripts/npm/node_tarball_test.mjs "$scratch/$tarball" "$platform"
fi
if [[ $parts == *" loading "* ]]; then
  node scripts/npm/loading_test.mjs "$scratch/app"
fi
if [[ $parts == *" docs "* ]]; then
  node scripts/npm/docs_test.mjs "$scratch/app"
fi
if [[ $parts == *" bundlers "* ]]; then
  if [ ! -d scripts/npm/bundlers/node_modules/vite ]; then
    (cd scripts/npm/bundlers && npm ci --no-audit --no-fund)
  fi
  node scripts/npm/bundler_test.mjs "$scratch/app"
fi
if [[ $parts == *" types "* ]]; then
  bundlers=$PWD/scripts/npm/bundlers/node_modules
  if [ ! -d "$bundlers/typescript" ] || [ ! -d "$bundlers/@types/node" ]; then
    (cd scripts/npm/bundlers && npm ci --prefer-offline --no-audit --no-fund)
  fi
  # The Node.js sample's `types: ["node"]` finds @types/node in a parent folder's node_modules/@types.
  mkdir -p "$scratch/app/node_modules/@types"
  ln -sfn "$bundlers/@types/node" "$scratch/app/node_modules/@types/node"
  echo "types: tsc $("$bundlers/.bin/tsc" --version), @types/node $(node -p "require('$bundlers/@types/node/package.json').version")"
  for t in node browser; do
    cp -r "scripts/npm/types/$t" "$scratch/app/types-$t"
    if ! (cd "$scratch/app/types-$t" && "$bundlers/.bin/tsc" -p tsconfig.json --noEmit --pretty false); then
      echo "types: the $t sample (scripts/npm/types/$t) does not type-check against the packed package" >&2
      exit 1
    fi
    echo "types: the $t sample type-checks"
  done
fi
