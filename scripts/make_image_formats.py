#!/usr/bin/env python3
"""Image-format fixtures for the browser image tests (scripts/npm/loading_test.mjs), made with Pillow from
tests/fixtures/images/scene.png and scene.jpg. Run by hand (needs Pillow with WebP and AVIF); deterministic.

Writes tests/fixtures/images/formats/:
- scene.webp (lossless), scene.bmp: the same pixels as scene.png;
- scene.gif: two frames (scene.png quantised to 256 colours, then its inverse); scene.gif.png is Pillow's
  decode of the first frame (what the reference sees: `Image.open(f).convert("RGB")`);
- scene.avif + scene.avif.png: an AVIF and Pillow's decode of it;
- scene.jpg.png: Pillow's (libjpeg-turbo) decode of scene.jpg;
- scene_exif6.jpg: scene.jpg with an EXIF APP1 segment (Orientation = 6) inserted after APP0, scan data
  untouched; scene_exif6.png: `ImageOps.exif_transpose(Image.open(f)).convert("RGB")`, as the reference's
  image loader returns it.
"""
import os
import struct

from PIL import Image, ImageOps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "tests", "fixtures", "images")
OUT = os.path.join(SRC, "formats")


def exif_app1(orientation):
    tiff = b"MM\x00\x2a\x00\x00\x00\x08" + struct.pack(">HHHIHHI", 1, 0x0112, 3, 1, orientation, 0, 0)
    body = b"Exif\x00\x00" + tiff
    return b"\xff\xe1" + struct.pack(">H", len(body) + 2) + body


def main():
    os.makedirs(OUT, exist_ok=True)
    scene = Image.open(os.path.join(SRC, "scene.png")).convert("RGB")
    scene.save(os.path.join(OUT, "scene.webp"), lossless=True, quality=100, method=6)
    scene.save(os.path.join(OUT, "scene.bmp"))
    assert Image.open(os.path.join(OUT, "scene.webp")).convert("RGB").tobytes() == scene.tobytes()

    q = scene.quantize(256, dither=Image.Dither.NONE)
    inv = ImageOps.invert(scene).quantize(256, dither=Image.Dither.NONE)
    q.save(os.path.join(OUT, "scene.gif"), save_all=True, append_images=[inv], duration=100, loop=0)
    Image.open(os.path.join(OUT, "scene.gif")).convert("RGB").save(os.path.join(OUT, "scene.gif.png"))

    scene.save(os.path.join(OUT, "scene.avif"), quality=90)
    Image.open(os.path.join(OUT, "scene.avif")).convert("RGB").save(os.path.join(OUT, "scene.avif.png"))

    Image.open(os.path.join(SRC, "scene.jpg")).convert("RGB").save(os.path.join(OUT, "scene.jpg.png"))

    jpg = open(os.path.join(SRC, "scene.jpg"), "rb").read()
    assert jpg[:4] == b"\xff\xd8\xff\xe0"
    at = 4 + struct.unpack(">H", jpg[4:6])[0]
    tagged = jpg[:at] + exif_app1(6) + jpg[at:]
    with open(os.path.join(OUT, "scene_exif6.jpg"), "wb") as f:
        f.write(tagged)
    seen = ImageOps.exif_transpose(Image.open(os.path.join(OUT, "scene_exif6.jpg"))).convert("RGB")
    assert seen.size == (scene.height, scene.width), seen.size
    seen.save(os.path.join(OUT, "scene_exif6.png"))
    for n in sorted(os.listdir(OUT)):
        print(n, os.path.getsize(os.path.join(OUT, n)))


if __name__ == "__main__":
    main()
