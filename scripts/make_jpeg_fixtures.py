#!/usr/bin/env python3
"""JPEG fixtures for the native decoder's exactness test (tests/host/processor_image.rs,
`jpeg_decodes_exactly_like_pillow`), made with Pillow from crops of tests/fixtures/images/scene.png. Run by
hand; deterministic (the same Pillow gives the same bytes).

Writes tests/fixtures/images/jpeg/: for every case NAME, NAME.jpg (encoded by Pillow) and NAME.png, the
pixels the reference sees: `Image.open(f).convert("RGB")` (libjpeg-turbo, islow IDCT, fancy upsampling),
with `ImageOps.exif_transpose` first for the EXIF-tagged case. cases.json lists the names.

Cases: 4:2:0, 4:2:2 and 4:4:4 colour; greyscale; progressive (4:2:0 and greyscale); restart markers (every
3 MCUs, and every MCU row); odd sizes (37x23: partial MCUs at the right and bottom edges, in 4:2:0, 4:2:2
and progressive); CMYK (Pillow writes an Adobe APP14 segment and inverted samples; `convert("RGB")` is
Pillow's own CMYK -> RGB formula); and an odd-size 4:2:0 image with an EXIF orientation 8 (rotate 90 CCW
to display).
"""
import json
import os
import struct

from PIL import Image, ImageOps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "tests", "fixtures", "images")
OUT = os.path.join(SRC, "jpeg")


def exif_app1(orientation):
    tiff = b"MM\x00\x2a\x00\x00\x00\x08" + struct.pack(">HHHIHHI", 1, 0x0112, 3, 1, orientation, 0, 0)
    body = b"Exif\x00\x00" + tiff
    return b"\xff\xe1" + struct.pack(">H", len(body) + 2) + body


def main():
    os.makedirs(OUT, exist_ok=True)
    scene = Image.open(os.path.join(SRC, "scene.png")).convert("RGB")
    assert scene.size == (83, 61), scene.size
    big = scene.crop((8, 6, 72, 54))  # 64x48
    odd = scene.crop((21, 17, 58, 40))  # 37x23
    cases = [
        ("s420", big, {"quality": 85, "subsampling": 2}),
        ("s422", big, {"quality": 85, "subsampling": 1}),
        ("s444", big, {"quality": 85, "subsampling": 0}),
        ("grey", big.convert("L"), {"quality": 85}),
        ("progressive420", big, {"quality": 85, "subsampling": 2, "progressive": True}),
        ("progressive_grey", big.convert("L"), {"quality": 85, "progressive": True}),
        ("restart_blocks420", big, {"quality": 85, "subsampling": 2, "restart_marker_blocks": 3}),
        ("restart_rows422", big, {"quality": 85, "subsampling": 1, "restart_marker_rows": 1}),
        ("odd420", odd, {"quality": 90, "subsampling": 2}),
        ("odd422", odd, {"quality": 90, "subsampling": 1}),
        ("odd_progressive420", odd, {"quality": 90, "subsampling": 2, "progressive": True}),
        ("cmyk", big.convert("CMYK"), {"quality": 85}),
    ]
    names = []
    for name, im, kwargs in cases:
        path = os.path.join(OUT, f"{name}.jpg")
        im.save(path, "JPEG", **kwargs)
        Image.open(path).convert("RGB").save(os.path.join(OUT, f"{name}.png"))
        names.append(name)

    # EXIF orientation 8 inserted after the JFIF APP0 segment of odd420.jpg (scan data untouched).
    jpg = open(os.path.join(OUT, "odd420.jpg"), "rb").read()
    assert jpg[:4] == b"\xff\xd8\xff\xe0"
    at = 4 + struct.unpack(">H", jpg[4:6])[0]
    path = os.path.join(OUT, "odd420_exif8.jpg")
    with open(path, "wb") as f:
        f.write(jpg[:at] + exif_app1(8) + jpg[at:])
    seen = ImageOps.exif_transpose(Image.open(path)).convert("RGB")
    assert seen.size == (odd.height, odd.width), seen.size
    seen.save(os.path.join(OUT, "odd420_exif8.png"))
    names.append("odd420_exif8")

    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump(names, f, indent=1)
        f.write("\n")
    for n in sorted(os.listdir(OUT)):
        print(n, os.path.getsize(os.path.join(OUT, n)))


if __name__ == "__main__":
    main()
