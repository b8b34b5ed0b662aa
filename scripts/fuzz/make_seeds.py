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
for p in ["images/grey.png", "images/scene.jpg", "images/scene.png", "processor/jpeg/color420.jpg",
          "images/jpeg/progressive420.jpg", "images/jpeg/restart_blocks420.jpg", "images/jpeg/odd422.jpg",
          "images/jpeg/cmyk.jpg"]:
    put("image", (FIX / p).read_bytes())

# json: a few shapes.
for t in ['{"a": [1, -2, 3.5e10, true, null, "x\\u00e9"], "b": {"c": {}}}', '[[[]]]', '{"k": 1, "k": 2}', '18446744073709551616']:
    put("json", t)

# hub: what a hub server sends that becomes a name or a number (ETags, Content-Range, ids, index JSON).
HUB_SEEDS = ['"a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"',
             'W/"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"', '"../../escaped"',
             'bytes 10-99/100', 'bytes 0-0/*', 'bytes 18446744073709551615-1/2',
             'microsoft/Florence-2-base-ft@refs/pr/1', 'a/b@../x',
             '{"metadata": {"total_size": 8}, "weight_map": {"a.weight": "model-00001-of-00002.safetensors", '
             '"b.bias": "model-00002-of-00002.safetensors"}}',
             '{"weight_map": {"a.weight": "../pytorch_model-00001-of-00002.bin"}}']
for t in HUB_SEEDS:
    put("hub", t)

# pickle: torch-shaped checkpoints written by Python's own pickler (protocol 2, as torch.save) over stand-in
# modules named like torch's, so the seeds need no torch: zip and legacy containers, a storage shared by
# two tensors at different offsets, a tensor stored twice (memo), f16/bf16 storages, refused globals.
def torch_pickles():
    import collections
    import io
    import pickle
    import sys
    import types
    import zipfile

    torch, utils = types.ModuleType("torch"), types.ModuleType("torch._utils")
    for name in ["FloatStorage", "HalfStorage", "BFloat16Storage", "LongStorage"]:
        setattr(torch, name, type(name, (), {"__module__": "torch", "__qualname__": name}))

    def _rebuild_tensor_v2(*args):
        raise AssertionError("never called")

    _rebuild_tensor_v2.__module__ = "torch._utils"
    _rebuild_tensor_v2.__qualname__ = "_rebuild_tensor_v2"
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2
    saved = {k: sys.modules.get(k) for k in ("torch", "torch._utils")}
    sys.modules.update({"torch": torch, "torch._utils": utils})

    class Storage:
        def __init__(self, key, cls, numel, size):
            self.key, self.cls, self.numel, self.size = key, getattr(torch, cls), numel, size

    class Tensor:
        def __init__(self, storage, offset, shape, stride=None):
            if stride is None:
                stride, s = [], 1
                for d in reversed(shape):
                    stride.insert(0, s)
                    s *= d
            self.args = (storage, offset, tuple(shape), tuple(stride), False, collections.OrderedDict())

        def __reduce_ex__(self, proto):
            return (_rebuild_tensor_v2, self.args)

    def dumps(obj, legacy):
        buf = io.BytesIO()
        p = pickle.Pickler(buf, protocol=2)
        def pid(o):
            if isinstance(o, Storage):
                t = ("storage", o.cls, o.key, "cpu", o.numel)
                return t + (None,) if legacy else t
            return None
        p.persistent_id = pid
        p.dump(obj)
        return buf.getvalue()

    s0, s1, s2 = Storage("0", "FloatStorage", 6, 4), Storage("1", "HalfStorage", 4, 2), Storage("2", "BFloat16Storage", 2, 2)
    a = Tensor(s0, 0, [2, 3])
    sd = collections.OrderedDict([("a", a), ("b", Tensor(s0, 3, [3])), ("c", Tensor(s1, 0, [2, 2])),
                                  ("d", Tensor(s2, 0, [2])), ("tied", a), ("step", 3)])
    storages = [s0, s1, s2]

    def put_entry(z, name, data):
        # A fixed timestamp: the seeds are deterministic.
        z.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)

    def zipped(obj, extra=()):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
            put_entry(z, "archive/data.pkl", dumps(obj, False))
            put_entry(z, "archive/byteorder", "little")
            for s in storages:
                put_entry(z, f"archive/data/{s.key}", bytes(range(s.numel * s.size)))
            for name, data in extra:
                put_entry(z, name, data)
            put_entry(z, "archive/version", "3\n")
        return buf.getvalue()

    def legacy(obj):
        out = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2) + pickle.dumps(1001, protocol=2)
        out += pickle.dumps({"protocol_version": 1001, "little_endian": True,
                             "type_sizes": {"short": 2, "int": 4, "long": 4}}, protocol=2)
        out += dumps(obj, True) + pickle.dumps([s.key for s in storages], protocol=2)
        for s in storages:
            out += struct.pack("<Q", s.numel) + bytes(range(s.numel * s.size))
        return out

    out = [zipped(sd), legacy(sd), zipped(dict(sd)), zipped(sd, [("archive/.data/serialization_id", "1234")]),
           zipped(collections.OrderedDict([("t", Tensor(s0, 0, [3, 2], [1, 3]))]))]
    for bad in [("os", "system"), ("builtins", "eval")]:
        raw = dumps(sd, False).replace(b"ctorch._utils\n_rebuild_tensor_v2\n", ("c%s\n%s\n" % bad).encode(), 1)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
            put_entry(z, "archive/data.pkl", raw)
        out.append(buf.getvalue())
    for k, v in saved.items():
        if v is None:
            sys.modules.pop(k, None)
        else:
            sys.modules[k] = v
    return out


for f in torch_pickles():
    put("pickle", b"\x07" + f)
for p in sorted((FIX / "models").glob("*/pytorch_model*.bin")):
    put("pickle", b"\x10" + p.read_bytes()[:65535])
