#!/usr/bin/env python3
"""Convert a Florence-2 checkpoint into a safetensors model directory that florence2-wasm loads.

Microsoft's repositories ship pickled `pytorch_model.bin` files; no browser should unpickle them. This
script reads such a file *without running pickled code* (`torch.load(..., weights_only=True)`: only
tensors and plain containers are accepted, anything else is refused), or any safetensors checkpoint, in
any of the three layouts the package loads (HF-native `model.vision_tower.*`, original Microsoft
`vision_tower.*` / `language_model.*`, mlx-community channels-last bf16), and writes:

  OUT/model.safetensors                     (or model-0000i-of-0000n.safetensors + model.safetensors.index.json
                                             with --shard-size)
  OUT/config.json                           copied (required: it defines the architecture)
  OUT/tokenizer.json                        copied, or built from vocab.json + merges.txt
  OUT/preprocessor_config.json              copied, or Florence-2's defaults (768x768, ImageNet mean/std)
  OUT/generation_config.json                copied, or Florence-2's defaults (3 beams, no_repeat_ngram 3)
  (+ tokenizer_config.json, processor_config.json when present; never any .py file)

Tensor names and layouts are kept as they are (the package maps all three layouts itself); the safetensors
`format` metadata is kept (`mlx` for mlx conversions).

--dtype q8 / q4 writes a quantized checkpoint (format `florence2-wasm-block`, the engine's resident q8/q4
format, so the loader streams it straight into GPU buffers; any resident dtype can still be chosen at load,
the others dequantize). Only the matrix weights are quantized (rank-2 `*.weight` tensors of the linears, the
shared embedding and LM head, except position tables, whose rows are whole 32-weight blocks); every other
tensor keeps its dtype, or takes --other-dtype (computed from the format for Florence-2-base's tensors:
q8 271 MB with the other tensors in f32, about 254 MB with --other-dtype f16; q4 159 MB / about 142 MB). A quantized matrix NAME (N, K) becomes ONE tensor `NAME.qweight`, dtype U8, shape
(N, row_bytes), each row exactly the engine's GPU row layout:
  [quants][K/32 float16 scales, little-endian][zero padding to a multiple of 16 bytes]
  - blocks of 32 weights along K; scale d = max|w| / QMAX rounded to float16 (QMAX 127 for q8, 7 for q4;
    +-inf scales become 65504), q = round-half-away-from-zero(w / d) clamped to [-QMAX, QMAX] (float32
    arithmetic; non-finite weights count as 0); the weight stands for d * q;
  - q8: K bytes, q as two's-complement int8; q4: K/2 bytes, weight k in byte k/2 (low nibble for even k,
    high for odd), stored as q + 8;
  - row_bytes = K*bits/8 + ceil(K/16 / 16) * 16 (816 for q8, 432 for q4 at K = 768).
This is bit for bit what the engine's own quantizer (src/quant.rs) makes from a float checkpoint loaded
with `dtype: "q8"`/`"q4"`. config.json gains
  "quantization": {"format": "florence2-wasm-block", "bits": 8|4, "block_size": 32, "scale_dtype": "float16",
                   "tensors": [the quantized NAMEs]} Tied copies of the shared embedding
(`*embed_tokens.weight`, `lm_head.weight` equal to `*shared.weight`) are dropped unless --keep-tied: the
package ties the LM head to the shared embedding itself.

Usage:
  python3 scripts/convert_checkpoint.py SRC OUT [--dtype keep|f32|f16|bf16|q8|q4] [--other-dtype keep|f16|..]
                                        [--shard-size 500MB]
                                        [--tokenizer FILE] [--keep-tied] [--force] [--no-verify]
SRC is a model directory (pytorch_model.bin, pytorch_model.bin.index.json, model.safetensors or
model.safetensors.index.json, configs beside it) or one weights file (configs looked for beside it).
Serve the result with `scripts/serve.sh --model-dir OUT` and open the demo with `?model=/model/`.

Needs torch and safetensors (`pip install torch safetensors`; `tokenizers`/`transformers` only to build a
tokenizer.json from vocab.json + merges.txt).
"""
import argparse
import json
import os
import re
import shutil
import sys

try:
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file
except ImportError as e:  # pragma: no cover
    sys.exit(f"convert_checkpoint: needs torch and safetensors ({e})")

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
QBITS = {"q8": 8, "q4": 4}
QUANT_FORMAT = "florence2-wasm-block"
QBLOCK = 32
QWEIGHT_SUFFIX = ".qweight"
F16_MAX = 65504.0
SHARD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
EXTRA_FILES = ["tokenizer_config.json", "processor_config.json"]

DEFAULT_PREPROCESSOR = {
    "do_convert_rgb": True,
    "do_resize": True,
    "size": {"height": 768, "width": 768},
    "resample": 3,
    "do_center_crop": False,
    "crop_size": {"height": 768, "width": 768},
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.485, 0.456, 0.406],
    "image_std": [0.229, 0.224, 0.225],
    "image_processor_type": "CLIPImageProcessor",
    "image_seq_length": 577,
}
DEFAULT_GENERATION = {
    "bos_token_id": 0,
    "pad_token_id": 1,
    "eos_token_id": 2,
    "decoder_start_token_id": 2,
    "forced_bos_token_id": 0,
    "forced_eos_token_id": 2,
    "num_beams": 3,
    "no_repeat_ngram_size": 3,
    "early_stopping": True,
}


class ConvertError(Exception):
    pass


def parse_size(s):
    """'500MB', '1.5GB', '64KiB', '123456' -> bytes (decimal units; KiB/MiB/GiB binary)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?\s*", s, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {s!r} (e.g. 500MB, 2GB, 64KiB)")
    unit = (m.group(2) or "B").upper()
    mult = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}[unit]
    n = int(float(m.group(1)) * mult)
    if n <= 0:
        raise argparse.ArgumentTypeError("the shard size must be positive")
    return n


# ------------------------------------------------------------------------------------------ reading

def load_bin(path):
    """A pickled PyTorch state dict, loaded with weights_only=True: no code from the file runs."""
    try:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e):
                raise
            obj = torch.load(path, map_location="cpu", weights_only=True)  # legacy (non-zip) format
    except Exception as e:  # noqa: BLE001 - torch raises UnpicklingError, RuntimeError, ...
        raise ConvertError(
            f"{path}: refused or unreadable with torch.load(weights_only=True) (it may contain pickled code, "
            f"which this script never runs): {e}"
        ) from None
    for key in ("state_dict", "model", "module"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict) and not torch.is_tensor(obj[key]):
            obj = obj[key]
    if not isinstance(obj, dict) or not obj:
        raise ConvertError(f"{path}: not a state dict (a dict of tensors)")
    bad = [k for k, v in obj.items() if not isinstance(k, str) or not torch.is_tensor(v)]
    if bad:
        raise ConvertError(f"{path}: entries that are not named tensors: {bad[:5]}")
    return dict(obj), {"format": "pt"}


def load_safetensors(path):
    tensors = {}
    with safe_open(path, framework="pt") as f:
        meta = dict(f.metadata() or {})
        for k in f.keys():
            tensors[k] = f.get_tensor(k)
    return tensors, meta


def load_index(path):
    with open(path) as f:
        index = json.load(f)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ConvertError(f"{path}: no weight_map")
    files = sorted(set(weight_map.values()))
    for name in files:
        if not isinstance(name, str) or not SHARD_NAME.match(name) or ".." in name:
            raise ConvertError(f"{path}: unsafe shard file name {name!r}")
    tensors, meta = {}, {}
    for name in files:
        shard = os.path.join(os.path.dirname(path), name)
        t, m = load_safetensors(shard) if name.endswith(".safetensors") else load_bin(shard)
        meta = meta or m
        for k, v in t.items():
            if weight_map.get(k) == name:
                tensors[k] = v
    missing = set(weight_map) - set(tensors)
    if missing:
        raise ConvertError(f"{path}: tensors listed in the index but absent from their shards: {sorted(missing)[:5]}")
    return tensors, meta


def find_weights(src):
    if os.path.isfile(src):
        return src
    for name in ("model.safetensors.index.json", "model.safetensors", "pytorch_model.bin.index.json", "pytorch_model.bin"):
        p = os.path.join(src, name)
        if os.path.isfile(p):
            return p
    raise ConvertError(f"{src}: no model.safetensors[.index.json] or pytorch_model.bin[.index.json]")


def load_weights(path):
    if path.endswith(".index.json"):
        return load_index(path)
    if path.endswith(".safetensors"):
        return load_safetensors(path)
    return load_bin(path)


def layout_of(tensors, meta):
    keys = list(tensors)
    if any(k.startswith("model.vision_tower.") for k in keys):
        return "hf-native"
    conv = tensors.get("vision_tower.convs.0.proj.weight")
    if meta.get("format") == "mlx" or (conv is not None and conv.dim() == 4 and conv.shape[-1] == 3):
        return "mlx (original names, channels-last convs)"
    if any(k.startswith("vision_tower.") or k.startswith("language_model.") for k in keys):
        return "original"
    raise ConvertError("not a Florence-2 checkpoint: no vision_tower / language_model tensors")


# ------------------------------------------------------------------------------------------ converting

def drop_tied(tensors):
    """Drop embed_tokens / lm_head copies that equal the shared embedding. Returns the dropped names."""
    shared = [k for k in tensors if k.endswith("shared.weight")]
    if len(shared) != 1:
        return []
    s = tensors[shared[0]]
    dropped = []
    for k in list(tensors):
        if k == shared[0] or not (k.endswith("embed_tokens.weight") or k.endswith("lm_head.weight")):
            continue
        t = tensors[k]
        if t.shape == s.shape and t.dtype == s.dtype and torch.equal(t, s):
            del tensors[k]
            dropped.append(k)
    return dropped


def convert_dtype(tensors, dtype):
    if dtype is None:
        return tensors
    out = {}
    for k, t in tensors.items():
        if t.is_floating_point() and t.dtype != dtype:
            if dtype == torch.float16:
                big = t.abs().max().item() if t.numel() else 0.0
                if big > F16_MAX:
                    raise ConvertError(f"{k}: values up to {big:g} overflow f16 (max {F16_MAX}); use --dtype bf16 or f32")
            t = t.to(dtype)
        out[k] = t
    return out


# ------------------------------------------------------------------------------------------ quantizing
# Mirrors src/quant.rs bit for bit. Every value is computed in float64 and rounded to float32 exactly
# where the Rust code rounds (a float64 result of one +, *, / of float32 operands, rounded once to float32,
# is the correctly rounded float32 result), so no torch kernel's choice of vectorised arithmetic matters.

def is_matrix_weight(name, t):
    """weights::is_matrix_weight on source names (original/mlx names keep the same substrings, except
    image_pos_embed, the original name of image_position_embed)."""
    return (
        t.dim() == 2
        and name.endswith(".weight")
        and "embed_positions" not in name
        and "image_position_embed" not in name
        and "image_pos_embed" not in name
    )


def row_bytes(bits, k):
    return k * bits // 8 + (k // QBLOCK * 2 + 15) // 16 * 16


def quantize_rows(t, bits):
    """(N, K) float tensor -> (N, row_bytes) uint8 in the engine's row layout."""
    n, k = t.shape
    qmax = 127.0 if bits == 8 else 7.0
    w = t.detach().to(torch.float64).reshape(n, k // QBLOCK, QBLOCK)
    w = torch.where(torch.isfinite(w), w, torch.zeros_like(w))
    amax = w.abs().amax(dim=-1)  # exact: float32 values
    d16 = (amax / qmax).to(torch.float32).to(torch.float16)  # f32 division, then f16 rounding
    d16 = torch.where(torch.isinf(d16), torch.full_like(d16, 65504.0), d16)
    d = d16.to(torch.float64)
    inv = torch.where(d > 0, (1.0 / torch.where(d > 0, d, torch.ones_like(d))).to(torch.float32).to(torch.float64), torch.zeros_like(d))
    p = (w * inv.unsqueeze(-1)).to(torch.float32).to(torch.float64)  # f32 product (exact in f64, rounded once)
    q = (torch.sign(p) * torch.floor(p.abs() + 0.5)).clamp(-qmax, qmax).to(torch.int32).reshape(n, k)
    if bits == 8:
        quants = q.to(torch.int8).view(torch.uint8)
    else:
        nib = (q + 8).to(torch.uint8)
        quants = nib[:, 0::2] | (nib[:, 1::2] << 4)
    scales = d16.contiguous().view(torch.int16)
    scale_bytes = torch.stack([(scales & 0xFF), (scales >> 8) & 0xFF], dim=-1).reshape(n, -1).to(torch.uint8)
    pad = row_bytes(bits, k) - quants.shape[1] - scale_bytes.shape[1]
    return torch.cat([quants, scale_bytes, torch.zeros(n, pad, dtype=torch.uint8)], dim=1).contiguous()


def quantize_checkpoint(tensors, bits):
    """Quantize the matrix weights; returns (tensors, sorted names of the quantized matrices)."""
    out, names = {}, []
    for k, t in tensors.items():
        if k.endswith(QWEIGHT_SUFFIX):
            raise ConvertError(f"{k}: the source is already quantized (convert from a float checkpoint)")
        if t.is_floating_point() and is_matrix_weight(k, t) and t.shape[1] > 0 and t.shape[1] % QBLOCK == 0:
            out[k + QWEIGHT_SUFFIX] = quantize_rows(t, bits)
            names.append(k)
        else:
            out[k] = t
    return out, sorted(names)


def nbytes(t):
    return t.numel() * t.element_size()


def plan_shards(tensors, shard_size):
    shards, cur, cur_size = [], [], 0
    for k, t in tensors.items():
        n = nbytes(t)
        if cur and cur_size + n > shard_size:
            shards.append(cur)
            cur, cur_size = [], 0
        cur.append(k)
        cur_size += n
    if cur:
        shards.append(cur)
    return shards


def write_weights(tensors, out, meta, shard_size):
    total = sum(nbytes(t) for t in tensors.values())
    if shard_size is None or total <= shard_size:
        files = {"model.safetensors": list(tensors)}
    else:
        parts = plan_shards(tensors, shard_size)
        files = {f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors": names for i, names in enumerate(parts)}
    for fname, names in files.items():
        # Clone per file: tensors sharing storage (tied weights) cannot be saved as views.
        save_file({k: tensors[k].contiguous().clone() for k in names}, os.path.join(out, fname), metadata=meta)
    if len(files) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": {k: f for f, names in files.items() for k in names}}
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
    return files, total


def verify(tensors, out, files):
    for fname, names in files.items():
        with safe_open(os.path.join(out, fname), framework="pt") as f:
            if sorted(f.keys()) != sorted(names):
                raise ConvertError(f"verify: {fname} holds other tensors than written")
            for k in names:
                t = f.get_tensor(k)
                if t.dtype != tensors[k].dtype or t.shape != tensors[k].shape or not torch.equal(t, tensors[k]):
                    raise ConvertError(f"verify: {fname}:{k} differs from the converted tensor")


# ------------------------------------------------------------------------------------------ side files

def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def build_tokenizer(src_dir, dst):
    vocab, merges = os.path.join(src_dir, "vocab.json"), os.path.join(src_dir, "merges.txt")
    if not (os.path.isfile(vocab) and os.path.isfile(merges)):
        return False
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    # BART's byte-level BPE with the structure of the hub tokenizer.json files; the package adds the
    # Florence-2 task/location tokens itself to a base-vocabulary file.
    with open(vocab) as f:
        v = json.load(f)
    bpe = models.BPE.from_file(vocab, merges)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.RobertaProcessing(("</s>", v["</s>"]), ("<s>", v["<s>"]), add_prefix_space=False)
    from tokenizers import AddedToken

    specials = [t for t in ("<s>", "<pad>", "</s>", "<unk>") if t in v]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    if "<mask>" in v:
        tok.add_special_tokens([AddedToken("<mask>", special=True, normalized=False, lstrip=True)])
    tok.save(dst)
    return True


def side_files(src_dir, out, tokenizer_file):
    notes = []
    cfg = os.path.join(src_dir, "config.json")
    if not os.path.isfile(cfg):
        raise ConvertError(f"{src_dir}: no config.json (it defines the architecture; copy it beside the weights)")
    with open(cfg) as f:
        json.load(f)  # must be JSON
    shutil.copyfile(cfg, os.path.join(out, "config.json"))
    tok_dst = os.path.join(out, "tokenizer.json")
    tok_src = tokenizer_file or os.path.join(src_dir, "tokenizer.json")
    if os.path.isfile(tok_src):
        shutil.copyfile(tok_src, tok_dst)
        notes.append(f"tokenizer.json copied from {tok_src}")
    elif build_tokenizer(src_dir, tok_dst):
        notes.append("tokenizer.json built from vocab.json + merges.txt")
    else:
        raise ConvertError(f"{src_dir}: no tokenizer.json (nor vocab.json + merges.txt); pass --tokenizer FILE")
    for name, default in (("preprocessor_config.json", DEFAULT_PREPROCESSOR), ("generation_config.json", DEFAULT_GENERATION)):
        p = os.path.join(src_dir, name)
        if os.path.isfile(p):
            shutil.copyfile(p, os.path.join(out, name))
        else:
            write_json(os.path.join(out, name), default)
            notes.append(f"{name}: Florence-2 defaults written")
    for name in EXTRA_FILES:
        p = os.path.join(src_dir, name)
        if os.path.isfile(p):
            shutil.copyfile(p, os.path.join(out, name))
    return notes


# ------------------------------------------------------------------------------------------ main

def convert(src, out, dtype="keep", shard_size=None, tokenizer=None, keep_tied=False, force=False, check=True, log=print,
            other_dtype="keep"):
    weights = find_weights(src)
    src_dir = src if os.path.isdir(src) else os.path.dirname(os.path.abspath(src))
    if os.path.abspath(src_dir) == os.path.abspath(out):
        raise ConvertError("OUT must differ from the source directory")
    if os.path.isdir(out) and os.listdir(out):
        if not force:
            raise ConvertError(f"{out} exists and is not empty (use --force to replace its model files)")
        for name in os.listdir(out):
            if name.startswith("model") and (name.endswith(".safetensors") or name.endswith(".index.json")):
                os.remove(os.path.join(out, name))
    os.makedirs(out, exist_ok=True)

    tensors, meta = load_weights(weights)
    layout = layout_of(tensors, meta)
    dtypes = sorted({str(t.dtype).replace("torch.", "") for t in tensors.values()})
    log(f"read {weights}: {len(tensors)} tensors, layout {layout}, dtypes {', '.join(dtypes)}")
    dropped = [] if keep_tied else drop_tied(tensors)
    if dropped:
        log(f"dropped tied copies of the shared embedding: {', '.join(dropped)}")
    quantized = None
    if dtype in QBITS:
        cfg_src = os.path.join(src_dir, "config.json")
        if os.path.isfile(cfg_src):
            with open(cfg_src) as f:
                if "quantization" in json.load(f):
                    raise ConvertError(f"{cfg_src}: the source is already quantized")
        tensors, quantized = quantize_checkpoint(tensors, QBITS[dtype])
        log(f"quantized {len(quantized)} matrix weights to {dtype} ({QUANT_FORMAT})")
        if other_dtype != "keep":
            rest = convert_dtype({k: t for k, t in tensors.items() if not k.endswith(QWEIGHT_SUFFIX)}, DTYPES[other_dtype])
            tensors = {k: rest.get(k, t) for k, t in tensors.items()}
    else:
        tensors = convert_dtype(tensors, None if dtype == "keep" else DTYPES[dtype])
    out_meta = {"format": str(meta.get("format", "pt"))}
    files, total = write_weights(tensors, out, out_meta, shard_size)
    if check:
        verify(tensors, out, files)
    for note in side_files(src_dir, out, tokenizer):
        log(note)
    if quantized is not None:
        cfg_path = os.path.join(out, "config.json")
        with open(cfg_path) as f:
            cfg = json.load(f)
        cfg["quantization"] = {
            "format": QUANT_FORMAT,
            "bits": QBITS[dtype],
            "block_size": QBLOCK,
            "scale_dtype": "float16",
            "tensors": quantized,
        }
        write_json(cfg_path, cfg)
    log(f"wrote {out}: {len(files)} weight file(s), {total / 1e6:.1f} MB of tensors ({dtype})" + (", verified" if check else ""))
    return files


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="model directory or weights file (.bin, .safetensors, .index.json)")
    ap.add_argument("out", help="output directory")
    ap.add_argument("--dtype", choices=["keep", "f32", "f16", "bf16", "q8", "q4"], default="keep",
                    help="float dtype of every float tensor, or q8/q4: block-quantized matrix weights (see above)")
    ap.add_argument("--shard-size", type=parse_size, help="split the weights into files of at most this size (e.g. 500MB)")
    ap.add_argument("--tokenizer", help="tokenizer.json to use (default: SRC's, or built from vocab.json + merges.txt)")
    ap.add_argument("--keep-tied", action="store_true", help="keep embed_tokens / lm_head copies of the shared embedding")
    ap.add_argument("--force", action="store_true", help="replace the model files of a non-empty OUT")
    ap.add_argument("--no-verify", action="store_true", help="skip re-reading the written files")
    ap.add_argument("--other-dtype", choices=["keep", "f32", "f16", "bf16"], default="keep",
                    help="with --dtype q8/q4: float dtype of the tensors that are not quantized (default: keep)")
    a = ap.parse_args(argv)
    if a.other_dtype != "keep" and a.dtype not in QBITS:
        ap.error("--other-dtype goes with --dtype q8 or q4 (use --dtype for a float conversion)")
    try:
        convert(a.src, a.out, a.dtype, a.shard_size, a.tokenizer, a.keep_tied, a.force, not a.no_verify,
                other_dtype=a.other_dtype)
    except ConvertError as e:
        print(f"convert_checkpoint: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
