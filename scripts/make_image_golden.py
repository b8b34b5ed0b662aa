#!/usr/bin/env python3
"""Golden data for the image processor (`src/processor/image.rs`), written to tests/fixtures/processor/.

Run by hand (numpy + Pillow + transformers, no torch needed): `python3 scripts/make_image_golden.py`.
The Rust tests never need Python.

What it writes (all deterministic: seeded numpy, no timestamps):
- `resize/<name>.in.png` + `resize/<name>.out.png`: an RGB8 synthetic image and PIL's
  `Image.resize((w, h), Image.BICUBIC)` of it (uint8, exactly what the reference processor computes
  before rescaling). Cases cover up- and down-sampling in each axis, odd sizes, 1xN, extreme aspect,
  single-axis resizes, the identity, and the real 768x768 target.
- `convert/<name>.png` + `convert/<name>.rgb.png`: PNGs in every colour type / bit depth and the RGB8
  array the reference's `transformers.image_transforms.convert_to_rgb` produces from `Image.open` of it
  (transformers >= 5 composites transparency onto white); `<name>.drop.png`: PIL's plain
  `convert("RGB")` (alpha dropped) for comparison.  16-bit PNGs are written by a small encoder below
  because Pillow cannot save 16-bit RGB(A).
- `jpeg/<name>.jpg` + `jpeg/<name>.rgb.png`: JPEGs (4:2:0 colour, 4:4:4 colour, greyscale) and the RGB8
  that Pillow (libjpeg-turbo) decodes.
- `pipeline.safetensors` + `pipeline.json`: full `pixel_values` (1, 3, H, W) f32 from transformers'
  `CLIPImageProcessorPil` configured as Florence-2's preprocessor (size {height, width}, no crop,
  ImageNet mean/std, bicubic) for a few inputs, plus the config used.
"""

import json
import os
import struct
import zlib

import numpy as np
from PIL import Image
from safetensors.numpy import save_file
from transformers.image_transforms import convert_to_rgb
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "processor")


def synth(w, h, seed, noise=12):
    """Deterministic RGB8 test image: smooth gradients, hard black/white edges (bicubic overshoot ->
    clipping), a diagonal stripe pattern and some noise (to exercise rounding)."""
    rng = np.random.RandomState(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 255.0 * x / max(w - 1, 1)
    g = 255.0 * y / max(h - 1, 1)
    b = 127.5 + 127.5 * np.sin((x + 2 * y) * 0.7)
    img = np.stack([r, g, b], axis=-1)
    checker = ((x // 3 + y // 3) % 2)[..., None]
    block = (x < w / 2)[..., None] & (y > h / 3)[..., None]
    img = np.where(block, checker * 255.0, img)
    if noise:
        img = img + rng.randint(-noise, noise + 1, size=img.shape)
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def save_png(path, arr):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(arr).save(path, optimize=True)


def write_png_raw(path, width, height, bit_depth, color_type, rows_bytes, extra_chunks=()):
    """Minimal PNG encoder (filter 0) for colour types Pillow cannot save (16-bit RGB/RGBA/LA)."""

    def chunk(tag, data):
        c = struct.pack(">I", len(data)) + tag + data
        return c + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    raw = b"".join(b"\x00" + r for r in rows_bytes)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
    for tag, payload in extra_chunks:
        data += chunk(tag, payload)
    data += chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


RESIZE_CASES = [
    # name, (in_w, in_h), (out_w, out_h)
    ("up_both", (40, 30), (64, 48)),
    ("down_both", (200, 150), (64, 48)),
    ("up_x_down_y", (50, 120), (96, 40)),
    ("down_x_up_y_odd", (131, 17), (45, 77)),
    ("one_col", (1, 9), (16, 16)),
    ("one_row", (17, 1), (8, 8)),
    ("to_one_px", (13, 11), (1, 1)),
    ("extreme_aspect", (1000, 7), (24, 24)),
    ("identity", (64, 48), (64, 48)),
    ("only_vertical", (64, 48), (64, 20)),
    ("only_horizontal", (33, 48), (70, 48)),
    ("big_factor_down", (997, 13), (3, 5)),
    ("florence_up", (123, 97), (768, 768)),
    ("florence_down", (1030, 800), (768, 768)),  # noise-free (PNG size)
    # Pillow >= 13 runs the vertical pass first when out_h < in_h and in_h - out_h > 2 * (in_w - out_w)
    ("florence_tall", (300, 1100), (768, 768)),  # vertical first, then horizontal upscale
    ("both_down_vertical_first", (90, 200), (70, 50)),  # 150 > 2 * 20
    ("boundary_equal_horizontal_first", (100, 100), (90, 80)),  # 20 == 2 * 10: horizontal first
    ("boundary_vertical_first", (300, 200), (251, 100)),  # 100 > 98
]


def make_resize():
    cases = []
    for i, (name, (iw, ih), (ow, oh)) in enumerate(RESIZE_CASES):
        arr = synth(iw, ih, seed=100 + i, noise=0 if ow * oh > 100000 else 12)
        out = np.array(Image.fromarray(arr).resize((ow, oh), Image.BICUBIC))
        assert out.shape == (oh, ow, 3) and out.dtype == np.uint8
        save_png(os.path.join(ROOT, "resize", f"{name}.in.png"), arr)
        save_png(os.path.join(ROOT, "resize", f"{name}.out.png"), out)
        cases.append({"name": name, "in": [iw, ih], "out": [ow, oh]})
    with open(os.path.join(ROOT, "resize", "cases.json"), "w") as f:
        json.dump(cases, f, indent=1)
    # Many random small size pairs (noise images, all filters' worst case for rounding), both pass orders.
    rng = np.random.RandomState(42)
    tensors = {}
    for i in range(60):
        iw, ih, ow, oh = (int(v) for v in rng.randint(1, 48, 4))
        arr = rng.randint(0, 256, (ih, iw, 3)).astype(np.uint8)
        tensors[f"{i}.in"] = arr
        tensors[f"{i}.out"] = np.array(Image.fromarray(arr).resize((ow, oh), Image.BICUBIC))
    save_file(tensors, os.path.join(ROOT, "resize", "random.safetensors"))


def reference_rgb(path):
    """What the reference processor makes of the file before resizing (PIL backend)."""
    im = Image.open(path)
    return convert_to_rgb(im, return_numpy=True)


def make_convert():
    d = os.path.join(ROOT, "convert")
    os.makedirs(d, exist_ok=True)
    rng = np.random.RandomState(7)
    w, h = 7, 5
    rgb = rng.randint(0, 256, (h, w, 3)).astype(np.uint8)
    alpha = rng.randint(0, 256, (h, w)).astype(np.uint8)
    alpha[0, 0], alpha[0, 1], alpha[1, 0] = 0, 255, 1
    grey = rng.randint(0, 256, (h, w)).astype(np.uint8)
    names = []

    def add(name):
        path = os.path.join(d, f"{name}.png")
        ref = reference_rgb(path)
        assert ref.shape == (h, w, 3) and ref.dtype == np.uint8, (name, ref.shape, ref.dtype)
        save_png(os.path.join(d, f"{name}.rgb.png"), ref)
        drop = np.array(Image.open(path).convert("RGB"))
        save_png(os.path.join(d, f"{name}.drop.png"), drop)
        names.append({"name": name, "mode": Image.open(path).mode})

    Image.fromarray(rgb).save(os.path.join(d, "rgb8.png"))
    add("rgb8")
    Image.fromarray(np.dstack([rgb, alpha])).save(os.path.join(d, "rgba8.png"))
    add("rgba8")
    Image.fromarray(grey).save(os.path.join(d, "grey8.png"))
    add("grey8")
    Image.fromarray(np.dstack([grey, alpha]), mode="LA").save(os.path.join(d, "la8.png"))
    add("la8")
    # palette without and with transparency (tRNS)
    pal = Image.fromarray(rgb).quantize(colors=16)
    pal.save(os.path.join(d, "palette.png"))
    add("palette")
    pal.save(os.path.join(d, "palette_trns.png"), transparency=3)
    add("palette_trns")
    # RGB with a tRNS colour key (the colour of pixel (0, 0))
    key = tuple(int(v) for v in rgb[0, 0])
    Image.fromarray(rgb).save(os.path.join(d, "rgb8_trns.png"), transparency=key)
    add("rgb8_trns")
    # 1-bit and 4-bit greyscale
    bits1 = (grey > 127)
    write_png_raw(
        os.path.join(d, "grey1.png"), w, h, 1, 0, [np.packbits(r).tobytes() for r in bits1]
    )
    add("grey1")
    g4 = (grey >> 4).astype(np.uint8)
    rows4 = []
    for r in g4:
        padded = np.concatenate([r, np.zeros(len(r) % 2, np.uint8)])
        rows4.append(bytes((padded[0::2] << 4) | padded[1::2]))
    write_png_raw(os.path.join(d, "grey4.png"), w, h, 4, 0, rows4)
    add("grey4")
    # 16-bit variants (big-endian samples); values chosen across the whole range
    g16 = rng.randint(0, 65536, (h, w)).astype(">u2")
    g16[0, :4] = [0, 200, 255, 256]  # Pillow clips I;16 -> RGB at 255 (not a scale)
    write_png_raw(os.path.join(d, "grey16.png"), w, h, 16, 0, [r.tobytes() for r in g16])
    add("grey16")
    rgb16 = rng.randint(0, 65536, (h, w, 3)).astype(">u2")
    write_png_raw(os.path.join(d, "rgb16.png"), w, h, 16, 2, [r.tobytes() for r in rgb16])
    add("rgb16")
    rgba16 = rng.randint(0, 65536, (h, w, 4)).astype(">u2")
    rgba16[0, 0, 3], rgba16[0, 1, 3], rgba16[1, 0, 3] = 0, 65535, 255  # 255 -> high byte 0
    write_png_raw(os.path.join(d, "rgba16.png"), w, h, 16, 6, [r.tobytes() for r in rgba16])
    add("rgba16")
    la16 = rng.randint(0, 65536, (h, w, 2)).astype(">u2")
    write_png_raw(os.path.join(d, "la16.png"), w, h, 16, 4, [r.tobytes() for r in la16])
    add("la16")
    with open(os.path.join(d, "cases.json"), "w") as f:
        json.dump(names, f, indent=1)


def make_jpeg():
    d = os.path.join(ROOT, "jpeg")
    os.makedirs(d, exist_ok=True)
    arr = synth(61, 45, seed=5)
    cases = []
    for name, kwargs, im in [
        ("color420", {"quality": 90, "subsampling": 2}, Image.fromarray(arr)),
        ("color444", {"quality": 95, "subsampling": 0}, Image.fromarray(arr)),
        ("grey", {"quality": 90}, Image.fromarray(arr[..., 1])),
    ]:
        path = os.path.join(d, f"{name}.jpg")
        im.save(path, **kwargs)
        save_png(os.path.join(d, f"{name}.rgb.png"), reference_rgb(path))
        cases.append(name)
    with open(os.path.join(d, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1)


def make_pipeline():
    cfg = {
        "do_resize": True,
        "size": {"height": 24, "width": 32},
        "resample": 3,
        "do_center_crop": False,
        "do_rescale": True,
        "rescale_factor": 0.00392156862745098,
        "do_normalize": True,
        "image_mean": [0.485, 0.456, 0.406],
        "image_std": [0.229, 0.224, 0.225],
        "do_convert_rgb": True,
    }
    proc = CLIPImageProcessorPil(**cfg)
    tensors = {}
    inputs = {
        "synth_down": os.path.join(ROOT, "resize", "down_both.in.png"),
        "synth_up": os.path.join(ROOT, "resize", "up_both.in.png"),
        "rgba8": os.path.join(ROOT, "convert", "rgba8.png"),
        "jpeg_color420": os.path.join(ROOT, "jpeg", "color420.jpg"),
    }
    for name, path in inputs.items():
        pv = proc(images=Image.open(path), return_tensors="np")["pixel_values"]
        assert pv.shape == (1, 3, 24, 32) and pv.dtype == np.float32, (pv.shape, pv.dtype)
        tensors[name] = np.ascontiguousarray(pv)
    save_file(tensors, os.path.join(ROOT, "pipeline.safetensors"))
    rel = {k: os.path.relpath(v, ROOT) for k, v in inputs.items()}
    with open(os.path.join(ROOT, "pipeline.json"), "w") as f:
        json.dump({"preprocessor_config": cfg, "inputs": rel}, f, indent=1)


if __name__ == "__main__":
    make_resize()
    make_convert()
    make_jpeg()
    make_pipeline()
    total = 0
    for dp, _, fs in os.walk(ROOT):
        total += sum(os.path.getsize(os.path.join(dp, f)) for f in fs)
    print(f"wrote {ROOT} ({total / 1e6:.2f} MB)")
