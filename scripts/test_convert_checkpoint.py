#!/usr/bin/env python3
"""Tests of scripts/convert_checkpoint.py on the committed fixtures (run by hand; needs torch + safetensors
and the native CLI: `cargo build --bin florence2`).

  python3 scripts/test_convert_checkpoint.py

For each case a fixture checkpoint is re-saved the way it would arrive (a pickled `pytorch_model.bin` made
with torch.save, or safetensors), converted, loaded by the native CLI and run; its answer (token ids, text,
post-processed result) must equal the CLI's answer on the fixture directory itself (or, for the f16 case, on
the committed f16 fixture made by the reference script from the same weights). Also: a pickle carrying code
is refused without running it, sharding writes a consistent index, and the converted tensors equal the
source tensors exactly (after the requested dtype conversion).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from safetensors import safe_open

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import convert_checkpoint as cc  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "tests/fixtures/models")
IMAGE = os.path.join(ROOT, "tests/fixtures/images/scene.png")
CLI = os.environ.get("FLORENCE2_CLI", os.path.join(ROOT, "target/debug/florence2"))
SIDE = ["config.json", "tokenizer.json", "preprocessor_config.json", "generation_config.json"]

passed = failed = 0


def check(name, fn):
    global passed, failed
    try:
        fn()
        print(f"ok   {name}")
        passed += 1
    except Exception as e:  # noqa: BLE001
        print(f"FAIL {name}: {e}")
        failed += 1


def cli(model_dir, task="<OD>", dtype=None):
    extra = ["--dtype", dtype] if dtype else []
    out = subprocess.run(
        [CLI, "run", "--model", model_dir, "--image", IMAGE, "--task", task, "--max-new-tokens", "24", "--json", *extra],
        capture_output=True, text=True, env={**os.environ, "NODEVICE_SELECT": "1"},
    )
    if out.returncode != 0:
        raise AssertionError(f"florence2 run on {model_dir} failed: {out.stderr.strip()[-400:]}")
    j = json.loads(out.stdout)
    return {k: j.get(k) for k in ("task", "token_ids", "generated_text", "result", "text")}


def tensors_of(path):
    with safe_open(path, framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def copy_side(src, dst, names=SIDE):
    for n in names:
        with open(os.path.join(src, n), "rb") as a, open(os.path.join(dst, n), "wb") as b:
            b.write(a.read())


def as_bin(fixture, tmp):
    """The fixture's weights as a pickled pytorch_model.bin (tensors sharing storage, like torch.save of a
    model with tied weights), configs beside it."""
    src = os.path.join(MODELS, fixture)
    t, _ = tensors_of(os.path.join(src, "model.safetensors"))
    d = os.path.join(tmp, fixture + "-bin")
    os.makedirs(d)
    shared = [k for k in t if k.endswith("shared.weight")]
    for k in list(t):
        if shared and k.endswith("lm_head.weight") and torch.equal(t[k], t[shared[0]]):
            t[k] = t[shared[0]]  # a tied view, as torch.save writes it
    torch.save(t, os.path.join(d, "pytorch_model.bin"))
    copy_side(src, d)
    return d


def same_answer(a, b):
    assert a == b, f"answers differ:\n  {json.dumps(a)[:400]}\n  {json.dumps(b)[:400]}"


def main():
    tmp = tempfile.mkdtemp(prefix="convert-test-")
    quiet = lambda *_: None  # noqa: E731

    def bin_orig_roundtrip():
        src = as_bin("tiny2-orig", tmp)
        out = os.path.join(tmp, "tiny2-orig-out")
        cc.convert(src, out, log=quiet)
        assert sorted(os.listdir(out)) == sorted(SIDE + ["model.safetensors"]), os.listdir(out)
        t, meta = tensors_of(os.path.join(out, "model.safetensors"))
        ref, _ = tensors_of(os.path.join(MODELS, "tiny2-orig", "model.safetensors"))
        assert "language_model.lm_head.weight" not in t, "tied lm_head copy not dropped"
        for k, v in t.items():
            assert torch.equal(v, ref[k]), k
        assert set(ref) - set(t) == {"language_model.lm_head.weight"}
        for task in ("<OD>", "<CAPTION>"):
            same_answer(cli(out, task), cli(os.path.join(MODELS, "tiny2-orig"), task))

    def bin_mlx_bf16_roundtrip():
        src = as_bin("tiny4-mlx-bf16", tmp)
        out = os.path.join(tmp, "tiny4-mlx-out")
        cc.convert(src, out, keep_tied=True, log=quiet)
        t, _ = tensors_of(os.path.join(out, "model.safetensors"))
        assert all(v.dtype == torch.bfloat16 for v in t.values() if v.is_floating_point())
        same_answer(cli(out), cli(os.path.join(MODELS, "tiny4-mlx-bf16")))

    def hf_f16_sharded_equals_fixture():
        out = os.path.join(tmp, "tiny4-f16-out")
        files = cc.convert(os.path.join(MODELS, "tiny4"), out, dtype="f16", shard_size=cc.parse_size("100KB"), log=quiet)
        assert len(files) > 1, files
        with open(os.path.join(out, "model.safetensors.index.json")) as f:
            index = json.load(f)
        assert set(index["weight_map"].values()) == set(files)
        total = 0
        for name in files:
            t, _ = tensors_of(os.path.join(out, name))
            assert all(index["weight_map"][k] == name for k in t)
            assert all(v.dtype == torch.float16 for v in t.values())
            total += sum(v.numel() * v.element_size() for v in t.values())
        assert index["metadata"]["total_size"] == total
        assert os.path.getsize(os.path.join(out, files and sorted(files)[0])) < 100_000 + 64_000
        same_answer(cli(out), cli(os.path.join(MODELS, "tiny4-f16-sharded")))

    def safetensors_index_input():
        # The committed sharded f16 fixture as input (index + shards), re-sharded into one file.
        out = os.path.join(tmp, "tiny4-f16-merged")
        files = cc.convert(os.path.join(MODELS, "tiny4-f16-sharded"), out, log=quiet)
        assert list(files) == ["model.safetensors"]
        same_answer(cli(out), cli(os.path.join(MODELS, "tiny4-f16-sharded")))

    def pickled_code_is_refused():
        class Payload:
            def __reduce__(self):
                return (os.system, (f"touch {os.path.join(tmp, 'PWNED')}",))

        d = os.path.join(tmp, "evil")
        os.makedirs(d)
        torch.save({"vision_tower.convs.0.proj.weight": torch.zeros(2), "x": Payload()}, os.path.join(d, "pytorch_model.bin"))
        copy_side(os.path.join(MODELS, "tiny2-orig"), d)
        out = os.path.join(tmp, "evil-out")
        try:
            cc.convert(d, out, log=quiet)
        except cc.ConvertError as e:
            assert "weights_only" in str(e), e
        else:
            raise AssertionError("a pickle with code was accepted")
        assert not os.path.exists(os.path.join(tmp, "PWNED")), "the pickled code ran"
        assert not os.path.exists(os.path.join(out, "model.safetensors"))

    def missing_files_are_errors():
        d = os.path.join(tmp, "no-config")
        os.makedirs(d)
        t, _ = tensors_of(os.path.join(MODELS, "tiny2", "model.safetensors"))
        torch.save(t, os.path.join(d, "pytorch_model.bin"))
        try:
            cc.convert(d, os.path.join(tmp, "no-config-out"), log=quiet)
        except cc.ConvertError as e:
            assert "config.json" in str(e), e
        else:
            raise AssertionError("converted without a config.json")
        try:
            cc.convert(os.path.join(MODELS, "tiny2"), os.path.join(tmp, "tiny2-orig-out"), log=quiet)
        except cc.ConvertError as e:
            assert "not empty" in str(e), e
        else:
            raise AssertionError("overwrote a non-empty output directory without --force")

    def defaults_written_when_absent():
        d = os.path.join(tmp, "bare")
        os.makedirs(d)
        copy_side(os.path.join(MODELS, "tiny2"), d, ["config.json", "tokenizer.json"])
        with open(os.path.join(MODELS, "tiny2", "model.safetensors"), "rb") as a, open(os.path.join(d, "model.safetensors"), "wb") as b:
            b.write(a.read())
        out = os.path.join(tmp, "bare-out")
        cc.convert(d, out, log=quiet)
        with open(os.path.join(out, "generation_config.json")) as f:
            assert json.load(f)["num_beams"] == 3
        with open(os.path.join(out, "preprocessor_config.json")) as f:
            assert json.load(f)["size"] == {"height": 768, "width": 768}

    def quantized_from_mlx_bf16_sharded():
        # bf16 channels-last source: matrices quantized from their bf16 values, convs and the rest kept
        # bf16; loaded as q4 it answers like the bf16 fixture loaded as q4 (same blocks, same other tensors).
        out = os.path.join(tmp, "tiny4-mlx-q4")
        files = cc.convert(os.path.join(MODELS, "tiny4-mlx-bf16"), out, dtype="q4", shard_size=cc.parse_size("150KB"), log=quiet)
        assert len(files) > 1, files
        with open(os.path.join(out, "config.json")) as f:
            q = json.load(f)["quantization"]
        assert (q["format"], q["bits"], q["block_size"]) == ("florence2-wasm-block", 4, 32), q
        seen = set()
        for name in files:
            t, meta = tensors_of(os.path.join(out, name))
            assert meta.get("format") == "mlx", meta
            for k, v in t.items():
                if k.endswith(".qweight"):
                    assert v.dtype == torch.uint8 and k[: -len(".qweight")] in q["tensors"], k
                    seen.add(k[: -len(".qweight")])
                else:
                    assert v.dtype == torch.bfloat16, (k, v.dtype)
        assert seen == set(q["tensors"]) and len(seen) > 20, len(seen)
        same_answer(cli(out, dtype="q4"), cli(os.path.join(MODELS, "tiny4-mlx-bf16"), dtype="q4"))

    def quantized_from_f16_shards():
        out = os.path.join(tmp, "tiny4-f16-q8")
        cc.convert(os.path.join(MODELS, "tiny4-f16-sharded"), out, dtype="q8", log=quiet)
        same_answer(cli(out, dtype="q8"), cli(os.path.join(MODELS, "tiny4-f16-sharded"), dtype="q8"))
        # Another resident dtype dequantizes while loading: it runs.
        assert cli(out, dtype="fp32")["token_ids"]
        # A quantized checkpoint is not quantized again.
        try:
            cc.convert(out, os.path.join(tmp, "again"), dtype="q4", log=quiet)
        except cc.ConvertError as e:
            assert "already quantized" in str(e), e
        else:
            raise AssertionError("re-quantized a quantized checkpoint")

    def sizes_parse():
        assert cc.parse_size("500MB") == 500_000_000
        assert cc.parse_size("1.5GB") == 1_500_000_000
        assert cc.parse_size("64KiB") == 65536
        assert cc.parse_size("123") == 123

    for name, fn in [
        ("pytorch_model.bin (original layout, f32, tied lm_head) -> safetensors: same CLI answers", bin_orig_roundtrip),
        ("pytorch_model.bin (mlx layout, bf16) -> safetensors: same CLI answer", bin_mlx_bf16_roundtrip),
        ("HF-native f32 -> f16, 100KB shards + index: same CLI answer as the f16 fixture", hf_f16_sharded_equals_fixture),
        ("sharded safetensors input (index.json) -> one file: same CLI answer", safetensors_index_input),
        ("a pickle carrying code is refused and does not run", pickled_code_is_refused),
        ("missing config.json / non-empty OUT are errors", missing_files_are_errors),
        ("absent preprocessor/generation configs get Florence-2 defaults", defaults_written_when_absent),
        ("--shard-size parsing", sizes_parse),
        ("mlx bf16 -> q4 in 150KB shards: same CLI answer as the fixture loaded as q4", quantized_from_mlx_bf16_sharded),
        ("f16 shards -> q8: same CLI answer as the fixture loaded as q8; not re-quantized", quantized_from_f16_shards),
    ]:
        check(name, fn)
    print(f"{passed} passed, {failed} failed")
    shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
