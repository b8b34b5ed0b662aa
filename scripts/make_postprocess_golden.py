#!/usr/bin/env python3
"""Golden cases for `post_process_generation`, produced by the REFERENCE post-processor.

Reference: `transformers` (>= 4.56; 5.24.0 checked) `Florence2Processor.post_process_generation`, with one
change: its `Florence2PostProcessor.dequantize` ends in `.int()` (truncating the pixel coordinates to
integers), and this project returns the floats, as the original model-card processor does. The script
replaces `dequantize` by a copy of the reference body without that cast, and asserts for every call that
casting the float result with `.int()` gives exactly what the untouched reference returns, so the only
difference is the cast.

The processor is built the way the HF-native checkpoints ship it: the tokenizer from the verified
Florence-2 tokenizer.json (read from /work/shared/reference at run time, never copied into the repo), and
the `post_processor_config` of the HF conversion script (its banned grounding phrases included). The
tokenizer only matters for `sequence=` input; golden cases pass `text=`, the generation decoded with special
tokens kept.

Where the reference raises (a location bin with more than 4300 digits: Python's int() limit; or beyond
int64: torch.tensor overflow), the case records `reference_error` and expects the well-formed empty answer of
the task's type, which is what the Rust port returns.

Run by hand from the repo root:  python3 scripts/make_postprocess_golden.py
Writes tests/fixtures/postprocess/golden.json.
"""

import json
import os
import sys

import torch
import transformers
from transformers import CLIPImageProcessorPil, Florence2Processor, PreTrainedTokenizerFast
from transformers.models.florence2 import processing_florence2 as pf

TOKENIZER = "/work/shared/reference/tokenizer/florence2_hf_native_tokenizer.json"
OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "postprocess", "golden.json")

# `post_processor_config` of transformers' convert_florence2_original_pytorch_to_hf.py (the config the
# florence-community checkpoints ship): the original model-card black list of generic phrases.
BANNED = [
    "it", "I", "me", "mine", "you", "your", "yours", "he", "him", "his", "she", "her", "hers", "they", "them",
    "their", "theirs", "one", "oneself", "we", "us", "our", "ours", "you", "your", "yours", "they", "them",
    "their", "theirs", "mine", "yours", "his", "hers", "its", "ours", "yours", "theirs", "myself", "yourself",
    "himself", "herself", "itself", "ourselves", "yourselves", "themselves", "this", "that", "these", "those",
    "who", "whom", "whose", "which", "what", "who", "whom", "whose", "which", "that", "all", "another", "any",
    "anybody", "anyone", "anything", "each", "everybody", "everyone", "everything", "few", "many", "nobody",
    "none", "one", "several", "some", "somebody", "someone", "something", "each other", "one another",
    "myself", "yourself", "himself", "herself", "itself", "ourselves", "yourselves", "themselves",
    "the image", "image", "images", "the", "a", "an", "a group", "other objects", "lots", "a set",
]
POST_PROCESSOR_CONFIG = {
    "ocr": {
        "pattern": r"(.+?)<loc_(\d+)><loc_(\d+)><loc_(\d+)><loc_(\d+)><loc_(\d+)><loc_(\d+)><loc_(\d+)><loc_(\d+)>",
        "area_threshold": 0.0,
    },
    "phrase_grounding": {"banned_grounding_tokens": BANNED},
    "pure_text": {},
    "description_with_bboxes": {},
    "description_with_polygons": {},
    "polygons": {},
    "bboxes": {},
    "description_with_bboxes_or_polygons": {},
}

_reference_dequantize = pf.Florence2PostProcessor.dequantize


def dequantize_float(self, locations, size):
    """The reference `dequantize` without its final `.int()` (checked against the reference on every call)."""
    bins_w, bins_h = self.quantize_bins
    size_w, size_h = size
    per_bin_w = size_w / bins_w
    per_bin_h = size_h / bins_h
    if locations.shape[-1] == 4:
        xmin, ymin, xmax, ymax = locations.split(1, dim=-1)
        out = torch.cat(
            [(xmin + 0.5) * per_bin_w, (ymin + 0.5) * per_bin_h, (xmax + 0.5) * per_bin_w, (ymax + 0.5) * per_bin_h],
            dim=-1,
        )
    elif locations.shape[-1] == 2:
        x, y = locations.split(1, dim=-1)
        out = torch.cat([(x + 0.5) * per_bin_w, (y + 0.5) * per_bin_h], dim=-1)
    else:
        raise ValueError(f"Unsupported location shape: last dim must be 2 or 4, got {locations.shape[-1]}.")
    assert torch.equal(out.int(), _reference_dequantize(self, locations, size)), "patch differs beyond the cast"
    return out


pf.Florence2PostProcessor.dequantize = dequantize_float


def processor():
    tok = PreTrainedTokenizerFast(
        tokenizer_file=TOKENIZER,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        extra_special_tokens={"image_token": "<image>"},
    )
    image_processor = CLIPImageProcessorPil(size={"height": 768, "width": 768}, do_center_crop=False)
    image_processor.image_seq_length = 577
    return Florence2Processor(
        image_processor=image_processor, tokenizer=tok, post_processor_config=POST_PROCESSOR_CONFIG
    )


def loc(*bins):
    return "".join(f"<loc_{b}>" for b in bins)


def seq(start, n, step=37):
    """n plausible bins starting at `start`."""
    return [(start + i * step) % 1000 for i in range(n)]


W = (640, 480)
G = "</s><s>"  # how a generation decoded with special tokens kept begins
E = "</s>"

CASES = [
    # ---- pure_text --------------------------------------------------------------------------------------
    ("caption_basic", "<CAPTION>", W, G + "A green car parked in front of a yellow building." + E),
    ("detailed_caption_whitespace", "<DETAILED_CAPTION>", W, G + "  The image shows  two cats.\n " + E),
    ("more_detailed_caption_pad_kept", "<MORE_DETAILED_CAPTION>", W, G + "Two cats on a couch." + E + "<pad><pad>"),
    ("ocr_non_ascii", "<OCR>", W, G + "Café déjà vu 東京タワー" + E),
    ("region_to_category_keeps_locs", "<REGION_TO_CATEGORY>", W, G + "cat" + loc(1, 2, 3, 4) + E),
    ("region_to_description_empty", "<REGION_TO_DESCRIPTION>", W, ""),
    ("region_to_ocr_nested_specials", "<REGION_TO_OCR>", W, "<<s>/s>abc<s>"),
    ("caption_python_whitespace", "<CAPTION>", W, "\x1c\u3000 cat \x1f\u2029"),
    ("ocr_pure_only_specials", "<OCR>", W, "<s></s><s></s>"),
    # ---- ocr ---------------------------------------------------------------------------------------------
    ("ocr_region_multi_line", "<OCR_WITH_REGION>", W,
     G + "CN TOWER" + loc(*seq(100, 8)) + "TORONTO" + loc(*seq(300, 8, 11)) + "2024" + loc(*seq(5, 8, 3)) + E),
    ("ocr_region_stray_text", "<OCR_WITH_REGION>", W,
     G + "EXIT" + loc(*seq(10, 8)) + " stray text at the end" + E),
    ("ocr_region_non_ascii", "<OCR_WITH_REGION>", (1000, 1000), G + " Ünïcödé 東京 " + loc(*seq(7, 8, 101)) + E),
    ("ocr_region_newline_in_content", "<OCR_WITH_REGION>", W, G + "line1\nline2" + loc(*seq(50, 8)) + E),
    ("ocr_region_nine_locs", "<OCR_WITH_REGION>", W, G + "A" + loc(*seq(1, 9)) + "B" + loc(*seq(2, 8)) + E),
    ("ocr_region_locs_in_content", "<OCR_WITH_REGION>", W, G + "A" + loc(*seq(1, 7)) + "B" + loc(*seq(3, 8)) + E),
    ("ocr_region_truncated", "<OCR_WITH_REGION>", W, G + "TEXT" + loc(1, 2, 3) + "<loc_4"),
    ("ocr_region_loc_1000", "<OCR_WITH_REGION>", W, G + "edge" + loc(1000, 0, 999, 1000, 1000, 1000, 0, 999) + E),
    ("ocr_region_empty", "<OCR_WITH_REGION>", W, ""),
    ("ocr_region_leading_locs", "<OCR_WITH_REGION>", W, G + loc(*seq(9, 16)) + E),
    # ---- description_with_bboxes ----------------------------------------------------------------------------
    ("od_multi_instance", "<OD>", W,
     G + "cat" + loc(26, 112, 497, 982) + "cat" + loc(541, 53, 998, 776) + "couch" + loc(0, 0, 998, 998)
     + "remote" + loc(63, 153, 274, 243) + "remote" + loc(520, 159, 578, 388) + E),
    ("od_boxes_per_phrase", "<OD>", (333, 517), G + "car" + loc(*seq(10, 8)) + "wheel" + loc(*seq(20, 12)) + E),
    ("od_leftover_locs", "<OD>", W, G + "dog" + loc(*seq(1, 5)) + "bird" + loc(*seq(2, 7)) + E),
    ("od_three_locs_then_phrase", "<OD>", W, G + "cat" + loc(1, 2, 3) + "dog" + loc(4, 5, 6, 7) + E),
    ("dense_region_multi_word", "<DENSE_REGION_CAPTION>", (4000, 3000),
     G + "a black and white cat" + loc(*seq(100, 4)) + "a red  sofa with cushions " + loc(*seq(200, 4)) + E),
    ("od_non_ascii_labels", "<OD>", W,
     G + "café table" + loc(*seq(3, 4)) + "東京タワー" + loc(*seq(4, 4)) + "naïve" + loc(*seq(5, 4)) + E),
    ("od_newline_inside_label", "<OD>", W, G + "a\ncat" + loc(*seq(6, 4)) + "dog" + loc(*seq(7, 4)) + E),
    ("od_newline_leading", "<OD>", W, G + "\n  cat" + loc(*seq(8, 4)) + E),
    ("od_loc_1000", "<OD>", W, G + "out" + loc(1000, 1000, 1000, 1000) + E),
    ("od_unicode_digits", "<OD>", W, G + "cat<loc_١٢٣><loc_４５><loc_᠑᠐><loc_𝟗𝟗𝟗>" + E),
    ("od_leading_zeros", "<OD>", W, G + "cat<loc_0012><loc_000><loc_0999><loc_00000000000000000000042>" + E),
    ("od_digits_4300_ok", "<OD>", W, G + "cat" + "<loc_" + "0" * 4299 + "7>" + loc(1, 2, 3) + E),
    ("od_digits_4301_raises", "<OD>", W, G + "cat" + "<loc_" + "0" * 4300 + "7>" + loc(1, 2, 3) + E),
    ("od_digits_5000_raises", "<OD>", W, G + "cat" + "<loc_" + "9" * 5000 + ">" + loc(1, 2, 3) + E),
    ("od_int64_max", "<OD>", W, G + "cat" + loc(9223372036854775807, 1, 2, 3) + E),
    ("od_int64_overflow_raises", "<OD>", W, G + "cat" + loc(9223372036854775808, 1, 2, 3) + "dog" + loc(1, 2, 3, 4) + E),
    ("od_long_digits_unused_5th", "<OD>", W, G + "cat" + loc(1, 2, 3, 4) + "<loc_" + "9" * 5000 + ">" + E),
    ("od_stray_markup", "<OD>", W,
     G + "<od>cat" + loc(1, 2, 3, 4) + "</od><unk>dog" + loc(5, 6, 7, 8) + "<bbox>bird</bbox>" + loc(9, 10, 11, 12) + E),
    ("od_specials_inside_label", "<OD>", W, "ca<s>t<pad>" + loc(1, 2, 3, 4) + "</s>d</s>og" + loc(5, 6, 7, 8)),
    ("od_malformed_locs", "<OD>", W,
     G + "a<loc_><loc_12<loc_-5><loc_ 5><loc_5 >b" + loc(1, 2, 3, 4) + "c<LOC_1><loc_2><loc_3><loc_4><loc_5>" + E),
    ("od_empty", "<OD>", W, ""),
    ("od_junk", "<OD>", W, "<<<>>><loc_<loc_<loc_>>>" + "<" * 50 + ">" * 50),
    ("od_tiny_image", "<OD>", (1, 1), G + "dot" + loc(0, 0, 999, 999) + E),
    # ---- bboxes ----------------------------------------------------------------------------------------------
    ("region_proposal_many", "<REGION_PROPOSAL>", W, G + loc(*seq(10, 12)) + E),
    ("region_proposal_with_text", "<REGION_PROPOSAL>", W, G + "a" + loc(*seq(1, 4)) + "b" + loc(*seq(2, 6)) + E),
    ("region_proposal_three_locs", "<REGION_PROPOSAL>", W, G + loc(1, 2, 3) + "x" + loc(4, 5, 6) + E),
    ("region_proposal_empty", "<REGION_PROPOSAL>", W, ""),
    # ---- phrase_grounding ----------------------------------------------------------------------------------
    ("grounding_several_boxes", "<CAPTION_TO_PHRASE_GROUNDING>", W,
     G + "two cats" + loc(*seq(10, 8)) + "a remote control" + loc(*seq(30, 4)) + E),
    ("grounding_banned", "<CAPTION_TO_PHRASE_GROUNDING>", W,
     G + "the image" + loc(0, 0, 999, 999) + "it" + loc(1, 2, 3, 4) + "I" + loc(5, 6, 7, 8)
     + "The image" + loc(9, 10, 11, 12) + "  the  " + loc(13, 14, 15, 16) + "a cat" + loc(17, 18, 19, 20) + E),
    ("grounding_banned_before_ascii_filter", "<CAPTION_TO_PHRASE_GROUNDING>", W,
     G + "iét" + loc(1, 2, 3, 4) + "chat noir été" + loc(5, 6, 7, 8) + E),
    ("grounding_truncated", "<CAPTION_TO_PHRASE_GROUNDING>", W, G + "a cat" + loc(1, 2, 3, 4) + "a dog" + loc(5, 6)),
    ("grounding_empty", "<CAPTION_TO_PHRASE_GROUNDING>", W, ""),
    # ---- polygons -------------------------------------------------------------------------------------------
    ("res_basic", "<REFERRING_EXPRESSION_SEGMENTATION>", W, G + loc(*seq(100, 10)) + E),
    ("res_sep_two_polygons", "<REFERRING_EXPRESSION_SEGMENTATION>", W,
     G + loc(*seq(100, 6)) + "<sep>" + loc(*seq(400, 8)) + E),
    ("res_odd_count", "<REFERRING_EXPRESSION_SEGMENTATION>", (333, 517), G + loc(*seq(10, 7)) + E),
    ("res_poly_groups", "<REFERRING_EXPRESSION_SEGMENTATION>", W,
     G + "<poly>" + loc(*seq(1, 6)) + "</poly><poly>" + loc(*seq(2, 9)) + "<sep>" + loc(*seq(3, 4)) + "</poly>" + E),
    ("res_close_without_open", "<REFERRING_EXPRESSION_SEGMENTATION>", W,
     G + loc(*seq(1, 5)) + "</poly>" + loc(*seq(2, 3)) + E),
    ("res_sep_label", "<REFERRING_EXPRESSION_SEGMENTATION>", W, G + "<sep><sep>" + loc(*seq(5, 4)) + E),
    ("res_text_ignored", "<REGION_TO_SEGMENTATION>", W, G + "cat" + loc(*seq(5, 6)) + E),
    ("res_empty_polygon", "<REGION_TO_SEGMENTATION>", W, G + loc(1) + "<sep>" + loc(*seq(5, 4)) + "<sep>" + E),
    ("res_truncated", "<REGION_TO_SEGMENTATION>", W, G + loc(1, 2, 3) + "<loc_4"),
    ("res_loc_1000", "<REGION_TO_SEGMENTATION>", W, G + loc(1000, 1000, 999, 999, 0, 1000) + E),
    ("res_overflow_dropped_last", "<REGION_TO_SEGMENTATION>", W, G + loc(1, 2, 3, 4, 99999999999999999999) + E),
    ("res_overflow_kept_raises", "<REGION_TO_SEGMENTATION>", W, G + loc(1, 2, 3, 99999999999999999999) + E),
    ("res_4301_digits_dropped_raises", "<REGION_TO_SEGMENTATION>", W, G + loc(1, 2, 3, 4) + "<loc_" + "1" * 4301 + ">" + E),
    ("res_empty", "<REGION_TO_SEGMENTATION>", W, ""),
    # ---- description_with_bboxes_or_polygons -----------------------------------------------------------------
    ("ovd_boxes", "<OPEN_VOCABULARY_DETECTION>", W, G + "cat" + loc(*seq(1, 4)) + "dog" + loc(*seq(2, 8)) + E),
    ("ovd_polygons", "<OPEN_VOCABULARY_DETECTION>", W,
     G + "cat<poly>" + loc(*seq(1, 6)) + "</poly>dog<poly>" + loc(*seq(2, 8)) + "<sep>" + loc(*seq(3, 6)) + "</poly>" + E),
    ("ovd_mixed_box_in_poly_mode", "<OPEN_VOCABULARY_DETECTION>", W,
     G + "cat" + loc(*seq(4, 4)) + "dog<poly>" + loc(*seq(5, 6)) + "</poly>" + E),
    ("ovd_polygons_non_ascii", "<OPEN_VOCABULARY_DETECTION>", W, G + "café crème<poly>" + loc(*seq(6, 6)) + "</poly>" + E),
    ("ovd_poly_only_after_cleaning", "<OPEN_VOCABULARY_DETECTION>", W,
     G + "cat" + loc(*seq(7, 4)) + "<po<s>ly>" + loc(*seq(8, 6)) + "</poly>" + E),
    ("ovd_poly_label_markup", "<OPEN_VOCABULARY_DETECTION>", W, G + "cat</poly><sep>" + loc(*seq(9, 6)) + E),
    ("ovd_empty", "<OPEN_VOCABULARY_DETECTION>", W, ""),
    ("ovd_poly_unclosed", "<OPEN_VOCABULARY_DETECTION>", W, G + "cat<poly>" + loc(*seq(10, 6)) + E),
]


# Valid prompts and the encoder text the reference builds for them (`Florence2Processor._construct_prompts`).
PROMPTS = [
    "<OCR>", "<OCR_WITH_REGION>", "<CAPTION>", "<DETAILED_CAPTION>", "<MORE_DETAILED_CAPTION>", "<OD>",
    "<DENSE_REGION_CAPTION>", "<REGION_PROPOSAL>",
    "<CAPTION_TO_PHRASE_GROUNDING>two cats on a couch",
    "<CAPTION_TO_PHRASE_GROUNDING>  A green car parked in front of a yellow building.  ",
    "<REFERRING_EXPRESSION_SEGMENTATION>the cat on the left",
    "<REGION_TO_SEGMENTATION><loc_52><loc_100><loc_300><loc_400>",
    "<OPEN_VOCABULARY_DETECTION>remote control",
    "<OPEN_VOCABULARY_DETECTION>{input} café",
    "<REGION_TO_CATEGORY><loc_0><loc_0><loc_999><loc_999>",
    "<REGION_TO_DESCRIPTION><loc_52><loc_100><loc_300><loc_400>",
    "<REGION_TO_OCR> <loc_1><loc_2><loc_3><loc_4> ",
]


# Seeded random "token soups" (pieces generations and malformed generations are made of), a differential
# check of every scanner beyond the hand-written cases above.
FUZZ_SEED = 20261130
FUZZ_CASES = 400
FUZZ_PIECES = [
    "<sep>", "<poly>", "</poly>", "<s>", "</s>", "<pad>", "<od>", "</od>", "<box>", "<bbox>", "<loc_", "<", ">",
    "\n", " ", "  ", "\u3000", "\x1c", "٣", "é", "東", "cat", "a red car", "the image", "it", "I", "7", "0042",
]


def fuzz_cases():
    import random

    rng = random.Random(FUZZ_SEED)
    tasks = list(processor().tasks_answer_post_processing_type)
    out = []
    for i in range(FUZZ_CASES):
        parts = []
        for _ in range(rng.randrange(0, 40)):
            r = rng.random()
            if r < 0.5:
                b = rng.randrange(0, 1000) if rng.random() < 0.97 else rng.choice([1000, 10**19, 10**30])
                parts.append(f"<loc_{b}>")
            else:
                parts.append(rng.choice(FUZZ_PIECES))
        size = rng.choice([(640, 480), (1, 1), (333, 517), (4000, 3000), (768, 768)])
        out.append((f"fuzz_{i:03d}", rng.choice(tasks), size, "".join(parts)))
    return out


def empty_answer(answer_type):
    return {
        "pure_text": "",
        "ocr": {"quad_boxes": [], "labels": []},
        "description_with_bboxes": {"bboxes": [], "labels": []},
        "bboxes": {"bboxes": [], "labels": []},
        "phrase_grounding": {"bboxes": [], "labels": []},
        "polygons": {"polygons": [], "labels": []},
        "description_with_bboxes_or_polygons": {
            "bboxes": [], "bboxes_labels": [], "polygons": [], "polygons_labels": []
        },
    }[answer_type]


def main():
    proc = processor()
    names = set()
    cases = []
    covered = set()
    for name, task, size, text in CASES + fuzz_cases():
        assert name not in names, name
        names.add(name)
        answer_type = proc.tasks_answer_post_processing_type[task]
        covered.add(task)
        try:
            expected = proc.post_process_generation(text, task=task, image_size=size)
            error = None
        except (ValueError, RuntimeError, OverflowError) as e:
            expected = {task: empty_answer(answer_type)}
            error = f"{type(e).__name__}: {str(e)[:120]}"
        cases.append({
            "name": name,
            "task": task,
            "answer_type": answer_type,
            "image_size": list(size),
            "text": text,
            "reference_error": error,
            "expected": expected,
        })
    missing = set(proc.tasks_answer_post_processing_type) - covered
    assert not missing, f"tasks without a case: {missing}"
    doc = {
        "generator": "scripts/make_postprocess_golden.py",
        "reference": "transformers Florence2Processor.post_process_generation, dequantize without .int()",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "python_version": sys.version.split()[0],
        "banned_grounding_tokens": sorted(set(BANNED)),
        "cases": cases,
        "prompts": [{"prompt": p, "encoder_text": proc._construct_prompts(p)[0]} for p in PROMPTS],
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    raised = sum(c["reference_error"] is not None for c in cases)
    print(f"wrote {len(cases)} cases ({raised} where the reference raises) to {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
