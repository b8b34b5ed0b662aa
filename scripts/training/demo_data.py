"""Synthetic shapes-and-text scenes with Florence-2 targets, for scripts/training/train_demo_model.py.

Every scene is a pure function of (split seed, index): coloured shapes (distinct colours, one per 3x3 cell
by centre, neighbours may overlap), 0-2 rendered words or short lines (DejaVu fonts, some rotated) and a busy
background. The targets use Florence-2's own output format (1000 location bins per axis). A scene whose
target for some task would repeat a token trigram is redrawn, so that the reference generation default
`no_repeat_ngram_size = 3` never blocks a ground-truth answer.

Fonts: Debian's fonts-dejavu-core (/usr/share/fonts/truetype/dejavu; `apt-get install fonts-dejavu-core`).
"""

import math
import random

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

FONT_DIR = "/usr/share/fonts/truetype/dejavu/"
FONTS = ["DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf"]

SHAPES = ["circle", "square", "triangle", "star", "diamond", "hexagon"]
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (30, 70, 220),
    "yellow": (245, 215, 30),
    "orange": (245, 135, 20),
    "purple": (140, 40, 180),
    "white": (250, 250, 250),
    "black": (15, 15, 15),
}
TEXT_COLOURS = [(0, 0, 0), (255, 255, 255), (20, 20, 90)]
WORDS = (
    "OPEN SALE STOP EXIT CAFE PARK HOTEL TAXI BUS FOOD BOOK SHOP BANK PIZZA MUSIC LOVE HELLO WORLD "
    "NORTH SOUTH EAST WEST CITY ZONE GAME TIME DATA CODE RIVER HOME SHOES TEA"
).split()
# Text height (the font size) as a fraction of the image side, and what happens to a two-word line too wide for
# the image: "shorten" keeps its first word, "skip" drops the item. The first stages of the committed model saw
# (0.075, 0.13) and "skip"; set_text_style() selects them (train_demo_model.py --text-size, --line-fit).
TEXT_SIZE = (0.11, 0.17)
LINE_FIT = "shorten"
ROWS = ["top", "middle", "bottom"]
COLS = ["left", "center", "right"]

# Florence-2 task tokens this dataset covers (the processor turns them into the prompts)
TASKS = [
    "<OD>",
    "<CAPTION>",
    "<DETAILED_CAPTION>",
    "<OCR>",
    "<OCR_WITH_REGION>",
    "<CAPTION_TO_PHRASE_GROUNDING>",
    "<REGION_TO_CATEGORY>",
    "<REGION_TO_DESCRIPTION>",
    "<REGION_TO_OCR>",
]
TEXT_TASKS = {"<OCR>", "<OCR_WITH_REGION>", "<REGION_TO_OCR>"}


def set_text_style(size, line_fit):
    global TEXT_SIZE, LINE_FIT
    if line_fit not in ("shorten", "skip") or not 0 < size[0] <= size[1] < 0.5:
        raise ValueError(f"text style {size} {line_fit}")
    TEXT_SIZE, LINE_FIT = tuple(size), line_fit


def cell_name(cell):
    r, c = divmod(cell, 3)
    if r == 1 and c == 1:
        return "center"
    if r == 1:
        return COLS[c]
    if c == 1:
        return ROWS[r]
    return f"{ROWS[r]} {COLS[c]}"


def vocabulary_words():
    """Every word form the targets and prompts use (for the tokenizer corpus)."""
    words = set(SHAPES) | set(COLOURS) | set(ROWS) | set(COLS)
    words |= {w for w in WORDS} | {w.capitalize() for w in WORDS}
    words |= set("a an the and with some text The image shows at A Text shapes shape reads small large".split())
    words |= {"one", "two", "three", "four"}
    return sorted(words)


# ----------------------------------------------------------------------------------------------------
# Geometry
# ----------------------------------------------------------------------------------------------------


def shape_polygon(kind, cx, cy, w, h):
    """Vertices of a shape in a w x h box centred at (cx, cy); circles return None (ellipse)."""
    if kind == "circle":
        return None
    if kind == "square":
        pts = [(-1, -1), (1, -1), (1, 1), (-1, 1)]
    elif kind == "triangle":
        pts = [(0, -1), (1, 1), (-1, 1)]
    elif kind == "diamond":
        pts = [(0, -1), (1, 0), (0, 1), (-1, 0)]
    elif kind == "hexagon":
        pts = [(math.cos(a), math.sin(a)) for a in (math.pi / 3 * i for i in range(6))]
    elif kind == "star":
        pts = []
        for i in range(10):
            a = -math.pi / 2 + math.pi / 5 * i
            r = 1.0 if i % 2 == 0 else 0.45
            pts.append((r * math.cos(a), r * math.sin(a)))
        ys = [p[1] for p in pts]
        y0, y1 = min(ys), max(ys)  # stretch to fill the box vertically
        pts = [(x, -1 + 2 * (y - y0) / (y1 - y0)) for x, y in pts]
    else:
        raise ValueError(kind)
    return [(cx + x * w / 2, cy + y * h / 2) for x, y in pts]


def quantize(v, size):
    return max(0, min(999, int(math.floor(v / (size / 1000.0)))))


def loc_box(box, w, h):
    x0, y0, x1, y1 = box
    return "".join(f"<loc_{b}>" for b in (quantize(x0, w), quantize(y0, h), quantize(x1, w), quantize(y1, h)))


def loc_quad(quad, w, h):
    return "".join(f"<loc_{quantize(v, w if i % 2 == 0 else h)}>" for i, v in enumerate(quad))


def box_iou(a, b):
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    ua = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / ua if ua > 0 else 0.0


def intersects(a, b, margin=0.0):
    return not (a[2] + margin <= b[0] or b[2] + margin <= a[0] or a[3] + margin <= b[1] or b[3] + margin <= a[1])


# ----------------------------------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------------------------------


def background(rs, w, h):
    """Busy but muted: a two-colour gradient, noise, thin lines, specks and sometimes stripes."""
    c0 = rs.uniform(70, 190, 3)
    c1 = rs.uniform(70, 190, 3)
    ang = rs.uniform(0, 2 * math.pi)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    t = (math.cos(ang) * xx / w + math.sin(ang) * yy / h + 1.0) / 2.0
    img = c0[None, None] * (1 - t[..., None]) + c1[None, None] * t[..., None]
    if rs.rand() < 0.4:
        period = rs.uniform(6, 16)
        img += 18 * np.sign(np.sin((xx * math.cos(ang + 1) + yy * math.sin(ang + 1)) / period * math.pi))[..., None]
    img += rs.normal(0, rs.uniform(4, 14), (h, w, 3))
    im = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")
    d = ImageDraw.Draw(im)
    for _ in range(rs.randint(3, 12)):
        col = tuple(int(v) for v in rs.uniform(60, 200, 3))
        pts = [(float(rs.uniform(0, w)), float(rs.uniform(0, h))) for _ in range(2)]
        d.line(pts, fill=col, width=int(rs.randint(1, 3)))
    for _ in range(rs.randint(10, 40)):
        x, y = float(rs.uniform(0, w)), float(rs.uniform(0, h))
        r = float(rs.uniform(0.5, 2.0))
        d.ellipse([x - r, y - r, x + r, y + r], fill=tuple(int(v) for v in rs.uniform(40, 220, 3)))
    return im


def text_layer(text, font_file, size, colour, angle):
    """RGBA image of the text, rotated by `angle` degrees (counter-clockwise), and the text quad in it
    (top-left, top-right, bottom-right, bottom-left of the ink box)."""
    font = ImageFont.truetype(FONT_DIR + font_file, size)
    l, t, r, b = font.getbbox(text)
    pad = 2
    tw, th = r - l, b - t
    lay = Image.new("RGBA", (tw + 2 * pad, th + 2 * pad), (0, 0, 0, 0))
    ImageDraw.Draw(lay).text((pad - l, pad - t), text, font=font, fill=colour + (255,))
    corners = [(pad, pad), (pad + tw, pad), (pad + tw, pad + th), (pad, pad + th)]
    if angle == 0:
        return lay, corners
    cx, cy = lay.width / 2, lay.height / 2
    rot = lay.rotate(angle, resample=Image.BICUBIC, expand=True)
    ncx, ncy = rot.width / 2, rot.height / 2
    a = math.radians(angle)
    ca, sa = math.cos(a), math.sin(a)
    quad = [(ncx + ca * (x - cx) + sa * (y - cy), ncy - sa * (x - cx) + ca * (y - cy)) for x, y in corners]
    return rot, quad


# ----------------------------------------------------------------------------------------------------
# Scenes
# ----------------------------------------------------------------------------------------------------


def sample_scene(rs, size):
    """Layout only (no pixels): shapes and text items with their geometry."""
    w = h = size
    cw = w / 3.0
    n_shapes = int(rs.choice([1, 2, 2, 3, 3, 4]))
    cells = sorted(rs.choice(9, n_shapes, replace=False).tolist())
    colours = rs.choice(list(COLOURS), n_shapes, replace=False).tolist()
    shapes = []
    for cell, colour in zip(cells, colours):
        r, c = divmod(cell, 3)
        kind = SHAPES[rs.randint(len(SHAPES))]
        s = rs.uniform(0.10, 0.40) * w
        aspect = rs.uniform(0.8, 1.25) if kind in ("triangle", "diamond", "hexagon", "star") else 1.0
        sw, sh = s * math.sqrt(aspect), s / math.sqrt(aspect)
        cx = (c + 0.5) * cw + rs.uniform(-0.3, 0.3) * cw
        cy = (r + 0.5) * cw + rs.uniform(-0.3, 0.3) * cw
        cx = min(max(cx, sw / 2 + 1), w - sw / 2 - 1)
        cy = min(max(cy, sh / 2 + 1), h - sh / 2 - 1)
        poly = shape_polygon(kind, cx, cy, sw, sh)
        if poly is None:
            box = (cx - sw / 2, cy - sh / 2, cx + sw / 2, cy + sh / 2)
        else:
            xs, ys = [p[0] for p in poly], [p[1] for p in poly]
            box = (min(xs), min(ys), max(xs), max(ys))
        shapes.append(dict(kind=kind, colour=colour, cell=cell, box=box, poly=poly,
                           size="large" if s >= 0.25 * w else "small"))
    texts = []
    n_text = int(rs.choice([0, 1, 1, 2]))
    for _ in range(n_text):
        nw = 1 if rs.rand() < 0.6 else 2
        words = [WORDS[rs.randint(len(WORDS))] for _ in range(nw)]
        if rs.rand() < 0.35:
            words = [x.capitalize() for x in words]
        text = " ".join(words)
        font = FONTS[rs.randint(len(FONTS))]
        fsize = int(rs.randint(int(TEXT_SIZE[0] * h), int(TEXT_SIZE[1] * h) + 1))
        angle = 0.0 if rs.rand() < 0.65 else float(rs.uniform(-25, 25))
        colour = TEXT_COLOURS[rs.randint(len(TEXT_COLOURS))]
        lay, quad = text_layer(text, font, fsize, colour, angle)
        if LINE_FIT == "shorten" and nw == 2 and (lay.width >= w - 2 or lay.height >= h - 2):
            text = words[0]
            lay, quad = text_layer(text, font, fsize, colour, angle)
        if lay.width >= w - 2 or lay.height >= h - 2:
            continue
        for _try in range(20):
            px = int(rs.randint(0, w - lay.width))
            py = int(rs.randint(0, h - lay.height))
            q = [(x + px, y + py) for x, y in quad]
            xs, ys = [p[0] for p in q], [p[1] for p in q]
            box = (min(xs), min(ys), max(xs), max(ys))
            others = [s["box"] for s in shapes] + [t["box"] for t in texts]
            if all(not intersects(box, o, 2) for o in others):
                cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
                cell = min(int(cy // cw), 2) * 3 + min(int(cx // cw), 2)
                texts.append(dict(text=text, font=font, fsize=fsize, angle=angle, colour=colour, pos=(px, py),
                                  quad=[v for p in q for v in p], box=box, cell=cell))
                break
    texts.sort(key=lambda t: (t["cell"], t["box"][1], t["box"][0]))
    return dict(size=(w, h), shapes=shapes, texts=texts)


def label_maps(scene, n):
    """(2, n, n) int64: shape class (0 none, 1.. SHAPES, len(SHAPES) + 1 text) and colour (0 none, 1.. COLOURS)
    at the centres of an n x n grid, topmost object first (shapes in drawing order, then text)."""
    w, h = scene["size"]
    cls = Image.new("L", (w, h), 0)
    col = Image.new("L", (w, h), 0)
    dc, dk = ImageDraw.Draw(cls), ImageDraw.Draw(col)
    names = list(COLOURS)
    for s in scene["shapes"]:
        for d, v in ((dc, SHAPES.index(s["kind"]) + 1), (dk, names.index(s["colour"]) + 1)):
            if s["poly"] is None:
                d.ellipse(list(s["box"]), fill=v)
            else:
                d.polygon(s["poly"], fill=v)
    for t in scene["texts"]:
        q = [(t["quad"][i], t["quad"][i + 1]) for i in range(0, 8, 2)]
        dc.polygon(q, fill=len(SHAPES) + 1)
        dk.polygon(q, fill=0)
    idx = ((np.arange(n) + 0.5) * (h / n)).astype(int)
    a = np.asarray(cls)[idx][:, idx]
    b = np.asarray(col)[idx][:, idx]
    return np.stack([a, b]).astype(np.int64)


def render(scene, rs):
    w, h = scene["size"]
    im = background(rs, w, h)
    d = ImageDraw.Draw(im)
    for s in scene["shapes"]:
        col = COLOURS[s["colour"]]
        outline = tuple(max(0, v - 60) for v in col) if rs.rand() < 0.5 else None
        if s["poly"] is None:
            d.ellipse(list(s["box"]), fill=col, outline=outline)
        else:
            d.polygon(s["poly"], fill=col, outline=outline)
    for t in scene["texts"]:
        lay, _ = text_layer(t["text"], t["font"], t["fsize"], t["colour"], t["angle"])
        im.paste(lay, t["pos"], lay)
    if rs.rand() < 0.3:
        im = im.filter(ImageFilter.GaussianBlur(radius=float(rs.uniform(0.3, 0.8))))
    return im


# ----------------------------------------------------------------------------------------------------
# Targets (Florence-2 output format)
# ----------------------------------------------------------------------------------------------------


def article(word):
    return "an" if word[0] in "aeiou" else "a"


def shape_phrase(s):
    return f"{article(s['colour'])} {s['colour']} {s['kind']}"


def join_list(items):
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]


def caption(scene):
    by_x = sorted(scene["shapes"], key=lambda s: (s["box"][0] + s["box"][2]))
    cap = join_list([shape_phrase(s) for s in by_x])
    if scene["texts"]:
        cap += " with some text"
    return cap[0].upper() + cap[1:] + "."


def detailed_caption(scene):
    n = len(scene["shapes"])
    num = ["one", "two", "three", "four"][n - 1]
    parts = [f"{s['size']} {s['colour']} {s['kind']} at {cell_name(s['cell'])}" for s in scene["shapes"]]
    out = f"The image shows {num} shape{'s' if n > 1 else ''}: {join_list(parts)}."
    if scene["texts"]:
        out += " Text: " + join_list([f"{t['text']} at {cell_name(t['cell'])}" for t in scene["texts"]]) + "."
    return out


def targets(scene, rs):
    """{task: (text input, target text, extra)} for every task the scene supports."""
    w, h = scene["size"]
    shapes, texts = scene["shapes"], scene["texts"]
    out = {}
    out["<OD>"] = ("", "".join(s["kind"] + loc_box(s["box"], w, h) for s in shapes), None)
    out["<CAPTION>"] = ("", caption(scene), None)
    out["<DETAILED_CAPTION>"] = ("", detailed_caption(scene), None)
    # grounding: 1-3 shapes, left to right, as the caption names them
    by_x = sorted(shapes, key=lambda s: (s["box"][0] + s["box"][2]))
    k = int(rs.randint(1, min(3, len(by_x)) + 1))
    pick = sorted(rs.choice(len(by_x), k, replace=False).tolist())
    chosen = [by_x[i] for i in pick]
    phrase_in = join_list([shape_phrase(s) for s in chosen])
    out["<CAPTION_TO_PHRASE_GROUNDING>"] = (
        phrase_in,
        "".join(shape_phrase(s) + loc_box(s["box"], w, h) for s in chosen),
        [(shape_phrase(s), s["box"]) for s in chosen],
    )
    s = shapes[rs.randint(len(shapes))]
    region = loc_box(s["box"], w, h)
    out["<REGION_TO_CATEGORY>"] = (region, s["kind"], None)
    out["<REGION_TO_DESCRIPTION>"] = (region, f"{article(s['size'])} {s['size']} {s['colour']} {s['kind']}", None)
    if texts:
        out["<OCR>"] = ("", " ".join(t["text"] for t in texts), None)
        out["<OCR_WITH_REGION>"] = ("", "".join(t["text"] + loc_quad(t["quad"], w, h) for t in texts), None)
        t = texts[rs.randint(len(texts))]
        out["<REGION_TO_OCR>"] = (loc_box(t["box"], w, h), t["text"], None)
    return out


def has_repeated_trigram(ids):
    seen = set()
    for i in range(len(ids) - 2):
        g = tuple(ids[i:i + 3])
        if g in seen:
            return True
        seen.add(g)
    return False


def make_example(seed, index, size, tokenizer=None):
    """Scene, image and targets for one (seed, index); redraws the scene while a target's token ids
    (decoder start + ids, as the no-repeat rule sees them) repeat a trigram."""
    for attempt in range(50):
        rs = np.random.RandomState([seed, index, attempt])
        scene = sample_scene(rs, size)
        tg = targets(scene, rs)
        if tokenizer is None or not any(
            has_repeated_trigram([2] + tokenizer.encode(t).ids) for _, t, _ in tg.values()
        ):
            img = render(scene, rs)
            return scene, img, tg
    raise RuntimeError(f"no scene without repeated trigrams for seed {seed} index {index}")


def corpus_lines(prompts):
    """Text for the tokenizer's BPE: prompts, every word form with and without a leading space, templates."""
    words = vocabulary_words()
    lines = list(prompts) * 3
    for wd in words:
        lines += [wd, " " + wd, wd + ".", wd + ",", wd + ":"] * 2
    lines += ["The image shows two shapes: small red circle at top left.", 'Text: OPEN at bottom right.']
    rs = random.Random(0)
    for _ in range(200):
        lines.append(" ".join(rs.choice(words) for _ in range(8)))
    return lines
