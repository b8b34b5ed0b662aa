#!/usr/bin/env python3
"""What the demo model's vision features carry: linear probes, trained on frozen features of training
scenes and scored on held-out ones, for the letter at each point of the tower's second stage (24 x 24
points, 8 px apart) and of the projected image tokens (4 x 4 points per token), and for the whole word at
each point of the projected tokens (2 x 2 per token). Chance is about 1/26 for letters and 1/32 for words.
A model that reads needs words in what the decoder attends to (the projected tokens after the text
encoder); this prints how far the tower is from that.

    python3 scripts/bench/demo_probes.py [--model www/models/florence2-shapes] [--train 400] [--test 100]

Needs torch and transformers (as scripts/training/train_demo_model.py).
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
import demo_data as dd  # noqa: E402
import train_demo_model as T  # noqa: E402

PROBE_SEED = 7  # training scenes of the probes: neither the model's training (1) nor held-out (2) seed


def features(model, st, seed, n):
    """(stage-2 cells (B, 576, C2), projected tokens (B, 36, D), letters (B, 24, 24), words (B, 12, 12))."""
    out = [[], [], [], []]
    with torch.no_grad():
        for b in range(0, n, 8):
            imgs = []
            for i in range(b, min(n, b + 8)):
                scene, img, _ = dd.make_example(seed, i, T.IMAGE, st.tok)
                imgs.append(T.pixels(img))
                out[2].append(torch.from_numpy(T.char_maps(scene, T.CHAR_GRID * st.grid)))
                out[3].append(torch.from_numpy(T.aux_maps(scene, 2 * st.grid)[0][2]))
            out[1].append(model.model.get_image_features(torch.stack(imgs)).pooler_output[:, 1:])
            out[0].append(model._stage2_out.flatten(2).transpose(1, 2))
    return [torch.cat(o) if i < 2 else torch.stack(o) for i, o in enumerate(out)]


def probe(train_x, train_y, test_x, test_y, sub, classes):
    """A linear read-out of `classes` at sub x sub points per token; held-out accuracy where labelled."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(train_x.shape[-1], sub * sub * classes)
    opt = torch.optim.Adam(lin.parameters(), 3e-3)

    def logits(x):
        b, n, _ = x.shape
        g = int(round(n ** 0.5))
        y = lin(x).reshape(b, g, g, sub, sub, classes).permute(0, 1, 3, 2, 4, 5)
        return y.reshape(b, g * sub, g * sub, classes)

    on = train_y > 0
    for _ in range(300):
        loss = torch.nn.functional.cross_entropy(logits(train_x)[on], train_y[on])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        on = test_y > 0
        return float((logits(test_x)[on].argmax(-1) == test_y[on]).float().mean()), int(on.sum())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(T.ROOT / "www" / "models" / "florence2-shapes"))
    ap.add_argument("--train", type=int, default=400, help="probe training scenes")
    ap.add_argument("--test", type=int, default=100, help="held-out scenes")
    args = ap.parse_args()
    torch.set_num_threads(1)
    st = T.Setup()
    model = T.build_model(st, True)
    T.resume_weights(model, Path(args.model))
    model.eval()
    T.add_stage_hook(model)
    tr = features(model, st, PROBE_SEED, args.train)
    te = features(model, st, T.EVAL_SEED, args.test)
    rows = [
        ("letters, tower stage 2", probe(tr[0], tr[2], te[0], te[2], 1, 27)),
        ("letters, projected tokens", probe(tr[1], tr[2], te[1], te[2], T.CHAR_GRID, 27)),
        ("words, projected tokens", probe(tr[1], tr[3], te[1], te[3], 2, len(dd.WORDS) + 1)),
    ]
    print(f"{args.model}: linear probes, {args.train} training scenes (seed {PROBE_SEED}), {args.test} held-out")
    print("| features | held-out accuracy | points |\n|---|---|---|")
    for name, (acc, n) in rows:
        print(f"| {name} | {acc:.3f} | {n} |")


if __name__ == "__main__":
    main()
