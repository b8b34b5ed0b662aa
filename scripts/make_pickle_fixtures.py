#!/usr/bin/env python3
"""Writes the PyTorch-pickle twins of committed safetensors fixture models (tests/fixtures/models/):

- tiny2-pt/              HF-native layout, zip format, one `pytorch_model.bin`, as transformers 4.x's
                         `save_pretrained(safe_serialization=False)` wrote it: `torch.save` of a plain dict
                         that keeps the tied aliases of the shared embedding (`lm_head.weight`,
                         encoder/decoder `embed_tokens.weight`: one storage, four names). transformers 5
                         no longer writes pickles, so its writer is reproduced here (same shard splitting,
                         same index format).
- tiny2-orig-pt-sharded/ original (Microsoft) layout, zip format, sharded: `pytorch_model-0000N-of-0000M.bin`
                         + `pytorch_model.bin.index.json`; `language_model.lm_head.weight` and the encoder/
                         decoder `embed_tokens.weight` share the shared embedding's storage, as in the
                         published Florence-2 checkpoints.
- tiny2-orig-pt-legacy/  original layout, the legacy raw-pickle format (`_use_new_zipfile_serialization=False`);
                         one tensor is a view at an offset inside a bigger storage.

Every tensor equals its safetensors twin's bit for bit (checked here by loading each file back with
`torch.load(weights_only=True)`). The configs and tokenizer files are copied from the twin.

Run from anywhere: python3 scripts/make_pickle_fixtures.py (needs torch and huggingface_hub).
"""
import json
import pathlib
import shutil

import torch
from huggingface_hub import split_torch_state_dict_into_shards
from safetensors.torch import load_file

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests/fixtures/models"
HF_SHARED = "model.language_model.shared.weight"
HF_ALIASES = ["lm_head.weight", "model.language_model.encoder.embed_tokens.weight",
              "model.language_model.decoder.embed_tokens.weight"]
ORIG_SHARED = "language_model.model.shared.weight"
ORIG_ALIASES = ["language_model.model.encoder.embed_tokens.weight",
                "language_model.model.decoder.embed_tokens.weight"]


def fresh(name, twin):
    out = MODELS / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir()
    for f in sorted((MODELS / twin).iterdir()):
        if f.suffix == ".json" and not f.name.endswith(".index.json"):
            shutil.copy(f, out / f.name)
    return out


def with_aliases(sd, shared, aliases):
    out = dict(sd)
    for a in aliases:
        out[a] = out[shared]  # the same tensor: one storage
    return out


def save_sharded(sd, out, max_shard_size):
    """transformers 4.x's non-safetensors save: shards by size, a torch.save per shard, the index."""
    split = split_torch_state_dict_into_shards(
        sd, filename_pattern="pytorch_model{suffix}.bin", max_shard_size=max_shard_size)
    for filename, names in split.filename_to_tensors.items():
        torch.save({n: sd[n] for n in names}, out / filename)
    if split.is_sharded:
        index = {"metadata": {"total_size": split.metadata["total_size"]},
                 "weight_map": split.tensor_to_filename}
        (out / "pytorch_model.bin.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def check(out, twin, files):
    want = load_file(MODELS / twin / "model.safetensors")
    got = {}
    for f in files:
        got.update(torch.load(out / f, weights_only=True))
    for k, v in want.items():
        assert torch.equal(got[k], v) and got[k].dtype == v.dtype, k
    extra = sorted(set(got) - set(want))
    print(f"{out.name}: {len(want)} tensors equal to {twin}'s, plus aliases {extra}; "
          f"{sum((out / f).stat().st_size for f in files)} bytes")


def main():
    hf = load_file(MODELS / "tiny2/model.safetensors")
    out = fresh("tiny2-pt", "tiny2")
    save_sharded(with_aliases(hf, HF_SHARED, HF_ALIASES), out, "5GB")
    check(out, "tiny2", ["pytorch_model.bin"])

    orig = load_file(MODELS / "tiny2-orig/model.safetensors")
    tied = with_aliases(orig, ORIG_SHARED, ORIG_ALIASES)
    # The twin's lm_head is a copy of the shared embedding (equal values): here it is the same storage.
    assert torch.equal(tied["language_model.lm_head.weight"], tied[ORIG_SHARED])
    tied["language_model.lm_head.weight"] = tied[ORIG_SHARED]
    out = fresh("tiny2-orig-pt-sharded", "tiny2-orig")
    save_sharded(tied, out, "400KB")
    check(out, "tiny2-orig", sorted(p.name for p in out.glob("pytorch_model-*.bin")))

    out = fresh("tiny2-orig-pt-legacy", "tiny2-orig")
    legacy = dict(orig)
    # A view at an offset: a LayerNorm bias sits after 5 other values in its storage.
    name = "language_model.model.encoder.layernorm_embedding.bias"
    bias = orig[name]
    big = torch.cat([torch.arange(5, dtype=bias.dtype), bias.flatten()])
    legacy[name] = big[5:].view(bias.shape)
    legacy["padding.values"] = big[:5]
    torch.save(legacy, out / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    check(out, "tiny2-orig", ["pytorch_model.bin"])


if __name__ == "__main__":
    main()
