"""Task-quality metrics for the synthetic demo model (scripts/training/demo_data.py scenes), used by
scripts/training/train_demo_model.py (PyTorch reference) and scripts/bench/demo_quality.py (our engine).

Inputs are post-processed results as Florence-2's post-processor gives them with float coordinates
(`{"bboxes", "labels"}`, `{"quad_boxes", "labels"}` or a string), per task, per held-out image.

- OD: COCO-style AP per class (101-point interpolation), mean over the classes with ground truth, at IoU 0.5 and
  averaged over IoU 0.5:0.05:0.95. Florence-2 gives no scores: a box's rank in the answer is its score.
- grounding recall@0.5: share of ground-truth (phrase, box) pairs matched one-to-one by a predicted box with the
  same phrase and IoU >= 0.5.
- OCR character accuracy: 1 - (sum of edit distances) / (sum of ground-truth lengths), floored at 0.
- OCR_WITH_REGION: mean IoU of each ground-truth quad with its one-to-one (greedy by IoU) predicted quad
  (0 when none), and the share of matched quads whose text is exact.
- captions: exact match (after lower-casing and dropping punctuation) and bag-of-words token F1.
- region tasks: REGION_TO_CATEGORY and REGION_TO_DESCRIPTION exact match, REGION_TO_OCR character accuracy.
"""

import re

import numpy as np
from PIL import Image, ImageDraw

IOU_THRESHOLDS = [0.5 + 0.05 * i for i in range(10)]


# ----------------------------------------------------------------------------------------------------
# Ground truth
# ----------------------------------------------------------------------------------------------------


def ground_truth(scene, tg):
    """Per-task ground truth in pixel coordinates for one scene (targets from demo_data.targets)."""
    gt = {
        "<OD>": [(s["kind"], list(s["box"])) for s in scene["shapes"]],
        "<CAPTION>": tg["<CAPTION>"][1],
        "<DETAILED_CAPTION>": tg["<DETAILED_CAPTION>"][1],
        "<CAPTION_TO_PHRASE_GROUNDING>": [(p, list(b)) for p, b in tg["<CAPTION_TO_PHRASE_GROUNDING>"][2]],
        "<REGION_TO_CATEGORY>": tg["<REGION_TO_CATEGORY>"][1],
        "<REGION_TO_DESCRIPTION>": tg["<REGION_TO_DESCRIPTION>"][1],
    }
    if scene["texts"]:
        gt["<OCR>"] = tg["<OCR>"][1]
        gt["<OCR_WITH_REGION>"] = [(t["text"], list(t["quad"])) for t in scene["texts"]]
        gt["<REGION_TO_OCR>"] = tg["<REGION_TO_OCR>"][1]
    return gt


# ----------------------------------------------------------------------------------------------------
# Geometry
# ----------------------------------------------------------------------------------------------------


def box_iou(a, b):
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    ua = max(0.0, a[2] - a[0]) * max(0.0, a[3] - a[1]) + max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1]) - inter
    return inter / ua if ua > 0 else 0.0


def quad_iou(a, b, size, scale=4):
    """IoU of two quads (x1, y1, ..., x4, y4) by rasterising them at `scale` times the image size."""
    w, h = size
    masks = []
    for q in (a, b):
        m = Image.new("L", (w * scale, h * scale), 0)
        pts = [(q[i] * scale, q[i + 1] * scale) for i in range(0, 8, 2)]
        ImageDraw.Draw(m).polygon(pts, fill=1)
        masks.append(np.asarray(m, dtype=bool))
    inter = np.logical_and(*masks).sum()
    union = np.logical_or(*masks).sum()
    return float(inter / union) if union else 0.0


def greedy_match(ious, thr=0.0):
    """One-to-one matches (gt index, pred index, iou), best IoU first; ious is (n_gt, n_pred)."""
    pairs = sorted(((ious[g][p], g, p) for g in range(len(ious)) for p in range(len(ious[g]))), reverse=True)
    used_g, used_p, out = set(), set(), []
    for v, g, p in pairs:
        if v < thr or g in used_g or p in used_p:
            continue
        used_g.add(g)
        used_p.add(p)
        out.append((g, p, v))
    return out


# ----------------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------------


def average_precision(recalls, precisions):
    """COCO 101-point interpolated AP."""
    if not recalls:
        return 0.0
    r = np.array(recalls)
    p = np.array(precisions)
    for i in range(len(p) - 2, -1, -1):
        p[i] = max(p[i], p[i + 1])
    ap = 0.0
    for t in np.linspace(0, 1, 101):
        idx = np.searchsorted(r, t, side="left")
        ap += p[idx] if idx < len(p) else 0.0
    return ap / 101


def od_map(preds, gts):
    """preds: per image {"bboxes", "labels"}; gts: per image [(label, box)]. Returns (mAP@0.5, mAP@0.5:0.95)."""
    classes = sorted({lab for g in gts for lab, _ in g})
    res = {}
    for thr in IOU_THRESHOLDS:
        aps = []
        for c in classes:
            n_gt = sum(1 for g in gts for lab, _ in g if lab == c)
            dets = []  # (score, image, box)
            for i, p in enumerate(preds):
                labels, boxes = p.get("labels", []), p.get("bboxes", [])
                for k, (lab, box) in enumerate(zip(labels, boxes)):
                    if lab.strip() == c:
                        dets.append((1.0 - k / max(1, len(labels)), i, box))
            dets.sort(key=lambda d: -d[0])
            used = set()
            tp = []
            for _, i, box in dets:
                best, bj = 0.0, -1
                for j, (lab, gb) in enumerate(gts[i]):
                    if lab != c or (i, j) in used:
                        continue
                    v = box_iou(box, gb)
                    if v > best:
                        best, bj = v, j
                if bj >= 0 and best >= thr:
                    used.add((i, bj))
                    tp.append(1)
                else:
                    tp.append(0)
            ctp = np.cumsum(tp) if tp else np.array([])
            recalls = (ctp / n_gt).tolist() if n_gt else []
            precisions = (ctp / np.arange(1, len(tp) + 1)).tolist() if tp else []
            aps.append(average_precision(recalls, precisions))
        res[thr] = float(np.mean(aps)) if aps else 0.0
    return res[0.5], float(np.mean(list(res.values())))


def grounding_recall(preds, gts, thr=0.5):
    hit = total = 0
    for p, g in zip(preds, gts):
        total += len(g)
        labels, boxes = p.get("labels", []), p.get("bboxes", [])
        used = set()
        for phrase, gb in g:
            for k, (lab, box) in enumerate(zip(labels, boxes)):
                if k in used or lab.strip().lower() != phrase.lower():
                    continue
                if box_iou(box, gb) >= thr:
                    used.add(k)
                    hit += 1
                    break
    return hit / total if total else 0.0


def edit_distance(a, b):
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def char_accuracy(preds, gts):
    edits = sum(edit_distance(p.strip(), g) for p, g in zip(preds, gts))
    chars = sum(len(g) for g in gts)
    return max(0.0, 1.0 - edits / chars) if chars else 0.0


def ocr_region(preds, gts, sizes):
    ious, exact, n = [], 0, 0
    for p, g, size in zip(preds, gts, sizes):
        quads, labels = p.get("quad_boxes", []), p.get("labels", [])
        m = [[quad_iou(gq, pq, size) for pq in quads] for _, gq in g]
        matches = greedy_match(m, 1e-9)
        got = {gi: (pi, v) for gi, pi, v in matches}
        for gi, (text, _) in enumerate(g):
            n += 1
            if gi in got:
                pi, v = got[gi]
                ious.append(v)
                exact += int(labels[pi].strip() == text) if pi < len(labels) else 0
            else:
                ious.append(0.0)
    return (float(np.mean(ious)) if ious else 0.0), (exact / n if n else 0.0)


def words(s):
    return re.sub(r"[^\w\s]", " ", s.lower()).split()


def token_f1(p, g):
    pw, gw = words(p), words(g)
    if not pw or not gw:
        return float(pw == gw)
    common = 0
    rest = list(gw)
    for w in pw:
        if w in rest:
            rest.remove(w)
            common += 1
    if common == 0:
        return 0.0
    prec, rec = common / len(pw), common / len(gw)
    return 2 * prec * rec / (prec + rec)


def caption_scores(preds, gts):
    em = np.mean([words(p) == words(g) for p, g in zip(preds, gts)]) if gts else 0.0
    f1 = np.mean([token_f1(p, g) for p, g in zip(preds, gts)]) if gts else 0.0
    return float(em), float(f1)


def score(preds, gts, sizes):
    """preds[task] / gts[task]: lists over the same images (images without text skip the text tasks).
    Returns {metric name: value}."""
    out = {}
    t = "<OD>"
    out["od_map50"], out["od_map50_95"] = od_map(preds[t], gts[t])
    out["grounding_recall50"] = grounding_recall(preds["<CAPTION_TO_PHRASE_GROUNDING>"],
                                                 gts["<CAPTION_TO_PHRASE_GROUNDING>"])
    out["ocr_char_acc"] = char_accuracy(preds["<OCR>"], gts["<OCR>"])
    out["ocr_region_quad_iou"], out["ocr_region_text_exact"] = ocr_region(
        preds["<OCR_WITH_REGION>"], gts["<OCR_WITH_REGION>"], sizes["<OCR_WITH_REGION>"])
    out["caption_em"], out["caption_f1"] = caption_scores(preds["<CAPTION>"], gts["<CAPTION>"])
    out["detailed_caption_em"], out["detailed_caption_f1"] = caption_scores(preds["<DETAILED_CAPTION>"],
                                                                            gts["<DETAILED_CAPTION>"])
    out["region_category_acc"] = float(np.mean([words(p) == words(g) for p, g in
                                                zip(preds["<REGION_TO_CATEGORY>"], gts["<REGION_TO_CATEGORY>"])]))
    out["region_description_em"] = float(np.mean([words(p) == words(g) for p, g in
                                                  zip(preds["<REGION_TO_DESCRIPTION>"],
                                                      gts["<REGION_TO_DESCRIPTION>"])]))
    out["region_ocr_char_acc"] = char_accuracy(preds["<REGION_TO_OCR>"], gts["<REGION_TO_OCR>"])
    return out


# ----------------------------------------------------------------------------------------------------
# The held-out split, evaluated with the PyTorch reference
# ----------------------------------------------------------------------------------------------------


def heldout(seed, n, size, tok):
    """[(index, scene, image, targets)] of the held-out split."""
    import demo_data as dd

    return [(i,) + dd.make_example(seed, i, size, tok) for i in range(n)]


def collect(examples, answer):
    """Run answer(image, task, text_input) -> post-processed value over the split; returns preds, gts, sizes,
    records (per image and task: the raw answers)."""
    preds, gts, sizes, records = {}, {}, {}, []
    for i, scene, img, tg in examples:
        gt = ground_truth(scene, tg)
        rec = {"index": i, "answers": {}}
        for task, value in gt.items():
            text_in = tg[task][0]
            res = answer(img, task, text_in)
            rec["answers"][task] = res
            preds.setdefault(task, []).append(res["post_processed"])
            gts.setdefault(task, []).append(value)
            sizes.setdefault(task, []).append(img.size)
        records.append(rec)
    return preds, gts, sizes, records


def torch_answerer(model_dir, max_new_tokens=96):
    import torch
    from transformers import AutoProcessor, Florence2ForConditionalGeneration

    sys_path_scripts()
    import make_fixtures as mf

    model = Florence2ForConditionalGeneration.from_pretrained(model_dir, attn_implementation="eager").eval()
    proc = AutoProcessor.from_pretrained(model_dir)

    def answer(img, task, text_in):
        enc = proc(text=task + text_in, images=img, return_tensors="pt")
        with torch.no_grad():
            ids = model.generate(**enc, max_new_tokens=max_new_tokens)[0].tolist()
        text = proc.batch_decode([ids], skip_special_tokens=False)[0]
        _, pf = mf.post_process(proc, text, task, img.size)
        return {"token_ids": ids, "text": text, "post_processed": pf[task]}

    answer.model = model  # for callers that change its weights between passes
    return answer


def sys_path_scripts():
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    for p in (str(here), str(here.parent / "fixtures")):
        if p not in sys.path:
            sys.path.insert(0, p)


def evaluate_dir(model_dir, seed, n, size, tok, max_new_tokens=96):
    import time

    import transformers

    t0 = time.time()
    examples = heldout(seed, n, size, tok)
    preds, gts, sizes, records = collect(examples, torch_answerer(model_dir, max_new_tokens))
    summary = score(preds, gts, sizes)
    return {"summary": summary, "transformers": transformers.__version__, "images": n, "seed": seed, "max_new_tokens": max_new_tokens,
            "eval_wall_s": time.time() - t0, "records": records}
