#!/usr/bin/env bash
# The npm package, as a user gets it: build pkg/ (scripts/build.sh; --dev unless PKG_PROFILE=release), `npm
# pack` it, install the tarball into a scratch project with `npm install --offline`, type-check nothing but
# import it from a plain ES-module page (an import map names the installed package) served on loopback, and
# in headless Chromium's WebGPU (playwright-core from www/package.json) load the tiny2 fixture model over
# http and run `<CAPTION>` on scene.png: the answer must equal the native CLI's
# (tests/fixtures/browser/cli_expected.json). Also checks the tarball's contents and that the public
# TypeScript declarations contain no `any`.
set -euo pipefail
cd "$(dirname "$0")/.."
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
node scripts/npm_package_test.mjs "$scratch/app" "$scratch/$tarball"
