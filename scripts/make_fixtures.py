#!/usr/bin/env python3
"""Make the committed Florence-2 test fixtures under tests/fixtures/ (run by hand, never by the tests).

Needs: torch, transformers (5.24 checked), tokenizers, safetensors, pillow, numpy.
Reads (at generation time only, never copied): ../shared/reference/key_mapping_original_to_hf_native.json
(the original-Microsoft -> HF-native key mapping, used to derive the `-orig` / `-mlx-bf16` key names).

    python3 scripts/make_fixtures.py [--out tests/fixtures] [--mapping PATH]

Everything is seeded and deterministic; the script checks that itself (every generation is run twice and
compared, the tokenizer is trained twice and compared). tests/fixtures/README.md documents the output.
"""

import argparse
import copy
import json
import math
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw
from safetensors.torch import load_file, save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

import transformers
from transformers import (
    AutoProcessor,
    CLIPImageProcessorPil,
    Florence2Config,
    Florence2ForConditionalGeneration,
    Florence2Processor,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedTokenizerFast,
)

torch.set_num_threads(1)  # fixed thread count: bit-reproducible CPU reductions

ROOT = Path(__file__).resolve().parents[1]
MAX_NEW = 24  # max_new_tokens of every recorded generation unless a case says otherwise
ATTN_IMPL = "eager"
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]

# ----------------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------------

TASK_PROMPTS = [
    "What is the text in the image?",
    "What is the text in the image, with regions?",
    "What does the image describe?",
    "Describe in detail what is shown in the image.",
    "Describe with a paragraph what is shown in the image.",
    "Locate the objects with category name in the image.",
    "Locate the objects in the image, with their descriptions.",
    "Locate the region proposals in the image.",
    "Locate the phrases in the caption: a red circle and a blue square",
    "Locate a car in the image with mask",
    "What is the polygon mask of region",
    "Locate wheels in the image.",
    "What is the region?",
    "What does the region describe?",
    "What text is in the region?",
]
WORDS = (
    "a an the red green blue yellow white black grey orange circle square triangle box line stripe "
    "car cars wheel wheels person people tree trees house sky road sign text door window dog cat bird "
    "on in of with and near left right top bottom small large big picture photo shows there is are two "
    "three field street building next to above below sitting standing parked"
).split()
CORPUS = TASK_PROMPTS * 3 + [
    "A red car parked on the street next to a green tree.",
    "Two people standing near a white house with a blue door.",
    "The sign shows the text STOP in white on red.",
    "A small dog sitting in a field below the sky.",
    "a black cat and a grey bird on the road",
    "three yellow triangles and a large orange circle",
    " ".join(WORDS),
    " ".join(reversed(WORDS)),
    "0 1 2 3 4 5 6 7 8 9 10 42 100 2024",
]
BASE_VOCAB = 420  # trained BPE size incl. <s> <pad> </s> <unk>; <mask> comes right after

FLORENCE_TOKENS = (
    ["<od>", "</od>", "<ocr>", "</ocr>"]
    + [f"<loc_{i}>" for i in range(1000)]
    + (
        "<cap> </cap> <ncap> </ncap> <dcap> </dcap> <grounding> </grounding> <seg> </seg> <sep> <region_cap> "
        "</region_cap> <region_to_desciption> </region_to_desciption> <proposal> </proposal> <poly> </poly> <and>"
    ).split()
)
assert len(FLORENCE_TOKENS) == 1024


def build_base_tokenizer():
    """Byte-level BPE shaped like BART's: <s>0 <pad>1 </s>2 <unk>3 ... <mask> last; Roberta post-processor."""
    tok = Tokenizer(models.BPE(continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=BASE_VOCAB,
        min_frequency=1,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.RobertaProcessing(
        ("</s>", 2), ("<s>", 0), trim_offsets=True, add_prefix_space=False
    )
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=False, normalized=False, special=True)])
    j = json.loads(tok.to_str())
    # same model fields as the real BART tokenizer.json
    j["model"]["continuing_subword_prefix"] = ""
    j["model"]["end_of_word_suffix"] = ""
    return Tokenizer.from_str(json.dumps(j))


def add_florence_tokens(tok, image_token):
    tok = Tokenizer.from_str(tok.to_str())
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in FLORENCE_TOKENS])
    if image_token:
        tok.add_special_tokens([AddedToken("<image>", normalized=False, special=True)])
    return tok


def tokenizer_json(tok):
    return json.dumps(json.loads(tok.to_str()), indent=2, ensure_ascii=False) + "\n"


# ----------------------------------------------------------------------------------------------------
# Images
# ----------------------------------------------------------------------------------------------------


def draw_scene(w, h, seed):
    rs = np.random.RandomState(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 40 + 150 * xx / max(w - 1, 1)
    g = 60 + 120 * yy / max(h - 1, 1)
    b = 200 - 100 * (xx + yy) / (w + h)
    base = np.stack([r, g, b], -1) + rs.normal(0, 12, (h, w, 3))  # texture
    base += 20 * np.sin(xx / 3.0)[..., None] * (yy > h * 0.6)[..., None]  # stripes at the bottom
    img = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8), "RGB")
    d = ImageDraw.Draw(img)
    d.rectangle([w * 0.1, h * 0.15, w * 0.45, h * 0.55], fill=(200, 30, 30), outline=(255, 255, 255))
    d.ellipse([w * 0.55, h * 0.1, w * 0.9, h * 0.5], fill=(30, 60, 210))
    d.polygon([(w * 0.2, h * 0.95), (w * 0.5, h * 0.6), (w * 0.8, h * 0.95)], fill=(240, 220, 40))
    d.line([(0, h - 1), (w - 1, 0)], fill=(10, 10, 10), width=2)
    for i in range(6):
        x0, y0 = rs.randint(0, w - 4), rs.randint(0, h - 4)
        d.rectangle([x0, y0, x0 + 3, y0 + 3], fill=tuple(int(c) for c in rs.randint(0, 256, 3)))
    return img


def make_images(out):
    out.mkdir(parents=True, exist_ok=True)
    scene = draw_scene(83, 61, 1)
    scene.save(out / "scene.png", optimize=False)
    # 4:4:4 (no chroma subsampling) so decoders differ only by IDCT rounding, not by chroma upsampling
    scene.save(out / "scene.jpg", quality=90, subsampling=0)
    rgb = np.asarray(draw_scene(70, 90, 2))
    yy, xx = np.mgrid[0:90, 0:70]
    alpha = np.clip(255 * (xx / 69.0) * 0.7 + 60 * (yy % 20 < 10), 0, 255).astype(np.uint8)
    Image.fromarray(np.dstack([rgb, alpha]), "RGBA").save(out / "rgba.png")
    draw_scene(50, 40, 3).convert("L").save(out / "grey.png")
    draw_scene(200, 150, 4).save(out / "big.png")
    return ["scene.png", "scene.jpg", "rgba.png", "grey.png", "big.png"]


# ----------------------------------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------------------------------

CFGS = {
    "tiny2": dict(
        image=(64, 64),  # (height, width)
        vision=dict(
            depths=[1, 2],
            patch_size=[7, 3],
            patch_stride=[4, 2],
            patch_padding=[3, 1],
            patch_prenorm=[False, True],
            embed_dim=[16, 32],
            num_heads=[2, 4],
            num_groups=[2, 4],
            window_size=4,  # 16x16 and 8x8 grids: no window padding
            max_position_embeddings=10,  # last grid 8x8
            max_temporal_embeddings=100,
        ),
        text=dict(d_model=32, layers=2, heads=4, ffn=64, max_pos=160),
        # (seed, shared embedding std, </s> row scale) tried in order; the best is kept (see main)
        search=[(1000, 1.5, 2.5), (1000, 2.0, 2.5), (1001, 2.0, 1.0)],
    ),
    "tiny4": dict(
        image=(96, 64),  # non-square: last grid 3 rows x 2 cols
        vision=dict(
            depths=[1, 2, 1, 1],
            patch_size=[7, 3, 3, 3],
            patch_stride=[4, 2, 2, 2],
            patch_padding=[3, 1, 1, 1],
            patch_prenorm=[False, True, True, True],
            embed_dim=[16, 32, 48, 64],
            num_heads=[2, 2, 3, 4],
            num_groups=[2, 4, 3, 4],
            window_size=5,  # grids 24x16, 12x8, 6x4, 3x2: every stage pads
            max_position_embeddings=4,
            max_temporal_embeddings=100,
        ),
        text=dict(d_model=48, layers=2, heads=4, ffn=192, max_pos=128),
        search=[(1000, 1.5, 2.5), (1000, 1.5, 3.0), (1000, 1.5, 1.0)],
    ),
}


def grid_sizes(cfg):
    h, w = cfg["image"]
    v = cfg["vision"]
    out = []
    for k, s, p in zip(v["patch_size"], v["patch_stride"], v["patch_padding"]):
        h = (h + 2 * p - k) // s + 1
        w = (w + 2 * p - k) // s + 1
        out.append((h, w))
    return out


GEN_DEFAULTS = dict(
    bos_token_id=0,
    pad_token_id=1,
    eos_token_id=2,
    decoder_start_token_id=2,
    forced_bos_token_id=0,
    forced_eos_token_id=2,
    num_beams=3,
    no_repeat_ngram_size=3,
    early_stopping=True,
)


def hf_config(cfg, vocab_size, image_token_id):
    v = dict(cfg["vision"])
    t = cfg["text"]
    v.update(projection_dim=t["d_model"], drop_path_rate=0.1, mlp_ratio=4.0, qkv_bias=True, activation_function="gelu")
    text = dict(
        model_type="bart",
        vocab_size=vocab_size,
        d_model=t["d_model"],
        encoder_layers=t["layers"],
        decoder_layers=t["layers"],
        encoder_attention_heads=t["heads"],
        decoder_attention_heads=t["heads"],
        encoder_ffn_dim=t["ffn"],
        decoder_ffn_dim=t["ffn"],
        max_position_embeddings=t["max_pos"],
        activation_function="gelu",
        scale_embedding=False,
        bos_token_id=0,
        pad_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=2,
        tie_word_embeddings=True,
    )
    c = Florence2Config(text_config=text, vision_config=v, image_token_id=image_token_id)
    c._attn_implementation = ATTN_IMPL
    return c


def original_config(cfg, vocab_size, dtype):
    """config.json in the original Microsoft (remote-code) format."""
    v = cfg["vision"]
    t = cfg["text"]
    d = t["d_model"]
    return {
        "_name_or_path": "florence2",
        "architectures": ["Florence2ForConditionalGeneration"],
        "auto_map": {
            "AutoConfig": "configuration_florence2.Florence2Config",
            "AutoModelForCausalLM": "modeling_florence2.Florence2ForConditionalGeneration",
        },
        "bos_token_id": 0,
        "eos_token_id": 2,
        "ignore_index": -100,
        "is_encoder_decoder": True,
        "model_type": "florence2",
        "pad_token_id": 1,
        "projection_dim": d,
        "text_config": {
            "vocab_size": vocab_size,
            "activation_dropout": 0.1,
            "activation_function": "gelu",
            "add_bias_logits": False,
            "add_final_layer_norm": False,
            "attention_dropout": 0.1,
            "bos_token_id": 0,
            "classifier_dropout": 0.0,
            "d_model": d,
            "decoder_attention_heads": t["heads"],
            "decoder_ffn_dim": t["ffn"],
            "decoder_layerdrop": 0.0,
            "decoder_layers": t["layers"],
            "decoder_start_token_id": 2,
            "dropout": 0.1,
            "early_stopping": True,
            "encoder_attention_heads": t["heads"],
            "encoder_ffn_dim": t["ffn"],
            "encoder_layerdrop": 0.0,
            "encoder_layers": t["layers"],
            "eos_token_id": 2,
            "forced_eos_token_id": 2,
            "forced_bos_token_id": 0,
            "gradient_checkpointing": False,
            "init_std": 0.02,
            "is_encoder_decoder": True,
            "max_position_embeddings": t["max_pos"],
            "no_repeat_ngram_size": 3,
            "normalize_before": False,
            "num_beams": 3,
            "num_hidden_layers": t["layers"],
            "pad_token_id": 1,
            "scale_embedding": False,
            "use_cache": True,
        },
        "vision_config": {
            "model_type": "",
            "drop_path_rate": 0.1,
            "patch_size": v["patch_size"],
            "patch_stride": v["patch_stride"],
            "patch_padding": v["patch_padding"],
            "patch_prenorm": v["patch_prenorm"],
            "enable_checkpoint": False,
            "dim_embed": v["embed_dim"],
            "num_heads": v["num_heads"],
            "num_groups": v["num_groups"],
            "depths": v["depths"],
            "window_size": v["window_size"],
            "projection_dim": d,
            "visual_temporal_embedding": {
                "type": "COSINE",
                "max_temporal_embeddings": v["max_temporal_embeddings"],
            },
            "image_pos_embed": {"type": "learned_abs_2d", "max_pos_embeddings": v["max_position_embeddings"]},
            "image_feature_source": ["spatial_avg_pool", "temporal_avg_pool"],
        },
        "vocab_size": vocab_size,
        "torch_dtype": dtype,
        "transformers_version": "4.41.0.dev0",
    }


def preprocessor_dict(cfg, n_image_tokens):
    h, w = cfg["image"]
    return {
        "crop_size": {"height": h, "width": w},
        "do_center_crop": False,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": MEAN,
        "image_processor_type": "CLIPImageProcessor",
        "image_seq_length": n_image_tokens,
        "image_std": STD,
        "processor_class": "Florence2Processor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"height": h, "width": w},
    }


POST_PROCESSOR_CONFIG = {
    # As the HF conversion script writes it (lower-case keys: the HF post-processor reads "PATTERN" and
    # "AREA_THRESHOLD", so its defaults apply). Banned phrases: a subset of the conversion's list.
    "ocr": {
        "pattern": r"(.+?)<loc_(\d+)><loc_(\d+)><loc_(\d+)><loc_(\d+)><loc_(\d+)><loc_(\d+)><loc_(\d+)><loc_(\d+)>",
        "area_threshold": 0.0,
    },
    "phrase_grounding": {
        "banned_grounding_tokens": ["it", "I", "this", "that", "the image", "image", "the", "a", "an", "a set"]
    },
    "pure_text": {},
    "description_with_bboxes": {},
    "description_with_polygons": {},
    "polygons": {},
    "bboxes": {},
    "description_with_bboxes_or_polygons": {},
}


def make_processor(cfg, tok_full, n_image_tokens):
    h, w = cfg["image"]
    ip = CLIPImageProcessorPil(
        do_resize=True,
        size={"height": h, "width": w},
        resample=3,
        do_center_crop=False,
        crop_size={"height": h, "width": w},
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=MEAN,
        image_std=STD,
        do_convert_rgb=True,
    )
    ip.image_seq_length = n_image_tokens
    bt = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(tok_full.to_str()),
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
        sep_token="</s>",
        cls_token="<s>",
        extra_special_tokens={"image_token": "<image>"},
    )
    return Florence2Processor(image_processor=ip, tokenizer=bt, post_processor_config=POST_PROCESSOR_CONFIG)


# ----------------------------------------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------------------------------------


KNOBS = {"cross_gain": 1.0, "dec_ln_bias": 0.2, "byte_scale": 0.5, "merge_scale": 1.3, "eos_scale": 1.0}


def init_weights(model, seed, n_real_tokens, emb_std):
    """Seeded non-trivial init: random biases, LayerNorm gamma ~ U(0.5, 1.5), beta ~ N(0, 0.2)."""
    g = torch.Generator().manual_seed(seed)
    nn = torch.nn
    seen = set()

    def normal(p, std):
        p.copy_(torch.randn(p.shape, generator=g) * std)

    with torch.no_grad():
        for mname, m in model.named_modules():
            for pname, p in m.named_parameters(recurse=False):
                if id(p) in seen:
                    continue
                seen.add(id(p))
                full = f"{mname}.{pname}"
                if isinstance(m, nn.LayerNorm):
                    if pname == "weight":
                        p.copy_(0.5 + torch.rand(p.shape, generator=g))
                    else:
                        dec = "language_model.decoder." in full
                        normal(p, KNOBS["dec_ln_bias"] if dec else 0.2)
                elif isinstance(m, nn.Conv2d):
                    if pname == "bias":
                        normal(p, 0.1)
                    elif m.groups > 1:  # depthwise positional conv (residual): keep it modest
                        normal(p, 0.12)
                    else:
                        fan_in = p.shape[1] * p.shape[2] * p.shape[3]
                        normal(p, 1.0 / math.sqrt(fan_in))
                elif isinstance(m, nn.Linear):
                    if pname == "bias":
                        normal(p, 0.1)
                    else:
                        # stronger cross-attention so generations depend on the image and prompt
                        cross = ".encoder_attn.v_proj" in full or ".encoder_attn.out_proj" in full
                        gain = KNOBS["cross_gain"] if cross else 1.0
                        normal(p, gain / math.sqrt(p.shape[1]))
                elif isinstance(m, nn.Embedding):
                    if full.endswith("shared.weight") or full.endswith("embed_tokens.weight"):
                        normal(p, emb_std)
                        # tied LM head: make single-byte tokens rarer and merged (word-like) tokens likelier
                        p[4:260] *= KNOBS["byte_scale"]
                        p[260:BASE_VOCAB] *= KNOBS["merge_scale"]
                        p[2] *= KNOBS["eos_scale"]  # </s>: makes natural EOS (mid-sequence) likelier
                        p[n_real_tokens:] = p[:n_real_tokens].mean(0, keepdim=True)  # padded vocab rows
                    elif "image_position_embed" in full:
                        normal(p, 0.5)
                    else:  # BART learned positions
                        normal(p, 0.3)
                else:
                    raise RuntimeError(f"no init rule for {full} ({type(m).__name__})")


def check_cosine_table(model):
    proj = model.model.multi_modal_projector.visual_temporal_embed
    t = proj.pos_idx_to_embed
    n, c = t.shape
    half = c // 2
    freq = torch.exp(torch.arange(half).float() * -(math.log(10000) / half))
    ang = torch.arange(n).float()[:, None] * freq[None]
    want = torch.empty(n, c)
    want[:, 0::2] = torch.sin(ang)
    want[:, 1::2] = torch.cos(ang)
    assert torch.allclose(t, want, atol=1e-6), "temporal cosine table differs from the formula"


def hf_state(model):
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    # tied aliases of model.language_model.shared.weight: save_pretrained drops them (as the real checkpoints)
    assert model.config.tie_word_embeddings
    for k in ("lm_head.weight", "model.language_model.encoder.embed_tokens.weight",
              "model.language_model.decoder.embed_tokens.weight"):
        sd.pop(k, None)
    return sd


def load_mapping(path):
    m = json.load(open(path))["original_to_hf"]
    rules = []
    for o, h in m.items():
        ro = re.sub(r"\.\d+\.", ".#.", o)
        ro = re.sub(r"\.\d+\.", ".#.", ro)
        rh = re.sub(r"\.\d+\.", ".#.", h)
        rh = re.sub(r"\.\d+\.", ".#.", rh)
        rules.append((ro, rh))
    rules = sorted(set(rules))
    hf_to_orig = {}
    for ro, rh in rules:
        assert ro.count("#") == rh.count("#"), (ro, rh)
        hf_to_orig[rh] = ro
    return hf_to_orig


def template(name):
    nums = re.findall(r"\.(\d+)(?=\.)", name)
    t = re.sub(r"\.\d+\.", ".#.", name)
    t = re.sub(r"\.\d+\.", ".#.", t)
    return t, nums


def to_original(sd, hf_to_orig, n_vocab_orig, c_last, seed):
    """HF-native state dict -> original Microsoft names/layouts (f32)."""
    out = {}
    for k, v in sd.items():
        t, nums = template(k)
        if t not in hf_to_orig:
            raise KeyError(f"no original name for {k}")
        o = hf_to_orig[t]
        for n in nums:
            o = o.replace("#", n, 1)
        if o == "image_projection":
            v = v.t().contiguous()  # original: raw [C_last, D] matrix applied as x @ P
        if o == "language_model.model.shared.weight":
            v = v[:n_vocab_orig].contiguous()
        out[o] = v
    out["language_model.lm_head.weight"] = out["language_model.model.shared.weight"].clone()
    out["language_model.final_logits_bias"] = torch.zeros(1, n_vocab_orig)
    # unused by inference but present in the original checkpoints
    g = torch.Generator().manual_seed(seed + 7)
    out["vision_tower.norms.weight"] = 0.5 + torch.rand(c_last, generator=g)
    out["vision_tower.norms.bias"] = torch.randn(c_last, generator=g) * 0.2
    out["vision_tower.head.weight"] = torch.randn(1000, c_last, generator=g) * 0.1
    out["vision_tower.head.bias"] = torch.randn(1000, generator=g) * 0.1
    return out


def from_original(osd, hf_to_orig):
    """Inverse of to_original (for the self-check and to load rounded variants into the HF model)."""
    orig_to_hf = {o: h for h, o in hf_to_orig.items()}
    out = {}
    for k, v in osd.items():
        if k.startswith("vision_tower.norms.") or k.startswith("vision_tower.head."):
            continue
        if k in ("language_model.lm_head.weight", "language_model.final_logits_bias"):
            continue
        t, nums = template(k)
        h = orig_to_hf[t]
        for n in nums:
            h = h.replace("#", n, 1)
        if k == "image_projection":
            v = v.t().contiguous()
        out[h] = v
    return out


def is_davit_conv(name, v):
    return name.startswith("vision_tower.") and v.dim() == 4


def to_mlx(osd):
    """Original names, DaViT conv weights channels-last (O, kH, kW, I), bf16."""
    out = {}
    for k, v in osd.items():
        if is_davit_conv(k, v):
            v = v.permute(0, 2, 3, 1).contiguous()
        out[k] = v.to(torch.bfloat16)
    return out


def from_mlx(msd):
    out = {}
    for k, v in msd.items():
        if is_davit_conv(k, v):
            v = v.permute(0, 3, 1, 2).contiguous()
        out[k] = v.float()
    return out


# ----------------------------------------------------------------------------------------------------
# Reference runs
# ----------------------------------------------------------------------------------------------------


class Recorder(LogitsProcessor):
    """Appended after the default processors: records what the search sees (processed scores)."""

    def __init__(self):
        self.steps = []

    def __call__(self, input_ids, scores):
        self.steps.append((input_ids.clone(), scores.clone()))
        return scores


def greedy_margin(rec):
    worst = math.inf
    for _, s in rec.steps:
        s = s[0]
        fin = s[torch.isfinite(s)]
        if fin.numel() < 2:
            continue  # forced step
        top = torch.topk(fin, 2).values
        worst = min(worst, float(top[0] - top[1]))
    return worst


def beam_gap(rec, num_beams):
    """Smallest gap between consecutive candidate scores among the 2*beams+1 best of each step."""
    cum = {}
    worst = math.inf
    for ids, lp in rec.steps:
        rows = {}
        for r in range(ids.shape[0]):
            key = tuple(ids[r].tolist())
            rows.setdefault(key, r)
        cand = []
        for key, r in rows.items():
            base = cum.get(key, 0.0) if len(key) > 1 else 0.0
            cand.append(base + lp[r].double())
        allc = torch.cat(cand)
        allc = allc[torch.isfinite(allc)]
        k = min(2 * num_beams + 1, allc.numel())
        top = torch.topk(allc, k).values
        if k > 1:
            worst = min(worst, float((top[:-1] - top[1:]).min()))
        for key, r in rows.items():
            base = cum.get(key, 0.0) if len(key) > 1 else 0.0
            vals = base + lp[r].double()
            good = torch.nonzero(torch.isfinite(vals) & (vals >= top[-1])).flatten().tolist()
            for t in good:
                cum[key + (t,)] = float(vals[t])
    return worst


def float_dequant(proc):
    """post_process_generation with the int cast removed from dequantize (floats, as the original)."""
    pp = proc.post_processor

    def deq(locations, size):
        bins_w, bins_h = pp.quantize_bins
        w, h = size
        scale = torch.tensor([w / bins_w, h / bins_h] * (locations.shape[-1] // 2), dtype=torch.float64)
        return (locations.double() + 0.5) * scale

    return deq


def post_process(proc, text, task, size):
    res_int = proc.post_process_generation(text, task=task, image_size=size)
    orig = proc.post_processor.dequantize
    proc.post_processor.dequantize = float_dequant(proc)
    try:
        res_float = proc.post_process_generation(text, task=task, image_size=size)
    finally:
        proc.post_processor.dequantize = orig
    return res_int, res_float


RESULT_KINDS = {
    # name: (explicit generate kwargs beyond the common ones)
    "greedy": dict(num_beams=1, no_repeat_ngram_size=3),
    "greedy_nrng0": dict(num_beams=1, no_repeat_ngram_size=0),
    "beam3": dict(num_beams=3, no_repeat_ngram_size=3, early_stopping=True),
    "beam1": dict(num_beams=1, no_repeat_ngram_size=3, early_stopping=True),
    "beam2": dict(num_beams=2, no_repeat_ngram_size=3, early_stopping=True),
    "beam4": dict(num_beams=4, no_repeat_ngram_size=3, early_stopping=True),
    "beam3_early_false": dict(num_beams=3, no_repeat_ngram_size=3, early_stopping=False),
    "beam3_early_never": dict(num_beams=3, no_repeat_ngram_size=3, early_stopping="never"),
    "beam3_nrng0": dict(num_beams=3, no_repeat_ngram_size=0, early_stopping=True),
}
COMMON_KW = dict(
    do_sample=False,
    forced_bos_token_id=0,
    forced_eos_token_id=2,
    length_penalty=1.0,
    decoder_start_token_id=2,
    bos_token_id=0,
    pad_token_id=1,
    eos_token_id=2,
)
ALL_KINDS = list(RESULT_KINDS)
BASIC_KINDS = ["greedy", "greedy_nrng0", "beam3", "beam3_early_false", "beam3_early_never"]

CASES = [
    # image, task, text input, result kinds, max_new_tokens
    ("scene.png", "<CAPTION>", "", ALL_KINDS, MAX_NEW),
    ("scene.jpg", "<OD>", "", BASIC_KINDS + ["beam2", "beam4"], MAX_NEW),
    ("rgba.png", "<OCR_WITH_REGION>", "", BASIC_KINDS, 30),
    ("grey.png", "<CAPTION_TO_PHRASE_GROUNDING>", "a red circle and a blue square", BASIC_KINDS, MAX_NEW),
    ("big.png", "<REGION_TO_DESCRIPTION>", "<loc_100><loc_200><loc_700><loc_900>", BASIC_KINDS, MAX_NEW),
    ("scene.png", "<DETAILED_CAPTION>", "", BASIC_KINDS + ["beam2"], 20),
]


def remap_image_token(enc, model, proc):
    """Original-vocab models have no <image> row: their placeholder id is another (unused) id."""
    if model.config.image_token_id != proc.image_token_id:
        x = enc["input_ids"]
        enc["input_ids"] = torch.where(x == proc.image_token_id, model.config.image_token_id, x)


def run_cases(model, proc, img_dir, ref_vocab_limit=None, repeat=2):
    out = []
    margins = {"greedy_min_top1_top2": math.inf, "beam_min_candidate_gap": math.inf}
    for image, task, text_in, kinds, max_new in CASES:
        img = Image.open(img_dir / image)
        img.load()
        prompt = task + text_in
        enc = proc(text=prompt, images=img, return_tensors="pt")
        ids = enc["input_ids"][0].tolist()
        remap_image_token(enc, model, proc)
        n_img = ids.count(proc.image_token_id)
        case = {
            "image": image,
            "image_size": list(img.size),
            "task": task,
            "text_input": text_in,
            "prompt": prompt,
            "constructed_prompt": proc._construct_prompts(prompt)[0],
            "input_ids": ids,
            "prompt_ids": ids[n_img:],
            "num_image_tokens": n_img,
            "max_new_tokens": max_new,
            "results": {},
        }
        for kind in kinds:
            kw = dict(COMMON_KW, **RESULT_KINDS[kind], max_new_tokens=max_new)
            runs = []
            for _ in range(repeat):  # reproducibility check
                rec = Recorder()
                with torch.no_grad():
                    gen = model.generate(**enc, **kw, logits_processor=LogitsProcessorList([rec]))
                runs.append((gen[0].tolist(), rec))
            assert all(r[0] == runs[0][0] for r in runs), f"non-deterministic generation {image} {task} {kind}"
            tids, rec = runs[0]
            if ref_vocab_limit is not None:
                assert max(tids) < ref_vocab_limit, f"generated a padded-vocab id: {tids}"
            text = proc.batch_decode([tids], skip_special_tokens=False)[0]
            # the same string as the plain `tokenizers` decode (what a Rust loader of tokenizer.json gets)
            assert text == proc.tokenizer.backend_tokenizer.decode(tids, skip_special_tokens=False), tids
            pi, pf = post_process(proc, text, task, img.size)
            r = {"kwargs": kw, "token_ids": tids, "text": text, "post_processed": pi, "post_processed_float": pf}
            if kw["num_beams"] == 1:
                m = greedy_margin(rec)
                r["min_top1_top2_margin"] = m
                margins["greedy_min_top1_top2"] = min(margins["greedy_min_top1_top2"], m)
            else:
                gap = beam_gap(rec, kw["num_beams"])
                r["min_candidate_gap"] = gap
                margins["beam_min_candidate_gap"] = min(margins["beam_min_candidate_gap"], gap)
            case["results"][kind] = r
        res = case["results"]
        if "greedy_nrng0" in res:
            case["no_repeat_changes_greedy"] = res["greedy"]["token_ids"] != res["greedy_nrng0"]["token_ids"]
        out.append(case)
    return out, margins


def strip_margins(cases):
    c = copy.deepcopy(cases)
    for case in c:
        for r in case["results"].values():
            r.pop("min_top1_top2_margin", None)
            r.pop("min_candidate_gap", None)
    return c


def tokens_major(x):  # (B, C, H, W) -> (B, H*W, C)
    return x.flatten(2).transpose(1, 2).contiguous()


def activations(model, proc, img_dir):
    img = Image.open(img_dir / "scene.png")
    enc = proc(text="<CAPTION>", images=img, return_tensors="pt")
    remap_image_token(enc, model, proc)
    vt = model.model.vision_tower
    acts = {"pixel_values": enc["pixel_values"].clone()}
    hooks = []

    def grab(name, fn=tokens_major):
        def h(mod, inp, out):
            acts[name] = fn(out).detach().clone()

        return h

    for s, conv in enumerate(vt.convs):
        hooks.append(conv.register_forward_hook(grab(f"vision.convs.{s}")))
        for b, blk in enumerate(vt.blocks[s]):
            hooks.append(blk.spatial_block.register_forward_hook(grab(f"vision.blocks.{s}.{b}.spatial")))
            hooks.append(blk.channel_block.register_forward_hook(grab(f"vision.blocks.{s}.{b}.channel")))
    hooks.append(vt.register_forward_hook(grab("vision.out", lambda o: tokens_major(o.last_hidden_state))))
    hooks.append(model.model.multi_modal_projector.register_forward_hook(grab("projector.out", lambda o: o)))
    enc_mod = model.model.language_model.encoder

    def pre(mod, args, kwargs):
        acts["encoder.inputs_embeds"] = kwargs["inputs_embeds"].detach().clone()

    hooks.append(enc_mod.register_forward_pre_hook(pre, with_kwargs=True))
    hooks.append(enc_mod.register_forward_hook(grab("encoder.out", lambda o: o.last_hidden_state)))
    with torch.no_grad():
        out = model(**enc, decoder_input_ids=torch.tensor([[2]]))
    for h in hooks:
        h.remove()
    acts["decoder.logits0"] = out.logits[:, -1, :].detach().clone()
    return {k: v.float().contiguous() for k, v in acts.items()}


def act_stats(acts):
    lines = []
    for k, v in acts.items():
        lines.append(f"    {k:34s} {str(tuple(v.shape)):18s} std {v.std():8.3f} absmax {v.abs().max():8.3f}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------------


def write_json(path, obj):
    path.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n")


def write_common(d, cfg, n_image_tokens, tok_str):
    write_json(d / "preprocessor_config.json", preprocessor_dict(cfg, n_image_tokens))
    write_json(d / "generation_config.json", dict(GEN_DEFAULTS, transformers_version=transformers.__version__))
    (d / "tokenizer.json").write_text(tok_str)


def save_hf_dir(d, model, cfg, proc, n_image_tokens, tok_full_str, dtype=torch.float32, shards=1):
    """HF-native dir. f32: exactly what `save_pretrained` writes; f16: its config with our own 2 shards."""
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    tmp = d / "_tmp"
    model.save_pretrained(tmp)
    saved = load_file(tmp / "model.safetensors")
    sd = hf_state(model)
    assert set(saved) == set(sd), ("save_pretrained key set differs", set(saved) ^ set(sd))
    conf = json.loads((tmp / "config.json").read_text())
    conf.pop("_attn_implementation", None)
    if shards == 1:
        assert dtype == torch.float32
        shutil.copy(tmp / "model.safetensors", d / "model.safetensors")
    else:
        conf["dtype"] = "float16"
        sd = {k: v.to(dtype).contiguous() for k, v in sd.items()}
        total = sum(v.numel() * v.element_size() for v in sd.values())
        parts, acc = [[]], 0
        for k in sd:
            if acc >= total / shards and len(parts) < shards:
                parts.append([])
                acc = 0
            parts[-1].append(k)
            acc += sd[k].numel() * sd[k].element_size()
        assert len(parts) == shards
        wm = {}
        for i, ks in enumerate(parts):
            fn = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            save_file({k: sd[k] for k in ks}, d / fn, metadata={"format": "pt"})
            wm.update({k: fn for k in ks})
        write_json(d / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": wm})
    write_json(d / "config.json", conf)
    shutil.rmtree(tmp)
    write_common(d, cfg, n_image_tokens, tok_full_str)
    # what AutoProcessor needs (the processor's own files: processor_config.json + tokenizer_config.json)
    proc.save_pretrained(tmp)
    for f in ("processor_config.json", "tokenizer_config.json"):
        shutil.copy(tmp / f, d / f)
    shutil.rmtree(tmp)


def save_orig_dir(d, osd, cfg, n_vocab_orig, n_image_tokens, tok_base_str, dtype_name, fmt):
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    write_json(d / "config.json", original_config(cfg, n_vocab_orig, dtype_name))
    save_file(osd, d / "model.safetensors", metadata={"format": fmt})
    write_common(d, cfg, n_image_tokens, tok_base_str)


def build_model(config, seed, emb_std, n_full):
    torch.manual_seed(seed)
    model = Florence2ForConditionalGeneration(config).eval()
    init_weights(model, seed, n_full - 1, emb_std)  # <image> row stays random; only padding rows are averaged
    model.tie_weights()
    assert model.lm_head.weight.data_ptr() == model.model.language_model.shared.weight.data_ptr()
    check_cosine_table(model)
    return model


def truncate_vocab(sd, n):
    sd = dict(sd)
    sd["model.language_model.shared.weight"] = sd["model.language_model.shared.weight"][:n].contiguous()
    return sd


def load_hf_from_sd(config, sd):
    model = Florence2ForConditionalGeneration(config).eval()
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= {"lm_head.weight", "model.language_model.encoder.embed_tokens.weight",
                            "model.language_model.decoder.embed_tokens.weight"}, missing
    model.tie_weights()
    return model


def sd_close(a, b, tol=0.0):
    assert set(a) == set(b), (set(a) ^ set(b))
    for k in a:
        assert a[k].shape == b[k].shape, k
        d = (a[k].float() - b[k].float()).abs().max().item() if a[k].numel() else 0.0
        assert d <= tol, (k, d)


# ----------------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures"))
    ap.add_argument("--mapping", default=str(ROOT.parent / "shared" / "reference" / "key_mapping_original_to_hf_native.json"))
    ap.add_argument("--cfg", action="append", help="only these cfgs (default: all)")
    args = ap.parse_args()
    out = Path(args.out)
    hf_to_orig = load_mapping(args.mapping)
    meta = {"transformers": transformers.__version__, "torch": torch.__version__, "attn_implementation": ATTN_IMPL,
            "init_knobs": {k: v for k, v in KNOBS.items() if k != "eos_scale"}, "torch_threads": torch.get_num_threads()}

    img_dir = out / "images"
    images = make_images(img_dir)

    tok_base = build_base_tokenizer()
    assert tok_base.to_str() == build_base_tokenizer().to_str(), "BPE training is not deterministic"
    assert tok_base.token_to_id("<mask>") == BASE_VOCAB
    tok_orig = add_florence_tokens(tok_base, image_token=False)
    tok_full = add_florence_tokens(tok_base, image_token=True)
    n_base = tok_base.get_vocab_size()
    n_orig = tok_orig.get_vocab_size()
    n_full = tok_full.get_vocab_size()
    assert (n_base, n_orig, n_full) == (BASE_VOCAB + 1, BASE_VOCAB + 1025, BASE_VOCAB + 1026)
    image_token_id = n_full - 1
    vocab_hf = ((n_full + 63) // 64) * 64
    tok_full_str = tokenizer_json(tok_full)
    tok_base_str = tokenizer_json(tok_base)
    meta["tokenizer"] = dict(base_vocab_incl_mask=n_base, with_florence_tokens=n_orig, with_image=n_full,
                             image_token_id=image_token_id, hf_vocab_size=vocab_hf, orig_vocab_size=n_orig)
    print("tokenizer", meta["tokenizer"])

    for cname in args.cfg or list(CFGS):
        cfg = CFGS[cname]
        grids = grid_sizes(cfg)
        n_img_tokens = 1 + grids[-1][0] * grids[-1][1]
        config = hf_config(cfg, vocab_hf, image_token_id)
        proc = make_processor(cfg, tok_full, n_img_tokens)
        # prompt ids and the orig tokenizer (+ Florence tokens added by the loader) must agree
        t2 = Tokenizer.from_str(tok_base_str)
        t2.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in FLORENCE_TOKENS])
        for p in TASK_PROMPTS + ["What does the region <loc_100><loc_200><loc_700><loc_900> describe?"]:
            assert t2.encode(p).ids == tok_full.encode(p).ids
            assert t2.encode(p).ids == [0] + proc.tokenizer(p, add_special_tokens=False)["input_ids"] + [2]
        print(f"\n=== {cname}: grids {grids}, image tokens {n_img_tokens}")
        # no <image> row / padding in the original vocab: the placeholder id for the HF model is <mask> (unused)
        cfg_orig = hf_config(cfg, n_orig, BASE_VOCAB)
        best = None
        for attempt, (seed, emb_std, eos_scale) in enumerate(cfg["search"]):
            KNOBS["eos_scale"] = eos_scale
            model = build_model(config, seed, emb_std, n_full)
            sd = hf_state(model)
            f32_cases, margins = run_cases(model, proc, img_dir, ref_vocab_limit=n_orig, repeat=1)
            allm = {"f32": margins}
            bf = load_hf_from_sd(cfg_orig, {k: v.to(torch.bfloat16).float() for k, v in truncate_vocab(sd, n_orig).items()})
            _, allm["bf16"] = run_cases(bf, proc, img_dir, ref_vocab_limit=n_orig, repeat=1)
            if cname == "tiny4":
                f16 = load_hf_from_sd(config, {k: v.half().float() for k, v in sd.items()})
                _, allm["f16"] = run_cases(f16, proc, img_dir, ref_vocab_limit=n_orig, repeat=1)
            score = min(min(m["greedy_min_top1_top2"] / 2e-3, m["beam_min_candidate_gap"] / 1e-4) for m in allm.values())
            # cases whose greedy or beam3 result ends with a natural EOS (not forced at the last step)
            # (length 3 = EOS right after the forced <s>: one such case is useful, more are degenerate)
            natural = sum(
                any(3 < len(c["results"][k]["token_ids"]) < 1 + c["max_new_tokens"] for k in ("greedy", "beam3"))
                for c in f32_cases
            )
            at_once = sum(len(c["results"]["greedy"]["token_ids"]) == 3 for c in f32_cases)
            rank = (score >= 1, min(natural, 3) - max(0, at_once - 1), min(score, 5))
            print(f"  seed {seed} emb_std {emb_std} eos_scale {eos_scale}: score {score:.2f}, natural EOS in {natural} cases, EOS at once in {at_once} {allm}")
            if best is None or rank > best[0]:
                best = (rank, score, seed, emb_std, eos_scale, attempt)
        _, score, seed, emb_std, eos_scale, attempt = best
        KNOBS["eos_scale"] = eos_scale
        assert score >= 1, "no seed gave clear margins"
        model = build_model(config, seed, emb_std, n_full)
        cases, margins = run_cases(model, proc, img_dir, ref_vocab_limit=n_orig)
        chosen = (seed, emb_std, attempt)
        print(f"  chosen seed {seed} emb_std {emb_std} eos_scale {eos_scale} (score {score:.2f})")
        acts = activations(model, proc, img_dir)
        print(act_stats(acts))
        sd = hf_state(model)
        refdir = out / "reference" / cname
        if refdir.exists():
            shutil.rmtree(refdir)
        refdir.mkdir(parents=True)
        save_file(acts, refdir / "activations.safetensors", metadata={"format": "pt"})
        pix = {}
        for im in images:
            pix[im] = proc.image_processor(images=Image.open(img_dir / im), return_tensors="pt")["pixel_values"]
        save_file(pix, refdir / "pixels.safetensors", metadata={"format": "pt"})
        write_json(refdir / "cases.json", cases)
        cmeta = dict(seed=chosen[0], shared_embedding_std=chosen[1], eos_row_scale=eos_scale, search_attempt=chosen[2],
                     search=cfg["search"], margins=margins,
                     grids=grids, image_tokens=n_img_tokens, image_size_hw=list(cfg["image"]))

        # ---- HF-native f32
        mdir = out / "models" / cname
        save_hf_dir(mdir, model, cfg, proc, n_img_tokens, tok_full_str)
        re_model = Florence2ForConditionalGeneration.from_pretrained(mdir, attn_implementation=ATTN_IMPL).eval()
        sd_close(hf_state(re_model), sd)
        re_proc = AutoProcessor.from_pretrained(mdir)
        assert type(re_proc.image_processor).__name__ == "CLIPImageProcessorPil"
        re_cases, _ = run_cases(re_model, re_proc, img_dir)
        # ids, text and parsed results must be identical; margins may move in the last bits (CPU kernels
        # depend on tensor alignment), so compare those loosely
        assert strip_margins(re_cases) == strip_margins(cases), "reloaded HF-native dir gives other results"

        # ---- original naming, f32
        c_last = cfg["vision"]["embed_dim"][-1]
        osd = to_original(sd, hf_to_orig, n_orig, c_last, chosen[0])
        save_orig_dir(out / "models" / f"{cname}-orig", osd, cfg, n_orig, n_img_tokens, tok_base_str, "float32", "pt")
        back = from_original(load_file(out / "models" / f"{cname}-orig" / "model.safetensors"), hf_to_orig)
        sd_trunc = truncate_vocab(sd, n_orig)
        sd_close(back, sd_trunc)
        variants = {}
        variants[f"{cname}-orig"] = (cfg_orig, back)

        # ---- mlx-community style: original names, channels-last convs, bf16
        msd = to_mlx(osd)
        mdir_mlx = out / "models" / f"{cname}-mlx-bf16"
        save_orig_dir(mdir_mlx, msd, cfg, n_orig, n_img_tokens, tok_base_str, "bfloat16", "mlx")
        back_mlx = from_original(from_mlx(load_file(mdir_mlx / "model.safetensors")), hf_to_orig)
        rounded = {k: v.to(torch.bfloat16).float() for k, v in sd_trunc.items()}
        sd_close(back_mlx, rounded)
        variants[f"{cname}-mlx-bf16"] = (cfg_orig, back_mlx)

        # ---- f16, 2 shards (tiny4 only)
        if cname == "tiny4":
            fdir = out / "models" / f"{cname}-f16-sharded"
            save_hf_dir(fdir, model, cfg, proc, n_img_tokens, tok_full_str, dtype=torch.float16, shards=2)
            f16m = Florence2ForConditionalGeneration.from_pretrained(
                fdir, dtype=torch.float32, attn_implementation=ATTN_IMPL
            ).eval()
            sd_close(hf_state(f16m), {k: v.half().float() for k, v in sd.items()})
            variants[f"{cname}-f16-sharded"] = (None, f16m)

        cmeta["variants"] = {}
        for vname, (vconf, vsd) in variants.items():
            vm = vsd if vconf is None else load_hf_from_sd(vconf, vsd)
            vm.config._attn_implementation = ATTN_IMPL
            vcases, vmargins = run_cases(vm, proc, img_dir, ref_vocab_limit=n_orig)
            vacts = activations(vm, proc, img_dir)
            vref = out / "reference" / vname
            if vref.exists():
                shutil.rmtree(vref)
            vref.mkdir(parents=True)
            save_file(vacts, vref / "activations.safetensors", metadata={"format": "pt"})
            write_json(vref / "cases.json", vcases)
            same = [
                (c["image"], c["task"], k)
                for c, b in zip(vcases, cases)
                for k in c["results"]
                if c["results"][k]["token_ids"] == b["results"][k]["token_ids"]
            ]
            total = sum(len(c["results"]) for c in vcases)
            d_logits = (vacts["decoder.logits0"][:, :n_orig] - acts["decoder.logits0"][:, :n_orig]).abs().max().item()
            cmeta["variants"][vname] = dict(margins=vmargins, results_equal_to_f32=f"{len(same)}/{total}",
                                            logits0_max_abs_diff_vs_f32=d_logits)
            print(f"  {vname}: margins {vmargins}, same ids as f32 in {len(same)}/{total}, logits0 diff {d_logits:.3g}")
        cmeta["early_stopping_changes_beam3"] = [
            f"{c['image']} {c['task']}: {k}"
            for c in cases
            for k in ("beam3_early_false", "beam3_early_never")
            if k in c["results"] and c["results"][k]["token_ids"] != c["results"]["beam3"]["token_ids"]
        ]
        cmeta["natural_eos"] = {
            f"{c['image']} {c['task']}": {k: len(r["token_ids"]) for k, r in c["results"].items()
                                          if len(r["token_ids"]) < 1 + c["max_new_tokens"]}
            for c in cases
        }
        print("  early stopping changes beam3 in:", cmeta["early_stopping_changes_beam3"])
        print("  natural EOS (lengths):", cmeta["natural_eos"])
        meta[cname] = cmeta

    write_json(out / "reference" / "meta.json", meta)
    make_quantized(out)
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"\nfixtures total {total / 1e6:.2f} MB")


def make_quantized(out):
    """The quantized checkpoints, made by scripts/convert_checkpoint.py from the float dirs (no reference
    run: tests/model/quantized_checkpoints.rs checks them against the engine's own quantizer and the float dirs),
    and the quantizer's edge-case vectors (scripts/make_quant_vectors.py)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import convert_checkpoint as cc
    import make_quant_vectors

    quiet = lambda *_: None  # noqa: E731
    models = out / "models"
    for src, name, dtype, shard in (("tiny2", "tiny2-q8", "q8", None), ("tiny2", "tiny2-q4", "q4", None),
                                    ("tiny2-orig", "tiny2-orig-q4-sharded", "q4", "120KB")):
        if (models / src).is_dir():
            cc.convert(str(models / src), str(models / name), dtype=dtype,
                       shard_size=cc.parse_size(shard) if shard else None, force=True, log=quiet)
            for f in (models / name).iterdir():
                f.chmod(0o644)
            print(f"  {name}: {dtype} from {src}")
    make_quant_vectors.main()


if __name__ == "__main__":
    main()
