#!/usr/bin/env bash
# Node.js at native speed, side by side in one run (issue 33's targets): the same task on the same
# checkpoint through
#   1. `florence2 run --device cpu` (release CLI),
#   2. the native Node addon (release, `device: "cpu"`),
#   3. the wasm build in Node (release pkg/, one wasm thread),
# each dtype in BENCH_DTYPES (default "fp32 fp16"), rounds alternating engine by engine (BENCH_ROUNDS,
# default 2) so a busy machine slows all alike. Prints per run: load, first (cold) task, warm task (Node
# only; the CLI's process runs one task), the phase timings, peak RSS, and the token ids (which must be
# equal across engines; the script fails when they are not); then the medians and the ratios
# addon / CLI (target <= 1.15x), Node RSS / CLI RSS (target <= 1.2x) and wasm / CLI.
# Chromium without WebGPU is measured by scripts/bench/browser_model.sh (BENCH_WEBGPU=0).
#
#   MODEL_BENCH_NO_REF=1 cargo bench --bench model   # writes target/bench-model/base-f32 (random weights)
#   TOKENIZER=/path/to/florence2/tokenizer.json scripts/bench/node_addon.sh
#
# MODEL_DIR (default target/bench-model/base-f32), TOKENIZER (linked in when the checkpoint has none),
# BENCH_IMAGE (tests/fixtures/images/scene.png), BENCH_TASK (<CAPTION>), BENCH_MAX (20), BENCH_WASM=0
# skips the wasm build (minutes per task at base shapes).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$HOME/.cargo/bin:$PATH"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
MODEL_DIR=${MODEL_DIR:-target/bench-model/base-f32}
IMAGE=${BENCH_IMAGE:-tests/fixtures/images/scene.png}
TASK=${BENCH_TASK:-<CAPTION>}
MAX=${BENCH_MAX:-20}
ROUNDS=${BENCH_ROUNDS:-2}
DTYPES=${BENCH_DTYPES:-fp32 fp16}
[ -f "$MODEL_DIR/config.json" ] || { echo "no checkpoint in $MODEL_DIR (see the header of $0)" >&2; exit 2; }
if [ ! -f "$MODEL_DIR/tokenizer.json" ]; then
  [ -n "${TOKENIZER:-}" ] || { echo "$MODEL_DIR has no tokenizer.json: set TOKENIZER" >&2; exit 2; }
  ln -sf "$(realpath "$TOKENIZER")" "$MODEL_DIR/tokenizer.json"
fi

# Release builds only: a debug build would measure the compiler's settings, not the engine.
# BENCH_NO_BUILD=1 takes the release builds already there as they are (the wasm must be a release build).
addon_out=target/node-addon-release
if [ "${BENCH_NO_BUILD:-0}" != 1 ]; then
  cargo build --release --bin florence2
  PROFILE=release scripts/build/node_addon_build.sh "$addon_out" >/dev/null
fi
export FLORENCE2_NODE_ADDON="$PWD/$addon_out/florence2-wasm-linux-x64-gnu/florence2.linux-x64-gnu.node"
if [ "${BENCH_NO_BUILD:-0}" = 1 ] && [ "$(cat pkg/.build-profile 2>/dev/null)" != release ]; then
  echo "BENCH_NO_BUILD=1 needs a release pkg/ (scripts/build.sh)" >&2
  exit 2
elif [ "${BENCH_WASM:-1}" = 1 ] && [ "${BENCH_NO_BUILD:-0}" != 1 ]; then
  profile=$(cat pkg/.build-profile 2>/dev/null || echo none)
  if [ "$profile" != release ] || [ -n "$(find src shaders scripts/build.sh Cargo.toml -newer pkg/florence2_wasm_bg.wasm -print -quit 2>/dev/null)" ]; then
    scripts/build.sh
  fi
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export BENCH_TASK="$TASK" BENCH_MAX="$MAX"

# One CLI run: a JSON line in the node script's shape (load, cold task, phases, ids, peak RSS).
cli_run() {
  local dtype=$1
  /usr/bin/time -f "%M" -o "$out/time" target/release/florence2 run --model "$MODEL_DIR" --image "$IMAGE" \
    --task "$TASK" --max-new-tokens "$MAX" --device cpu --dtype "$dtype" --json >"$out/cli.json"
  python3 - "$out/cli.json" "$(tail -1 "$out/time")" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); t = r["timings_ms"]
task = sum(v for k, v in t.items() if k != "load") / 1000
print(json.dumps({"engine": "cli", "device": r["device"], "loadS": t["load"] / 1000, "coldS": task,
                  "warmS": None, "timings": t, "tokenIds": r["token_ids"], "peakRssKiB": int(sys.argv[2])}))
PY
}

engines="cli addon"
[ "${BENCH_WASM:-1}" = 1 ] && engines+=" wasm"
: >"$out/runs.jsonl"
for dtype in $DTYPES; do
  for round in $(seq 1 "$ROUNDS"); do
    for engine in $engines; do
      if [ "$engine" = cli ]; then line=$(cli_run "$dtype")
      else line=$(BENCH_DTYPE="$dtype" node scripts/bench/node_addon.mjs "$engine" "$MODEL_DIR" "$IMAGE")
      fi
      echo "$dtype round $round: $line"
      python3 -c 'import json,sys; r=json.loads(sys.argv[1]); r["dtype"]=sys.argv[2]; print(json.dumps(r))' \
        "$line" "$dtype" >>"$out/runs.jsonl"
    done
  done
done

python3 - "$out/runs.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
bad = False
print("\n== medians (s; RSS MiB)   cold = load + first task; warm = a second task in the same process")
print(f"{'dtype':6} {'engine':6} {'device':6} {'load':>7} {'task':>7} {'warm':>7} {'peak RSS':>9}")
table = {}
for dtype in dict.fromkeys(r["dtype"] for r in runs):
    ids = {}
    for engine in dict.fromkeys(r["engine"] for r in runs):
        rs = [r for r in runs if r["dtype"] == dtype and r["engine"] == engine]
        med = lambda k: statistics.median(r[k] for r in rs) if rs[0][k] is not None else None
        row = {k: med(k) for k in ("loadS", "coldS", "warmS", "peakRssKiB")}
        table[(dtype, engine)] = row
        ids[engine] = rs[0]["tokenIds"]
        warm = f"{row['warmS']:7.2f}" if row["warmS"] is not None else f"{'-':>7}"
        print(f"{dtype:6} {engine:6} {rs[0]['device']:6} {row['loadS']:7.2f} {row['coldS']:7.2f} {warm} "
              f"{row['peakRssKiB'] / 1024:9.0f}")
    if len({json.dumps(v) for v in ids.values()}) != 1:
        print(f"!! {dtype}: the token ids differ between engines: {ids}")
        bad = True
print("\n== ratios (targets: addon task <= 1.15x the CLI's, Node peak RSS <= 1.2x the CLI's)")
for dtype in dict.fromkeys(r["dtype"] for r in runs):
    cli = table[(dtype, "cli")]
    for engine in ("addon", "wasm"):
        if (dtype, engine) not in table:
            continue
        e = table[(dtype, engine)]
        print(f"{dtype} {engine}/cli: task {e['coldS'] / cli['coldS']:.2f}x, load {e['loadS'] / cli['loadS']:.2f}x, "
              f"load + task {(e['loadS'] + e['coldS']) / (cli['loadS'] + cli['coldS']):.2f}x, "
              f"peak RSS {e['peakRssKiB'] / cli['peakRssKiB']:.2f}x")
sys.exit(1 if bad else 0)
PY
