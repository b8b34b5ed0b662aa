#!/usr/bin/env python3
"""`florence2 run` over many images: one batch process vs one process per image, in one run.

Makes N images (the fixture images, cycled, copied into a scratch directory), warms the kernel-tuning
cache with one run, then times
  - batch: `florence2 run --image DIR --task T --output FILE` (the model loaded and tuned once, images
    decoded on other threads while the model works);
  - loop: `florence2 run --image FILE --task T --json`, one process per image (over the first --loop
    images; its images/s is what a shell loop over the whole set gets).
Checks that both give the same answers (token ids) for the images both ran, then prints images/s of
each and their ratio. Standard library only.

Usage: python3 scripts/bench/cli_batch.py [--bin target/release/florence2]
       [--model tests/fixtures/models/tiny4] [--images 200] [--loop 200] [--task '<CAPTION>']
       [--max-new-tokens N] [--dtype fp16] [--device auto|gpu|cpu]
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["scene.png", "scene.jpg", "grey.png", "rgba.png"]


def make_images(n, into):
    paths = []
    for i in range(n):
        src = ROOT / "tests" / "fixtures" / "images" / SOURCES[i % len(SOURCES)]
        dst = into / f"{i:05d}{src.suffix}"
        shutil.copyfile(src, dst)
        paths.append(dst)
    return paths


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "florence2"))
    ap.add_argument("--model", default=str(ROOT / "tests" / "fixtures" / "models" / "tiny4"))
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--loop", type=int, default=None, help="images for the per-process loop [--images]")
    ap.add_argument("--task", default="<CAPTION>")
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--device", default="auto")
    a = ap.parse_args()
    loop_n = min(a.loop or a.images, a.images)

    common = ["--model", a.model, "--task", a.task, "--dtype", a.dtype, "--device", a.device]
    if a.max_new_tokens:
        common += ["--max-new-tokens", str(a.max_new_tokens)]
    scratch = Path(tempfile.mkdtemp(prefix="florence2-cli-batch-"))
    try:
        img_dir = scratch / "images"
        img_dir.mkdir()
        paths = make_images(a.images, img_dir)
        # Warm-up: the kernel tuner's cache, the page cache, the binary.
        subprocess.run([a.bin, "run", *common, "--image", str(paths[0])], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        out = scratch / "batch.jsonl"
        t = time.perf_counter()
        subprocess.run([a.bin, "run", *common, "--image", str(img_dir), "--output", str(out)],
                       check=True, stderr=subprocess.DEVNULL)
        batch_s = time.perf_counter() - t
        batch = {}
        for line in out.read_text().splitlines():
            v = json.loads(line)
            assert "error" not in v, v
            batch[v["image"]] = v["token_ids"]
        assert len(batch) == a.images, (len(batch), a.images)

        t = time.perf_counter()
        differ = 0
        for p in paths[:loop_n]:
            r = subprocess.run([a.bin, "run", *common, "--image", str(p), "--json"], check=True,
                               capture_output=True)
            if json.loads(r.stdout)["token_ids"] != batch[str(p)]:
                differ += 1
        loop_s = time.perf_counter() - t
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    batch_ips = a.images / batch_s
    loop_ips = loop_n / loop_s
    print(f"model {a.model} ({a.dtype}, device {a.device}), task {a.task}")
    print(f"batch: {a.images} images in {batch_s:.2f} s = {batch_ips:.2f} images/s (one process)")
    print(f"loop:  {loop_n} images in {loop_s:.2f} s = {loop_ips:.2f} images/s (one process per image)")
    print(f"batch / loop: {batch_ips / loop_ips:.2f}x")
    if differ:
        print(f"FAIL: {differ} of {loop_n} answers differ between the batch and the loop", file=sys.stderr)
        return 1
    print(f"answers identical for the {loop_n} images both ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())
