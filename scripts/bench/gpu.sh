#!/usr/bin/env bash
# One command for a machine with a real GPU: the kernel bench (every linear variant's GFLOP/s, the static
# choice, the tuner's pick and the best, per adapter), the decode bench (ms per step, CPU cost of a
# recorded step) and the model bench (phases with the static kernel choices, then with tuning). Prints
# the tables and keeps them in target/bench-gpu/*.log.
#
#   scripts/bench/gpu.sh                 # all three
#   MODEL_DIR=/path/to/florence2 scripts/bench/gpu.sh   # also `florence2 tune` + `run --profile` on it
#   GPU_BENCH_SKIP_MODEL=1 ...           # kernels and decode only (the model bench writes ~1.5 GB)
#   GPU_BENCH_PROFILE=dev ...            # cargo profile of the benches (default: cargo bench's release
#                                        # profile; dev skips the long release build of the dependencies)
# The benches' own knobs pass through, e.g. a quick check on a CPU adapter:
#   GPU_BENCH_PROFILE=dev KERNELS_BENCH_ONLY="decode proj" DECODE_BENCH_STEPS=2 MODEL_BENCH_TOKENS=2 \
#   MODEL_BENCH_RESIDENT=fp32 MODEL_BENCH_COLD=0 MODEL_BENCH_BREAKDOWN=0 MODEL_BENCH_REUSE=0 scripts/bench/gpu.sh
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

profile=()
if [ -n "${GPU_BENCH_PROFILE:-}" ]; then profile=(--profile "$GPU_BENCH_PROFILE"); fi

run kernels cargo bench "${profile[@]}" --bench kernels
run decode cargo bench "${profile[@]}" --bench decode
if [ -z "${GPU_BENCH_SKIP_MODEL:-}" ]; then
  # Tuning without a time budget, so every class is tuned (a load's auto stops after ~3 s and continues
  # on the next load).
  MODEL_BENCH_NO_REF=1 MODEL_BENCH_TUNING=off run model-static cargo bench "${profile[@]}" --bench model
  # ... and MODEL_BENCH_COMPARE rounds of static vs tuned end to end, alternating in one process.
  MODEL_BENCH_NO_REF=1 MODEL_BENCH_TUNING=auto MODEL_BENCH_TUNING_BUDGET_MS="${MODEL_BENCH_TUNING_BUDGET_MS:-none}" \
    MODEL_BENCH_COMPARE="${MODEL_BENCH_COMPARE:-3}" run model-tuned cargo bench "${profile[@]}" --bench model
  echo "== model phases (warm, ms), static vs tuned, in the order the runs printed them"
  phases='^(  )?(preprocess|vision|projector|encoder|cross|decode step \()'
  paste -d'\t' <(grep -E "$phases" "$out/model-static.log" || true) <(grep -E "$phases" "$out/model-tuned.log" || true) |
    awk -F'\t' '{ name = substr($1, 1, 22); s = substr($1, 23, 11) + 0; t = substr($2, 23, 11) + 0;
                   printf "%-22s static %10.1f  tuned %10.1f  tuned/static %s\n", name, s, t,
                          (s > 0 ? sprintf("%.3f", t / s) : "-") }'
  grep -E "alternating rounds" "$out/model-tuned.log" || true
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
