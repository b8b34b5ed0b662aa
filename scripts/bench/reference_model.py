#!/usr/bin/env python3
"""PyTorch side of `cargo bench --bench model`: times the same phases on the same checkpoint directory.

Run by the Rust benchmark (or by hand): `python3 scripts/bench/reference_model.py --model DIR [--tokens 20]
[--ids 0,2264,...] [--threads 2]`. Loads the HF-native directory with transformers'
`Florence2ForConditionalGeneration` (fp32, eager attention), feeds a 768x768 pixel tensor and the prompt
ids (with one `<image>` placeholder per image feature in front, as the HF-native processor builds them),
and times (medians, after one warm-up): preprocess (the CLIP image processor on a synthetic 1024x768
image, when it loads from the directory), vision tower, projector, encoder; then `generate` with
`--tokens` new tokens (min = max so random weights cannot stop early), greedy and 3 beams, timing each
decode step as the interval between consecutive logits-processor calls. CPU seconds (all threads) of
the vision, encoder and generate phases go to `cpu_s`: on a loaded machine they show the work done. Prints a human summary on stderr
and one JSON object (seconds) as the last line of stdout.
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np
import torch
from transformers import Florence2ForConditionalGeneration, LogitsProcessor, LogitsProcessorList


class StepClock(LogitsProcessor):
    def __init__(self):
        self.stamps = []

    def __call__(self, input_ids, scores):
        self.stamps.append(time.perf_counter())
        return scores


CPU = {}


def timed(fn, reps, key=None):
    """Median wall seconds of fn (after a warm-up); the median CPU seconds (all threads) go to CPU[key]."""
    fn()  # warm-up
    times, cpus = [], []
    out = None
    for _ in range(reps):
        c = time.process_time()
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    if key:
        CPU[key] = statistics.median(cpus)
    return statistics.median(times), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--ids", default="0,2264,473,5,2274,6190,116,2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--side", type=int, default=768)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    res = {"threads": args.threads, "torch": torch.__version__}

    t = time.perf_counter()
    model = Florence2ForConditionalGeneration.from_pretrained(
        args.model, attn_implementation="eager", dtype=torch.float32
    ).eval()
    res["load_s"] = time.perf_counter() - t
    cfg = model.config
    m = model.model

    # Preprocess: the image processor from preprocessor_config.json, when it loads without a tokenizer.
    try:
        from PIL import Image
        from transformers import CLIPImageProcessor

        proc = CLIPImageProcessor.from_pretrained(args.model)
        w, h = 1024, 768
        x = np.arange(w)[None, :].repeat(h, 0)
        y = np.arange(h)[:, None].repeat(w, 1)
        rgb = np.stack([x * 255 // w, y * 255 // h, ((x ^ y) & 0xFF) * 3 % 256], -1).astype(np.uint8)
        img = Image.fromarray(rgb)
        res["preprocess_s"], _ = timed(lambda: proc(img, return_tensors="pt"), 3)
    except Exception as e:  # noqa: BLE001 - optional phase
        print(f"preprocess not timed: {e}", file=sys.stderr)

    side = args.side
    pixels = torch.randn(1, 3, side, side, generator=torch.Generator().manual_seed(0))
    prompt = [int(i) for i in args.ids.split(",")]
    with torch.inference_mode():
        res["vision_s"], feats = timed(lambda: m.vision_tower(pixels).last_hidden_state, args.reps, "vision_s")
        res["projector_s"], image = timed(lambda: m.multi_modal_projector(feats), 3)
        n_img = image.shape[1]
        ids = torch.tensor([[cfg.image_token_id] * n_img + prompt])
        emb = m.get_input_embeddings()(ids)
        mask = (ids == cfg.image_token_id).unsqueeze(-1)
        embeds = emb.masked_scatter(mask, image)
        res["encoder_s"], _ = timed(lambda: m.language_model.encoder(inputs_embeds=embeds), 3, "encoder_s")
        res["seq_len"] = int(ids.shape[1])

        for name, beams in (("greedy", 1), ("beam3", 3)):
            clock = StepClock()

            def gen():
                clock.stamps.clear()
                return model.generate(
                    input_ids=ids,
                    pixel_values=pixels,
                    max_new_tokens=args.tokens,
                    min_new_tokens=args.tokens,
                    num_beams=beams,
                    do_sample=False,
                    early_stopping=True,
                    no_repeat_ngram_size=3 if beams > 1 else 0,
                    logits_processor=LogitsProcessorList([clock]),
                )

            gen()  # warm-up
            c = time.process_time()
            t = time.perf_counter()
            out = gen()
            res[f"total_{name}_s"] = time.perf_counter() - t
            CPU[f"total_{name}_s"] = time.process_time() - c
            steps = [b - a for a, b in zip(clock.stamps, clock.stamps[1:])]
            res[f"step_{name}_s"] = statistics.median(steps)
            res[f"steps_{name}_s"] = steps
            res[f"tokens_{name}"] = int(out.shape[1])

    res["cpu_s"] = CPU
    for k, v in res.items():
        if isinstance(v, float):
            print(f"{k}: {v * 1e3:.1f} ms", file=sys.stderr)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
