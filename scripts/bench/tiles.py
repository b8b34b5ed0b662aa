#!/usr/bin/env python3
"""Tiling on pages of many demo-model scenes: `florence2 run --tiles auto` against one view (`--tiles off`).

A page is a grid of N x N scenes from scripts/training/demo_data.py (held-out seed, 192 px each: every scene at the
demo model's own input size), so its ground truth is the scenes' shapes and text lines moved into page
coordinates. Per page size it prints OD recall (a shape found when a box of its label overlaps it at
IoU >= 0.5), OCR character accuracy (`<OCR>` text against the page's lines in reading order, whitespace
collapsed; scripts/training/demo_metrics.py's edit distance) and the time per page (preprocess + vision + encoder +
decode of both tasks, the model load excluded), for one view and tiled.

    python3 scripts/bench/tiles.py [--bin target/release/florence2] [--model www/models/florence2-shapes]
        [--grids 2,3,4] [--pages 4] [--device cpu] [--markdown OUT]

Needs numpy and pillow (demo_data's scene generator) and the DejaVu fonts.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "training"))
import demo_data as dd  # noqa: E402
import demo_metrics as dm  # noqa: E402
from PIL import Image  # noqa: E402

SCENE = 192  # the demo model's input side
SEED = 2  # the held-out split's seed (never trained on)
FIRST_INDEX = 10_000  # past the indices the model card's held-out metrics use


def make_page(n, page_index):
    """An n x n page of scenes: the image and its (label, box) shapes and (text, box) lines."""
    page = Image.new("RGB", (n * SCENE, n * SCENE))
    shapes, lines = [], []
    for k in range(n * n):
        scene, img, _ = dd.make_example(SEED, FIRST_INDEX + page_index * 16 + k, SCENE)
        dx, dy = (k % n) * SCENE, (k // n) * SCENE
        page.paste(img, (dx, dy))
        move = lambda b: (b[0] + dx, b[1] + dy, b[2] + dx, b[3] + dy)  # noqa: E731
        shapes += [(s["kind"], move(s["box"])) for s in scene["shapes"]]
        lines += [(t["text"], move(t["box"])) for t in scene["texts"]]
    return page, shapes, lines


def reading_order(items):
    """Rows by vertical overlap (half a line's height), top to bottom, then left to right: the engine's rule."""
    rows = []
    for text, b in sorted(items, key=lambda it: (it[1][1], it[1][0])):
        h = max(b[3] - b[1], 1e-9)
        for row in rows:
            if (min(b[3], row[1]) - max(b[1], row[0])) / h >= 0.5:
                row[0], row[1] = min(row[0], b[1]), max(row[1], b[3])
                row[2].append((text, b))
                break
        else:
            rows.append([b[1], b[3], [(text, b)]])
    return [t for row in rows for t, _ in sorted(row[2], key=lambda it: it[1][0])]


def recall(shapes, result):
    boxes = list(zip(result.get("bboxes", []), result.get("labels", [])))
    found = sum(
        any(label == want and dm.box_iou(box, b) >= 0.5 for box, label in boxes) for want, b in shapes
    )
    return found, len(shapes)


def run(args, image, tiles):
    cmd = [args.bin, "run", "--model", args.model, "--image", str(image), "--task", "<OD>", "--task", "<OCR>",
           "--num-beams", "1", "--max-new-tokens", "256", "--device", args.device, "--dtype", "fp32",
           "--tiles", tiles, "--json"]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    ms = sum(o["timings_ms"][k] for o in out for k in ("preprocess", "vision", "encoder", "decode"))
    return out[0]["result"]["<OD>"], out[1]["result"]["<OCR>"], ms, out[0].get("tiles")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "target/release/florence2"))
    ap.add_argument("--model", default=str(ROOT / "www/models/florence2-shapes"))
    ap.add_argument("--grids", default="2,3,4")
    ap.add_argument("--pages", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--markdown")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in [int(g) for g in args.grids.split(",")]:
            acc = {m: dict(found=0, total=0, edits=0, chars=0, ms=0.0) for m in ("off", "auto")}
            chosen = None
            for p in range(args.pages):
                page, shapes, lines = make_page(n, p)
                path = Path(tmp) / f"page_{n}_{p}.png"
                page.save(path)
                truth = " ".join(reading_order(lines))
                for mode, a in acc.items():
                    od, ocr, ms, tiles = run(args, path, mode)
                    found, total = recall(shapes, od)
                    a["found"] += found
                    a["total"] += total
                    a["edits"] += dm.edit_distance(" ".join(ocr.split()), truth)
                    a["chars"] += len(truth)
                    a["ms"] += ms
                    if mode == "auto":
                        chosen = tiles
            grid = f"{chosen['rows']}x{chosen['cols']}" if chosen and "rows" in chosen else "off"
            for mode, a in acc.items():
                rows.append((f"{n}x{n} scenes ({n * SCENE} px)", "one view" if mode == "off" else f"tiled {grid}",
                             a["found"] / max(a["total"], 1), max(0.0, 1 - a["edits"] / max(a["chars"], 1)),
                             a["ms"] / args.pages, a["total"]))
    head = "| page | views | OD recall (IoU 0.5) | OCR char acc | ms / page |\n|---|---|---|---|---|\n"
    body = "".join(f"| {r[0]} | {r[1]} | {r[2]:.3f} (of {r[5]}) | {r[3]:.3f} | {r[4]:.0f} |\n" for r in rows)
    table = head + body
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table)


if __name__ == "__main__":
    main()
