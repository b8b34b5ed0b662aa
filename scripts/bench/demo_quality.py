#!/usr/bin/env python3
"""Task quality of our engine on the demo model's held-out split, per weight format (`--dtype`).

Runs `florence2 run` once per held-out image (every task of the image in one process, the image encoded once),
scores the post-processed answers with scripts/training/demo_metrics.py and prints one row per format, beside the
PyTorch reference's row on the same images (from the model's metrics.json, written by
scripts/training/train_demo_model.py) and each format's token-id agreement with that reference.

    python3 scripts/bench/demo_quality.py [--bin target/debug/florence2] [--model www/models/florence2-shapes]
        [--devices gpu,cpu] [--dtypes fp32,fp16,q8,q4] [--mix vision=fp16,text=q4 ...] [--images 20]
        [--max-new-tokens 96] [--json OUT] [--markdown OUT]

`--mix` (repeatable) adds a row for a format per part of the model (`--dtype vision=fp16,text=q4`: parts
vision, projector, encoder, decoder, embed; text = encoder+decoder+embed) after the `--dtypes` rows.

Needs numpy, pillow, tokenizers (not torch).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "training"))
import demo_data as dd  # noqa: E402
import demo_metrics as dm  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

COLUMNS = [
    ("od_map50", "OD mAP50"),
    ("od_map50_95", "OD mAP"),
    ("grounding_recall50", "ground R50"),
    ("ocr_char_acc", "OCR char"),
    ("ocr_region_quad_iou", "quad IoU"),
    ("caption_em", "cap EM"),
    ("caption_f1", "cap F1"),
    ("detailed_caption_f1", "dcap F1"),
    ("region_category_acc", "reg cat"),
    ("region_ocr_char_acc", "reg OCR"),
]


def engine_answerer(binary, model, device, dtype, max_new, tmp):
    """answer(img, task, text_in) for demo_metrics.collect; runs the CLI once per image (all its tasks)."""
    cache = {}

    def answer(img, task, text_in):
        key = id(img)
        if key not in cache:
            cache.clear()
            cache[key] = run_image(binary, model, device, dtype, max_new, tmp, img, current_tasks[0])
        return cache[key][task]

    current_tasks = [None]
    return answer, current_tasks


def run_image(binary, model, device, dtype, max_new, tmp, img, tasks):
    path = os.path.join(tmp, "img.png")
    img.save(path)
    cmd = [binary, "run", "--model", str(model), "--image", path, "--device", device, "--dtype", dtype,
           "--max-new-tokens",
           str(max_new), "--json"]
    for task, text_in in tasks:
        cmd += ["--task", task, "--text", text_in]
    env = dict(os.environ, NODEVICE_SELECT="1")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    res = json.loads(out.stdout)
    res = res if isinstance(res, list) else [res]
    return {r["task"]: {"token_ids": r["token_ids"], "text": r.get("generated_text"),
                        "post_processed": r["result"][r["task"]]} for r in res}


def evaluate(binary, model, device, dtype, examples, max_new):
    with tempfile.TemporaryDirectory() as tmp:
        answer, current = engine_answerer(binary, model, device, dtype, max_new, tmp)
        preds, gts, sizes, records = {}, {}, {}, []
        for ex in examples:
            i, scene, img, tg = ex
            gt = dm.ground_truth(scene, tg)
            current[0] = [(t, tg[t][0]) for t in gt]
            p, g, s, r = dm.collect([ex], answer)
            for d, src in ((preds, p), (gts, g), (sizes, s)):
                for k, v in src.items():
                    d.setdefault(k, []).extend(v)
            records += r
    return preds, gts, sizes, records


def reference_rows(path, examples):
    """The PyTorch reference's answers on the same images, from its metrics.json (None when absent)."""
    path = Path(path)
    if not path.exists():
        return None
    recs = {r["index"]: r for r in json.loads(path.read_text())["records"]}
    if any(i not in recs for i, *_ in examples):
        return None
    return recs


def close(a, b, tol=1e-3):
    """Post-processed answers equal up to float rounding of the coordinates."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(close(a[k], b[k], tol) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(close(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return abs(a - b) <= tol
    return a == b


def agreement(records, ref):
    """(share of answers with the reference's token ids, share with its post-processed result)."""
    ids = post = total = 0
    for r in records:
        for task, a in r["answers"].items():
            want = ref[r["index"]]["answers"][task]
            total += 1
            ids += int(a["token_ids"] == want["token_ids"])
            post += int(close(a["post_processed"], want["post_processed"]))
    return (ids / total, post / total) if total else (0.0, 0.0)


def table(rows):
    width = max([17] + [len(r[0]) for r in rows])
    cells = [f"{'':{width}s}"] + [f"{c[1]:>10s}" for c in COLUMNS] + ["ids = ref", "post = ref"]
    lines = ["| " + " | ".join(cells) + " |", "|" + "|".join("-" * (len(c) + 2) for c in cells) + "|"]
    for name, sc, agr, _ in rows:
        vals = [f"{name:{width}s}"] + [f"{sc[c[0]]:10.3f}" for c in COLUMNS]
        vals += [f"{'':9s}", f"{'':10s}"] if agr is None else [f"{agr[0]:9.3f}", f"{agr[1]:10.3f}"]
        lines.append("| " + " | ".join(vals) + " |")
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "target" / "debug" / "florence2"))
    ap.add_argument("--model", default=str(ROOT / "www" / "models" / "florence2-shapes"))
    ap.add_argument("--dtypes", default="fp32,fp16,q8,q4")
    ap.add_argument("--mix", action="append", default=[],
                    help="a format per part (vision=fp16,text=q4), repeatable: a row after the --dtypes rows")
    ap.add_argument("--devices", default="gpu", help="backends, comma-separated: gpu (the wgpu adapter), cpu")
    ap.add_argument("--images", type=int, default=20)
    ap.add_argument("--seed", type=int, default=2, help="held-out split seed (train_demo_model.EVAL_SEED)")
    ap.add_argument("--size", type=int, default=192, help="image size (train_demo_model.IMAGE)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--reference", help="the reference's metrics.json (default: the model's)")
    ap.add_argument("--json", help="write every answer and the table here")
    ap.add_argument("--markdown", help="write the table here (the model card includes engine_quality.md)")
    args = ap.parse_args()
    tok = Tokenizer.from_file(str(Path(args.model) / "tokenizer.json"))
    examples = dm.heldout(args.seed, args.images, args.size, tok)
    rows, out = [], {"images": args.images, "formats": {}}
    runs = []
    for device in args.devices.split(","):
        for dtype in [d for d in args.dtypes.split(",") if d] + args.mix:
            t0 = time.time()
            preds, gts, sizes, records = evaluate(args.bin, args.model, device, dtype, examples, args.max_new_tokens)
            runs.append((f"{device} {dtype}", dm.score(preds, gts, sizes), records, time.time() - t0))
            print(f"{device} {dtype}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    # read after the engine runs: a training run may still be writing it
    ref = reference_rows(args.reference or Path(args.model) / "metrics.json", examples)
    if ref is not None:
        preds, gts, sizes = {}, {}, {}
        for i, scene, img, tg in examples:
            for task, value in dm.ground_truth(scene, tg).items():
                preds.setdefault(task, []).append(ref[i]["answers"][task]["post_processed"])
                gts.setdefault(task, []).append(value)
                sizes.setdefault(task, []).append(img.size)
        rows.append(("pytorch fp32", dm.score(preds, gts, sizes), (1.0, 1.0), None))
    for name, sc, records, secs in runs:
        agr = agreement(records, ref) if ref is not None else None
        rows.append((f"ours {name}", sc, agr, secs))
        out["formats"][name] = {"scores": sc, "ids_equal_to_pytorch": agr and agr[0],
                                 "post_processed_equal_to_pytorch": agr and agr[1], "seconds": secs,
                                 "records": records}
    lines = table(rows)
    print(f"held-out images: {args.images} (seed {args.seed}), max_new_tokens {args.max_new_tokens}")
    print("\n".join(lines))
    if args.markdown:
        Path(args.markdown).write_text(
            f"{args.images} held-out scenes (seed {args.seed}), max_new_tokens {args.max_new_tokens}, "
            f"`{Path(args.bin).name} run` per image (`gpu`: the wgpu adapter, `cpu`: the CPU backend); `ids = ref` / `post = ref`: share of answers whose token ids /"
            f" post-processed results equal the PyTorch reference's.\n\n" + "\n".join(lines) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
