#!/usr/bin/env python3
"""Which matrices may be 4-bit: task quality of mixed weight policies on the trained demo model.

Each policy gives every matrix weight group (vision tower, projector, text encoder, text decoder, the shared
token embedding / LM head) one resident format: f16, q8 or q4, quantized exactly as `src/quant.rs` does
(32-weight blocks along a row, one f16 scale `d = max|w| / QMAX`, `q = round(w / d)` clamped to
`[-QMAX, QMAX]`; rows that are not whole blocks stay f16) and put back as f32 values into the PyTorch
reference, which then answers the held-out split (`scripts/training/demo_metrics.py`). Dense convolutions are f16
as in every quantized format; everything else stays f32. The engine's own q4 row in
`scripts/bench/demo_quality.py` checks the simulation (the all-q4 policy here scores what the engine
scores, up to the engine's f16 KV caches).

Beside the metrics each policy prints its resident weight bytes at Florence-2-base and -large shapes,
computed from the parameter counts of each group.

    python3 scripts/bench/q4_policies.py [--model www/models/florence2-shapes] [--images 20] [--json OUT]

Needs torch, transformers, numpy, pillow, tokenizers.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "training"))
import demo_metrics as dm  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

QBLOCK = 32
QMAX = {"q8": 127.0, "q4": 7.0}
# resident bytes per weight (quants + one f16 scale per 32 weights)
BYTES = {"f16": 2.0, "q8": 1.0 + 2 / QBLOCK, "q4": 0.5 + 2 / QBLOCK}
GROUPS = ["vision", "projector", "encoder", "decoder", "shared"]

POLICIES = {
    "q8": dict(vision="q8", projector="q8", encoder="q8", decoder="q8", shared="q8"),
    "q4": dict(vision="q4", projector="q4", encoder="q4", decoder="q4", shared="q4"),
    "q4, shared q8": dict(vision="q4", projector="q4", encoder="q4", decoder="q4", shared="q8"),
    "q4, decoder q8": dict(vision="q4", projector="q4", encoder="q4", decoder="q8", shared="q4"),
    "q4, decoder+shared q8": dict(vision="q4", projector="q4", encoder="q4", decoder="q8", shared="q8"),
    "q4, encoder q8": dict(vision="q4", projector="q4", encoder="q8", decoder="q4", shared="q4"),
    "q4, vision q8": dict(vision="q8", projector="q8", encoder="q4", decoder="q4", shared="q4"),
    "q4, vision f16": dict(vision="f16", projector="f16", encoder="q4", decoder="q4", shared="q4"),
    "q4, text q8": dict(vision="q4", projector="q4", encoder="q8", decoder="q8", shared="q8"),
}

COLUMNS = [("od_map50", "OD mAP50"), ("od_map50_95", "OD mAP"), ("grounding_recall50", "ground R50"),
           ("ocr_char_acc", "OCR char"), ("ocr_region_quad_iou", "quad IoU"), ("caption_f1", "cap F1"),
           ("detailed_caption_f1", "dcap F1"), ("region_category_acc", "reg cat")]


def group_of(name):
    """The weight group of a matrix (HF-native names), None for tensors that are not matrices."""
    if name.startswith("model.vision_tower."):
        return "vision"
    if name.startswith("model.multi_modal_projector."):
        return "projector"
    if name.startswith("model.language_model.encoder."):
        return "encoder"
    if name.startswith("model.language_model.decoder."):
        return "decoder"
    if name in ("model.language_model.shared.weight", "lm_head.weight"):
        return "shared"
    return None


def is_matrix(name, shape):
    """As `is_matrix_weight` in src/weights/expected.rs."""
    return (len(shape) == 2 and name.endswith(".weight") and "embed_positions" not in name
            and "image_position_embed" not in name)


def is_dense_conv(name, shape):
    return len(shape) == 4 and shape[1] > 1 and name.endswith(".weight")


def quantize(w, fmt):
    """The values a row-blocked q8/q4 matrix stands for (f16 where rows are not whole blocks)."""
    if fmt == "f16" or w.shape[-1] % QBLOCK:
        return w.half().float()
    blocks = w.reshape(-1, QBLOCK)
    d = (blocks.abs().amax(dim=1, keepdim=True) / QMAX[fmt]).half().float()
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(blocks * inv).clamp(-QMAX[fmt], QMAX[fmt])
    return (q * d).reshape(w.shape)


def apply_policy(model, reference, policy):
    with torch.no_grad():
        for name, p in model.named_parameters():
            w = reference[name]
            g = group_of(name)
            if g is not None and is_matrix(name, w.shape):
                p.copy_(quantize(w, policy[g]))
            elif is_dense_conv(name, w.shape):
                p.copy_(w.half().float())
            else:
                p.copy_(w)


def group_params(cfg):
    """Matrix parameters per group of a model built from `cfg` (on the meta device: no memory)."""
    from transformers import Florence2ForConditionalGeneration

    with torch.device("meta"):
        m = Florence2ForConditionalGeneration(cfg)
    counts = dict.fromkeys(GROUPS, 0)
    seen = set()
    for name, p in m.named_parameters(remove_duplicate=True):
        g = group_of(name)
        if g is not None and is_matrix(name, p.shape) and id(p) not in seen:
            seen.add(id(p))
            counts[g] += p.numel()
    return counts


def shaped_config(model_dir, size):
    """Florence-2-base or -large shapes on the demo model's config (its vocabulary replaced by 51289 + the
    added tokens' count of the released models)."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_dir)
    v, t = cfg.vision_config, cfg.text_config
    if size == "base":
        v.embed_dim, v.depths, v.num_heads, v.num_groups = [128, 256, 512, 1024], [1, 1, 9, 1], [4, 8, 16, 32], [4, 8, 16, 32]
        t.d_model, t.encoder_layers, t.decoder_layers, t.encoder_ffn_dim, t.decoder_ffn_dim = 768, 6, 6, 3072, 3072
        t.encoder_attention_heads = t.decoder_attention_heads = 12
    else:
        v.embed_dim, v.depths, v.num_heads, v.num_groups = [256, 512, 1024, 2048], [1, 1, 9, 1], [8, 16, 32, 64], [8, 16, 32, 64]
        t.d_model, t.encoder_layers, t.decoder_layers, t.encoder_ffn_dim, t.decoder_ffn_dim = 1024, 12, 12, 4096, 4096
        t.encoder_attention_heads = t.decoder_attention_heads = 16
    v.projection_dim = t.d_model
    t.vocab_size = 51289
    return cfg


def policy_mb(counts, policy):
    return sum(counts[g] * BYTES[policy[g]] for g in GROUPS) / 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(ROOT / "www" / "models" / "florence2-shapes"))
    ap.add_argument("--images", type=int, default=20)
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--size", type=int, default=192)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--policies", help="comma-separated names (default: all)")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    tok = Tokenizer.from_file(str(Path(args.model) / "tokenizer.json"))
    examples = dm.heldout(args.seed, args.images, args.size, tok)
    answer = dm.torch_answerer(args.model, args.max_new_tokens)
    model = answer.model
    reference = {k: v.detach().clone() for k, v in model.state_dict().items()}
    sizes = {s: group_params(shaped_config(args.model, s)) for s in ("base", "large")}
    names = args.policies.split(",") if args.policies else list(POLICIES)
    rows, out = [], {"images": args.images, "group_params": sizes, "policies": {}}
    for name in ["fp32"] + names:
        t0 = time.time()
        if name == "fp32":
            model.load_state_dict(reference)
        else:
            apply_policy(model, reference, POLICIES[name])
        preds, gts, szs, _ = dm.collect(examples, answer)
        sc = dm.score(preds, gts, szs)
        mb = {s: (policy_mb(c, POLICIES[name]) if name != "fp32" else sum(c.values()) * 4 / 1e6)
              for s, c in sizes.items()}
        rows.append((name, sc, mb))
        out["policies"][name] = {"policy": POLICIES.get(name), "scores": sc, "matrix_mb": mb}
        print(f"{name}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    cells = [f"{'policy':22s}"] + [f"{c[1]:>10s}" for c in COLUMNS] + ["base MB", "large MB"]
    print(f"held-out images: {args.images} (seed {args.seed}); MB: matrix weights at the released shapes")
    print("| " + " | ".join(cells) + " |")
    print("|" + "|".join("-" * (len(c) + 2) for c in cells) + "|")
    for name, sc, mb in rows:
        vals = [f"{name:22s}"] + [f"{sc[c[0]]:10.3f}" for c in COLUMNS]
        vals += [f"{mb['base']:7.1f}", f"{mb['large']:8.1f}"]
        print("| " + " | ".join(vals) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
