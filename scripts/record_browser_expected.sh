#!/usr/bin/env bash
# Record what the native CLI (`florence2 run --json`) answers for the browser tests' cases, into
# tests/fixtures/browser/cli_expected.json. The browser tests (tests/browser_model.rs) must produce the same
# task, token ids, generated text, result and rendering from the same model dir, image (as a Blob) and prompt.
# Run by hand after a change that legitimately changes the CLI's answers; the CLI's own tests check it against
# the Python reference (tests/model/text_parity.rs). FLORENCE2_BIN overrides the binary (default: a debug build).
set -euo pipefail
cd "$(dirname "$0")/.."
export NODEVICE_SELECT=1
bin="${FLORENCE2_BIN:-}"
if [ -z "$bin" ]; then
  cargo build -q --bin florence2
  bin=target/debug/florence2
fi
out=tests/fixtures/browser/cli_expected.json
# model image prompt max_new_tokens num_beams ("-": the model's generation_config.json, 3 beams here)
# [dtype: the resident weight dtype, --dtype / the dtype load option; absent: the default, fp16]:
# scene.png with the three kinds of task on every HF-native layout, rgba.png's OCR (ends early),
# greedy decoding (what onToken streams token by token), and quantized checkpoints loaded in their format.
cases="
tiny2 scene.png <CAPTION> 24 -
tiny2 scene.png <OD> 24 -
tiny2 scene.png <OCR_WITH_REGION> 24 -
tiny2 rgba.png <OCR_WITH_REGION> 30 -
tiny2 scene.png <CAPTION> 24 1
tiny2 scene.png <OD> 24 1
tiny4 scene.png <CAPTION> 24 -
tiny4 scene.png <OD> 24 -
tiny4 scene.png <OCR_WITH_REGION> 24 -
tiny4-f16-sharded scene.png <CAPTION> 24 -
tiny4-f16-sharded scene.png <OD> 24 -
tiny4-f16-sharded scene.png <OCR_WITH_REGION> 24 -
tiny2-q8 scene.png <CAPTION> 24 - q8
tiny2-orig-q4-sharded scene.png <OD> 24 - q4
"
tmp=$(mktemp)
echo "[" > "$tmp"
first=1
while read -r model image prompt max_new beams dtype; do
  [ -n "$model" ] || continue
  extra=()
  if [ "$beams" != - ]; then extra=(--num-beams "$beams"); fi
  if [ -n "$dtype" ]; then extra+=(--dtype "$dtype"); fi
  json=$("$bin" run --model "tests/fixtures/models/$model" --image "tests/fixtures/images/$image" \
    --task "$prompt" --max-new-tokens "$max_new" "${extra[@]}" --json)
  [ $first = 1 ] || echo "," >> "$tmp"
  first=0
  python3 - "$model" "$image" "$prompt" "$max_new" "$beams" "$json" "$dtype" >> "$tmp" <<'PY'
import json, sys
model, image, prompt, max_new, beams, cli, dtype = sys.argv[1:]
cli = json.loads(cli)
cli.pop("timings_ms", None)
case = {"model": model, "image": image, "prompt": prompt, "max_new_tokens": int(max_new),
        "num_beams": None if beams == "-" else int(beams), "cli": cli}
if dtype:
    case["dtype"] = dtype
print(json.dumps(case, ensure_ascii=False))
PY
done <<< "$cases"
echo "]" >> "$tmp"
python3 -c "import json,sys; json.dump(json.load(open(sys.argv[1])), open(sys.argv[2],'w'), indent=1, ensure_ascii=False); open(sys.argv[2],'a').write('\n')" "$tmp" "$out"
rm -f "$tmp"
echo "wrote $out"
# tests/browser_model.rs's tiled case: tiny2, scene.png, <OD>, greedy, 24 new tokens, --tiles 2x2.
tiles_out=tests/fixtures/browser/tiles_expected.json
"$bin" run --model tests/fixtures/models/tiny2 --image tests/fixtures/images/scene.png --task '<OD>' \
  --max-new-tokens 24 --num-beams 1 --tiles 2x2 --json | python3 -c "
import json, sys
cli = json.load(sys.stdin)
for k in ('timings_ms', 'memory', 'adapter'):
    cli.pop(k, None)
json.dump(cli, open(sys.argv[1], 'w'), indent=1, ensure_ascii=False)
open(sys.argv[1], 'a').write('\\n')" "$tiles_out"
echo "wrote $tiles_out"
