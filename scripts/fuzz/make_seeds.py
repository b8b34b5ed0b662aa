#!/usr/bin/env python3
"""Writes the committed fuzz seeds (scripts/fuzz/corpus/TARGET/*) from the repository's own fixtures and a
few hand-made cases. Deterministic; run from anywhere: python3 scripts/fuzz/make_seeds.py"""
import hashlib
import json
import pathlib
import struct

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "scripts/fuzz/corpus"
FIX = ROOT / "tests/fixtures"


def put(target, data):
    if isinstance(data, str):
        data = data.encode()
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / hashlib.sha1(data).hexdigest()[:16]).write_bytes(data)


def safetensors(entries, meta=None, fill=b"\x01"):
    """entries: (name, dtype, shape); data of the right size, every byte `fill`."""
    size = {"F32": 4, "F16": 2, "BF16": 2, "U8": 1, "I64": 8}
    h, pos = {}, 0
    for name, dt, shape in entries:
        n = size[dt]
        for d in shape:
            n *= d
        h[name] = {"dtype": dt, "shape": shape, "data_offsets": [pos, pos + n]}
        pos += n
    if meta:
        h["__metadata__"] = meta
    js = json.dumps(h).encode()
    return struct.pack("<Q", len(js)) + js + fill * pos


# header: real fixture headers (no data) and small whole files.
for m in ["tiny2", "tiny2-orig", "tiny2-mlx-bf16"]:
    b = (FIX / "models" / m / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    put("header", b[: 8 + n])
small = [
    safetensors([("a", "F32", [2, 3]), ("b", "BF16", [3])], {"format": "pt"}),
    safetensors([("x", "U8", [0]), ("y", "F16", [1, 1, 1, 1])]),
    safetensors([("model.language_model.shared.weight", "F16", [40, 16])]),
]
for f in small:
    put("header", f)

# stream: 8 chunk-size bytes, then a file the tiny config (scripts/fuzz/tiny_config.json) partly uses.
for i, f in enumerate(small):
    put("stream", bytes([3 + i, 250, 1, 17, 64, 2, 9, 128]) + f)
put(
    "stream",
    bytes([1, 2, 3, 4, 5, 6, 7, 8])
    + safetensors(
        [
            ("model.language_model.shared.weight", "F32", [40, 16]),
            ("model.vision_tower.convs.0.conv.bias", "BF16", [8]),
            ("vision_tower.convs.0.proj.weight", "F16", [8, 7, 7, 3]),
        ]
    ),
)

# stream, quantized checkpoints (the fuzz target's q8 / q4 configs, chosen by the second head byte % 3):
# the tiny config's three matrices with 32-weight rows as `.qweight` U8 rows (zero rows: valid padding).
for cfg, rb in ((1, 48), (2, 32)):  # q8 / q4 row bytes for K = 32
    put(
        "stream",
        bytes([5, cfg, 2, 33, 7, 64, 3, 11])
        + safetensors(
            [
                ("model.language_model.decoder.layers.0.fc2.weight.qweight", "U8", [16, rb]),
                ("model.language_model.decoder.layers.1.fc2.weight.qweight", "U8", [16, rb]),
                ("model.vision_tower.blocks.0.0.spatial_block.ffn.fc2.weight.qweight", "U8", [8, rb]),
                ("model.language_model.shared.weight", "F32", [40, 16]),
            ],
            fill=b"\x00",
        ),
    )

# config: the fixture configs and the fuzz tiny config.
for p in sorted((FIX / "models").glob("*/config.json")):
    put("config", p.read_bytes())
put("config", (ROOT / "scripts/fuzz/tiny_config.json").read_bytes())
for p in sorted((FIX / "models").glob("*/generation_config.json"))[:1]:
    put("json", p.read_bytes())

# index
for p in sorted((FIX / "models").glob("*/model.safetensors.index.json")):
    put("index", p.read_bytes())
put("index", json.dumps({"metadata": {"total_size": 8}, "weight_map": {"a": "m-1.safetensors", "b": "sub/m-2.safetensors"}}))

# prompt: every prompt of the golden file, plus edge cases.
golden = json.loads((FIX / "postprocess/golden.json").read_text())
for p in golden["prompts"]:
    put("prompt", p["prompt"])
for p in ["<CAPTION_TO_PHRASE_GROUNDING>two cats", "<REGION_TO_DESCRIPTION><loc_52><loc_100><loc_300><loc_400>",
          "<OPEN_VOCABULARY_DETECTION>\u202ecat", "<OD> ", "OD"]:
    put("prompt", p)

# postprocess: 4 image-size bytes (w, h as u16 LE), then a golden generation.
for c in golden["cases"][::6]:
    w, h = c["image_size"]
    put("postprocess", struct.pack("<HH", w, h) + c["text"].encode())

# image: the small fixture images.
for p in ["images/grey.png", "images/scene.jpg", "images/scene.png", "processor/jpeg/color420.jpg"]:
    put("image", (FIX / p).read_bytes())

# json: a few shapes.
for t in ['{"a": [1, -2, 3.5e10, true, null, "x\\u00e9"], "b": {"c": {}}}', '[[[]]]', '{"k": 1, "k": 2}', '18446744073709551616']:
    put("json", t)
