#!/usr/bin/env python3
"""Train the small Florence-2-shaped demo model `www/models/florence2-shapes/` on synthetic scenes (run by hand,
never by CI or the tests: CI uses the committed checkpoint).

Needs: torch, transformers (5.24 checked), tokenizers, safetensors, pillow, numpy; Debian's fonts-dejavu-core.

    python3 scripts/train_demo_model.py [--steps N] [--out DIR]        # train, evaluate, write the card
    python3 scripts/train_demo_model.py --time-steps 5                 # measure the step time only
    python3 scripts/train_demo_model.py --eval-only                    # re-evaluate the checkpoint in --out

Data: scripts/demo_data.py (shapes, words, busy backgrounds; training scenes from seed TRAIN_SEED, each step
new ones; held-out scenes from EVAL_SEED). Tokenizer: our own byte-level BPE trained on the prompts and the
dataset's closed vocabulary (every word is one token), plus the Florence-2 added tokens in the processor's
order (as scripts/make_fixtures.py builds it). Model: transformers' Florence2ForConditionalGeneration, torch
CPU, fixed seeds, fixed thread count, fixed step count: the script reproduces the checkpoint on one machine.
Metrics: scripts/demo_metrics.py on the held-out split, generated with the model's generation config.
"""

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import demo_data as dd  # noqa: E402
import make_fixtures as mf  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from transformers import Florence2ForConditionalGeneration  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRAIN_SEED = 1
EVAL_SEED = 2
SAMPLE_SEED = 3
IMAGE = 192
CFG = dict(
    image=(IMAGE, IMAGE),
    vision=dict(
        depths=[1, 1, 2, 1],
        patch_size=[7, 3, 3, 3],
        patch_stride=[4, 2, 2, 2],
        patch_padding=[3, 1, 1, 1],
        patch_prenorm=[False, True, True, True],
        embed_dim=[32, 64, 96, 128],
        num_heads=[2, 4, 6, 8],
        num_groups=[2, 4, 6, 8],
        window_size=6,  # grids 48, 24, 12, 6: no padding; the last stage attends globally
        max_position_embeddings=8,
        max_temporal_embeddings=100,
    ),
    text=dict(d_model=128, layers=3, heads=4, ffn=512, max_pos=256),
)
TASK_WEIGHTS = {t: 1.0 for t in dd.TASKS}
TASK_WEIGHTS.update({"<OD>": 2.0, "<OCR_WITH_REGION>": 1.5, "<CAPTION_TO_PHRASE_GROUNDING>": 1.5})


def build_tokenizer():
    base = mf.BASE_VOCAB
    corpus = dd.corpus_lines(mf.TASK_PROMPTS)
    mf.CORPUS[:] = corpus
    mf.BASE_VOCAB = 2000  # an upper bound: the BPE stops when every corpus word is one token
    try:
        tok = mf.build_base_tokenizer()
    finally:
        mf.BASE_VOCAB = base
    full = mf.add_florence_tokens(tok, image_token=True)
    for wd in dd.vocabulary_words():
        for form in (wd, " " + wd):
            ids = full.encode(form, add_special_tokens=False).ids
            assert len(ids) == 1, (form, ids)
    return tok, full


class Setup:
    def __init__(self):
        self.tok_base, self.tok = build_tokenizer()
        assert self.tok.to_str() == build_tokenizer()[1].to_str(), "BPE training is not deterministic"
        self.n_full = self.tok.get_vocab_size()
        self.image_token_id = self.n_full - 1
        self.vocab = ((self.n_full + 63) // 64) * 64
        grids = mf.grid_sizes(CFG)
        self.n_img = 1 + grids[-1][0] * grids[-1][1]
        self.grid = grids[-1][0]
        self.config = mf.hf_config(CFG, self.vocab, self.image_token_id)
        self.config.vision_config.drop_path_rate = 0.0
        self.config.text_config.dropout = 0.0
        self.proc = mf.make_processor(CFG, self.tok, self.n_img)
        self.tok_str = mf.tokenizer_json(self.tok)
        self.prompt_cache = {}

    def prompt_ids(self, task, text_in):
        key = (task, text_in)
        if key not in self.prompt_cache:
            p = self.proc._construct_prompts(task + text_in)[0]
            self.prompt_cache[key] = [self.image_token_id] * self.n_img + self.tok.encode(p).ids
        return self.prompt_cache[key]

    def target_ids(self, text):
        return self.tok.encode(text).ids  # <s> ... </s>


def pixels(img):  # (3, H, W) normalised like the processor (the image already has the model's size)
    a = np.asarray(img, dtype=np.float32) * np.float32(1 / 255)
    a = (a - np.array(mf.MEAN, np.float32)) / np.array(mf.STD, np.float32)
    return torch.from_numpy(a.transpose(2, 0, 1).copy())


def batch_for_step(st, step, n_images, tasks_per_image):
    """Images, (image index, prompt ids, target ids) rows and auxiliary label maps for one training step."""
    rs = np.random.RandomState([TRAIN_SEED, step])
    imgs, rows, aux = [], [], []
    for i in range(n_images):
        scene, img, tg = dd.make_example(TRAIN_SEED, step * n_images + i, IMAGE, st.tok)
        imgs.append(pixels(img))
        aux.append(dd.label_maps(scene, 2 * st.grid))
        avail = [t for t in dd.TASKS if t in tg]
        p = np.array([TASK_WEIGHTS[t] for t in avail])
        pick = rs.choice(len(avail), min(tasks_per_image, len(avail)), replace=False, p=p / p.sum())
        for j in sorted(pick.tolist()):
            t = avail[j]
            rows.append((i, st.prompt_ids(t, tg[t][0]), st.target_ids(tg[t][1])))
    return torch.stack(imgs), rows, torch.from_numpy(np.stack(aux))


class AuxHead(torch.nn.Module):
    """Training-only probe on the projected image tokens: each of the g x g tokens predicts the shape class and
    colour at the centres of its 2 x 2 sub-cells (demo_data.label_maps). It keeps the image features informative
    while the decoder learns the language prior (without it the vision tower collapsed to image-independent
    features and the decoder ignored the image). Not part of the checkpoint."""

    def __init__(self, d, n_class, n_colour):
        super().__init__()
        self.n = (n_class, n_colour)
        self.lin = torch.nn.Linear(d, 4 * (n_class + n_colour))

    def loss(self, tokens, maps):  # tokens (B, g*g, D); maps (B, 2, 2g, 2g)
        b, n, _ = tokens.shape
        g = int(round(math.sqrt(n)))
        nc, nk = self.n
        y = self.lin(tokens).reshape(b, g, g, 2, 2, nc + nk)  # (B, gi, gj, a, b, K)
        y = y.permute(0, 1, 3, 2, 4, 5).reshape(b, 2 * g, 2 * g, nc + nk)  # (B, 2g, 2g, K)
        ce = torch.nn.functional.cross_entropy
        return ce(y[..., :nc].reshape(-1, nc), maps[:, 0].reshape(-1)) + ce(y[..., nc:].reshape(-1, nk),
                                                                            maps[:, 1].reshape(-1))


def forward_loss(model, st, pix, rows, aux=None, head=None):
    feats = model.model.get_image_features(pix).pooler_output  # (B_img, N, D)
    L = max(len(r[1]) for r in rows)
    T = max(len(r[2]) for r in rows)
    ids = torch.full((len(rows), L), 1, dtype=torch.long)
    mask = torch.zeros((len(rows), L), dtype=torch.long)
    labels = torch.full((len(rows), T), -100, dtype=torch.long)
    for k, (_, p, t) in enumerate(rows):
        ids[k, : len(p)] = torch.tensor(p)
        mask[k, : len(p)] = 1
        labels[k, : len(t)] = torch.tensor(t)
    emb = model.get_input_embeddings()(ids)  # (R, L, D)
    img_rows = feats[torch.tensor([r[0] for r in rows])]  # (R, N, D)
    emb = torch.cat([img_rows, emb[:, st.n_img:]], dim=1)
    out = model(inputs_embeds=emb, attention_mask=mask, labels=labels)
    logits = out.logits  # (R, T, V)
    lm = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
    if head is None:
        return lm
    return lm, head.loss(feats[:, 1:], aux)


def lr_at(step, total, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / max(1, total - warmup)
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * p)))


def build_model(st):
    torch.manual_seed(0)
    model = Florence2ForConditionalGeneration(st.config)
    model.tie_weights()
    return model


def save_checkpoint(model, st, out, step, extra):
    tmp = out.parent / (out.name + ".tmp")
    model.eval()
    mf.save_hf_dir(tmp, model, CFG, st.proc, st.n_img, st.tok_str)
    model.train()
    out.mkdir(parents=True, exist_ok=True)
    for f in tmp.iterdir():
        shutil.move(str(f), str(out / f.name))
        (out / f.name).chmod(0o644)
    tmp.rmdir()
    (out / "training_state.json").write_text(json.dumps(dict(step=step, **extra), indent=1) + "\n")


@torch.no_grad()
def heldout_loss(model, st, n=24):
    model.eval()
    tot, cnt = 0.0, 0
    for i in range(n):
        _, img, tg = dd.make_example(EVAL_SEED, i, IMAGE, st.tok)
        rows = [(0, st.prompt_ids(t, v[0]), st.target_ids(v[1])) for t, v in tg.items()]
        tot += float(forward_loss(model, st, pixels(img)[None], rows)) * len(rows)
        cnt += len(rows)
    model.train()
    return tot / cnt


def train(args, st):
    model = build_model(st)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params} ({n_params * 4 / 1e6:.1f} MB f32), vocab {st.n_full} (padded {st.vocab}), "
          f"image tokens {st.n_img}", flush=True)
    torch.manual_seed(1)
    head = AuxHead(CFG["text"]["d_model"], len(dd.SHAPES) + 2, len(dd.COLOURS) + 1)
    params = list(model.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    model.train()
    t0 = time.time()
    log = []
    ema = None
    last_save = time.time()
    for step in range(args.steps):
        lr = lr_at(step, args.steps, args.lr, args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        pix, rows, aux = batch_for_step(st, step, args.images, args.tasks)
        lm, al = forward_loss(model, st, pix, rows, aux, head)
        loss = lm + args.aux_weight * al
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        lv = float(lm.detach())
        ema = lv if ema is None else 0.98 * ema + 0.02 * lv
        if step % 10 == 0 or step == args.steps - 1 or args.time_steps:
            el = time.time() - t0
            print(f"step {step} loss {lv:.4f} ema {ema:.4f} aux {float(al.detach()):.4f} lr {lr:.2e} elapsed {el:.0f}s "
                  f"({el / (step + 1):.2f} s/step)", flush=True)
            log.append((step, lv, ema))
        if args.time_steps and step + 1 >= args.time_steps:
            return None
        if time.time() - last_save > args.save_every or step == args.steps - 1:
            hl = heldout_loss(model, st)
            print(f"step {step} held-out loss {hl:.4f}", flush=True)
            save_checkpoint(model, st, Path(args.out), step + 1,
                            dict(train_loss_ema=ema, heldout_loss=hl, wall_s=time.time() - t0, log=log))
            last_save = time.time()
    return dict(params=n_params, wall_s=time.time() - t0, train_loss_ema=ema, heldout_loss=hl, log=log)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "www" / "models" / "florence2-shapes"))
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--images", type=int, default=8, help="images per step")
    ap.add_argument("--tasks", type=int, default=4, help="tasks per image per step")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--aux-weight", type=float, default=0.5, help="weight of the auxiliary label-map loss")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1, help="1: with other work on the cores, 2 OpenMP threads spin and run ~8x slower")
    ap.add_argument("--save-every", type=float, default=600, help="seconds between intermediate checkpoints")
    ap.add_argument("--time-steps", type=int, default=0, help="run this many steps, print the timing, stop")
    ap.add_argument("--eval-only", action="store_true", help="evaluate the checkpoint in --out, write the card")
    ap.add_argument("--card-only", action="store_true", help="rewrite samples/ and README.md from the json files")
    ap.add_argument("--eval-images", type=int, default=100)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    st = Setup()
    out = Path(args.out)
    if args.card_only:
        write_samples(out / "samples", st)
        write_card(out, st)
        return
    if not args.eval_only:
        res = train(args, st)
        if res is None:
            return
        (out / "training_summary.json").write_text(json.dumps(
            dict(res, steps=args.steps, images_per_step=args.images, tasks_per_image=args.tasks, lr=args.lr,
                 warmup=args.warmup, threads=args.threads, aux_weight=args.aux_weight), indent=1) + "\n")
    import demo_metrics as dm  # imported late: a long run picks up the newest metric code

    metrics = dm.evaluate_dir(out, EVAL_SEED, args.eval_images, IMAGE, st.tok)
    (out / "metrics.json").write_text(json.dumps(metrics) + "\n")
    print(json.dumps(metrics["summary"], indent=1))
    write_samples(out / "samples", st)
    write_card(out, st)


def write_samples(d, st, n=6):
    """The first n held-out scenes with text, as PNG, and their targets (samples/targets.json)."""
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    meta = []
    i = 0
    while len(meta) < n:
        scene, img, tg = dd.make_example(EVAL_SEED, i, IMAGE, st.tok)
        if scene["texts"] and len(scene["shapes"]) >= 2:
            name = f"heldout_{i:03d}.png"
            img.save(d / name, optimize=True)
            meta.append(dict(file=name, index=i, seed=EVAL_SEED,
                             targets={t: {"text_input": v[0], "target": v[1]} for t, v in tg.items()}))
        i += 1
    (d / "targets.json").write_text(json.dumps(meta, indent=1) + "\n")


def fmt_shape(cfg):
    v, t = cfg["vision"], cfg["text"]
    return (f"DaViT {len(v['depths'])} stages, dims {v['embed_dim']}, depths {v['depths']}, heads {v['num_heads']}, "
            f"groups {v['num_groups']}, window {v['window_size']}; BART d_model {t['d_model']}, "
            f"{t['layers']}+{t['layers']} layers, {t['heads']} heads, ffn {t['ffn']}, max positions {t['max_pos']}")


def write_card(out, st):
    summ = json.loads((out / "training_summary.json").read_text())
    met = json.loads((out / "metrics.json").read_text())
    m = met["summary"]
    size = (out / "model.safetensors").stat().st_size
    rows = [
        ("OD mAP@0.5", m["od_map50"]), ("OD mAP@0.5:0.95", m["od_map50_95"]),
        ("grounding recall@0.5", m["grounding_recall50"]), ("OCR character accuracy", m["ocr_char_acc"]),
        ("OCR_WITH_REGION quad IoU", m["ocr_region_quad_iou"]),
        ("OCR_WITH_REGION text exact", m["ocr_region_text_exact"]),
        ("CAPTION exact match", m["caption_em"]), ("CAPTION token F1", m["caption_f1"]),
        ("DETAILED_CAPTION exact match", m["detailed_caption_em"]),
        ("DETAILED_CAPTION token F1", m["detailed_caption_f1"]),
        ("REGION_TO_CATEGORY accuracy", m["region_category_acc"]),
        ("REGION_TO_DESCRIPTION exact match", m["region_description_em"]),
        ("REGION_TO_OCR character accuracy", m["region_ocr_char_acc"]),
    ]
    table = "\n".join(f"| {k} | {v:.3f} |" for k, v in rows)
    log = "\n".join(f"| {s} | {lv:.3f} | {ema:.3f} |" for s, lv, ema in summ["log"][:: max(1, len(summ["log"]) // 12)])
    text = f"""# florence2-shapes: a small Florence-2 trained on synthetic shapes and text

A demo and quality-measurement model for this project (not a general model): Florence-2's architecture and
tasks at a tiny size, trained from scratch by `scripts/train_demo_model.py` with the reference implementation
(transformers {met.get("transformers", "5.24")} `Florence2ForConditionalGeneration`, torch CPU). Everything here
is made by that script: `python3 scripts/train_demo_model.py` reproduces it (same machine type, one thread).

## Data
`scripts/demo_data.py`, {IMAGE}x{IMAGE} RGB scenes drawn from a seed: 1-4 shapes ({", ".join(dd.SHAPES)}) in
distinct colours ({", ".join(dd.COLOURS)}), one per 3x3 cell by centre, sizes 10-40% of the side, neighbours
may overlap; 0-2 words or two-word lines ({len(dd.WORDS)} words, upper or title case) in 4 DejaVu fonts,
7.5-13% of the side high, a third rotated by up to 25 degrees; busy backgrounds (gradients, stripes, noise,
lines, specks, sometimes blur). Targets in Florence-2's output format (1000 location bins per axis) for
{", ".join(f"`{t}`" for t in dd.TASKS)}. Scenes whose target would repeat a token trigram are redrawn (the
generation default `no_repeat_ngram_size` 3 never blocks an answer).
- training: seed {TRAIN_SEED}, new scenes every step ({summ["steps"]} steps x {summ["images_per_step"]} images
  = {summ["steps"] * summ["images_per_step"]} scenes), {summ["tasks_per_image"]} tasks per image per step
  (weights {json.dumps(TASK_WEIGHTS)}).
- held-out: seed {EVAL_SEED}, the first {met["images"]} scenes (all their tasks). `samples/`: the first held-out
  scenes with text and 2+ shapes, with their targets (`samples/targets.json`).

## Model
{fmt_shape(CFG)}. {st.n_img} image tokens. Vocabulary {st.n_full} (padded to {st.vocab}): our own byte-level
BPE trained on the task prompts and the dataset's closed vocabulary (every word one token), then the Florence-2
added tokens in the processor's order and `<image>` = {st.image_token_id}. {summ["params"]} parameters,
`model.safetensors` {size / 1e6:.1f} MB (f32, HF-native layout). Generation config: Florence-2's defaults
(3 beams, no_repeat_ngram_size 3, early stopping, forced BOS/EOS).

## Training
AdamW (betas 0.9/0.98, weight decay 0.01), peak lr {summ["lr"]}, {summ["warmup"]} warm-up steps then cosine to
5%, gradient clip 1.0, no dropout, fixed seeds, {summ["threads"]} torch thread(s). Loss: token cross-entropy
plus {summ.get("aux_weight", 0)} x an auxiliary loss of a training-only linear probe (not in the checkpoint) that
predicts, from each projected image token, the shape class and colour at its 2x2 sub-cell centres (without it
the vision tower collapsed to image-independent features within ~300 steps and the decoder ignored the image).
Wall time
{summ["wall_s"] / 60:.0f} min on a 2-core machine shared with other work. Final training loss (EMA)
{summ["train_loss_ema"]:.3f}, held-out loss {summ["heldout_loss"]:.3f} (token cross-entropy, first 24 held-out
scenes, every task).

| step | loss | EMA |
|---|---|---|
{log}

## Held-out metrics (PyTorch reference, fp32, generation config above, max_new_tokens {met["max_new_tokens"]})
{met["images"]} held-out scenes; metric definitions in `scripts/demo_metrics.py` (OD boxes ranked by their order
in the answer). Our engine per weight format: `python3 scripts/bench/demo_quality.py`.

| metric | value |
|---|---|
{table}
"""
    if m["od_map50"] < 0.2:
        text += ("\n**Undertrained.** This run learned the answer formats and the vocabulary but uses the image only "
                 "weakly: boxes, words and categories are mostly wrong (near chance). A demo that shows correct "
                 "boxes and text needs a longer run (`--steps`) on an idle machine.\n")
    eng = out / "engine_quality.md"
    if eng.exists():
        text += "\n## Our engine (`scripts/bench/demo_quality.py --markdown engine_quality.md`)\n" + eng.read_text()
    (out / "README.md").write_text(text)

if __name__ == "__main__":
    main()
