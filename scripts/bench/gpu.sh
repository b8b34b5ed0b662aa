#!/usr/bin/env bash
# One command for a machine with a real GPU: the kernel bench (every linear variant's GFLOP/s, the static
# choice, the tuner's pick and the best, per adapter), the decode bench (ms per step, CPU cost of a
# recorded step) and the model bench (phases with the static kernel choices, then with tuning). Prints
# the tables and keeps them in target/bench-gpu/*.log.
#
#   scripts/bench/gpu.sh                 # all three
#   MODEL_DIR=/path/to/florence2 scripts/bench/gpu.sh   # also `florence2 tune` + `run --profile` on it
#   GPU_BENCH_SKIP_MODEL=1 ...           # kernels and decode only (the model bench writes ~1.5 GB)
#
# wgpu picks the high-performance adapter; WGPU_BACKEND=vulkan|metal|dx12 and WGPU_ADAPTER_NAME=<substring>
# choose another.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=target/bench-gpu
mkdir -p "$out"

run() { # name, command...
  local name=$1; shift
  echo "== $name: $*"
  "$@" 2>&1 | tee "$out/$name.log"
}

run kernels cargo bench --bench kernels
run decode cargo bench --bench decode
if [ -z "${GPU_BENCH_SKIP_MODEL:-}" ]; then
  MODEL_BENCH_NO_REF=1 MODEL_BENCH_TUNING=off run model-static cargo bench --bench model
  MODEL_BENCH_NO_REF=1 MODEL_BENCH_TUNING=auto run model-tuned cargo bench --bench model
  echo "== model phases, static vs tuned"
  grep -E "^(  )?(vision|projector|encoder|cross|decode|preprocess)" "$out/model-static.log" | sed 's/^/static  /' || true
  grep -E "^(  )?(vision|projector|encoder|cross|decode|preprocess)" "$out/model-tuned.log" | sed 's/^/tuned   /' || true
fi
if [ -n "${MODEL_DIR:-}" ]; then
  cargo build --release --bin florence2
  run tune target/release/florence2 tune --model "$MODEL_DIR" --tuning exhaustive
  img=$(ls tests/fixtures/images/*.png 2>/dev/null | head -n1)
  if [ -n "$img" ]; then
    run profile target/release/florence2 run --model "$MODEL_DIR" --image "$img" --task '<CAPTION>' \
      --num-beams 1 --max-new-tokens 20 --profile
  fi
fi
echo "logs in $out/"
