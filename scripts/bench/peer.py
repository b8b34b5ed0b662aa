#!/usr/bin/env python3
"""Peer benchmark on the CPU: our `florence2` CLI (CPU backend) beside ONNX Runtime CPU and PyTorch CPU,
side by side in one run, phase by phase, with the token ids compared. Run through scripts/bench/peer.sh,
which makes the Python environment (torch, transformers, onnx, onnxruntime) this script needs.

What one run does:
1. A Florence-2-base-shaped checkpoint with seeded random weights in the HF-native layout (base shapes set
   on transformers' `Florence2Config`), made once under --work (reused when present),
   with the tokenizer given by --tokenizer copied in (the CLI needs it; any Florence-2 tokenizer.json).
2. The four ONNX graphs transformers.js loads (vision encoder, embed tokens, encoder, merged decoder with
   its KV cache), exported once by the exporter given with --exporter (run as a tool, not part of this
   repository), and ORT's own quantized variants: int8 (`quantize_dynamic`, per-channel int8 weights,
   dynamic int8 activations) and int4 (`MatMulNBitsQuantizer`, 32-weight blocks) when this ORT has them.
3. --rounds rounds; each round runs every engine and format once, alternating, each in its own process
   (its peak RSS sampled from /proc): our CLI per --dtypes (`run --device cpu --max-batch 1 --tuning off`,
   one image given --tasks times: the first task is cold, the rest warm), ORT per --ort-formats and
   PyTorch fp32 (both in this script's worker mode, the same number of tasks). Every engine uses
   --threads threads (our CLI's CPU backend takes all cores: give --threads the core count).
4. Prints per engine and format the medians over rounds of the warm tasks: load, vision (+ projector),
   encoder (prompt embedding + encoder), decode per step, whole task, the ratio to PyTorch, peak RSS,
   and whether the greedy ids equal PyTorch's (the reference; fp32 engines may part on near-ties of
   random weights: the first differing step is printed).
5. The decode step against the memory bandwidth: a STREAM-like triad on --threads threads, and per
   format of ours the bytes a step reads (decoder + LM head weights from `florence2 estimate`, the
   cross-attention K/V), the time that takes at the triad's bandwidth, and the share of it the measured
   step reaches.

The decoding rule is the same everywhere: greedy, `no_repeat_ngram_size` 0, --max-new-tokens new
tokens, generation_config.json's forced BOS / forced EOS / EOS, as transformers' `generate` applies them.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT = "What does the image describe?"  # <CAPTION>'s prompt (the processor's task table)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default=os.path.join(ROOT, "target/bench-peer"))
    ap.add_argument("--tokenizer", required=True, help="a Florence-2 tokenizer.json")
    ap.add_argument("--exporter", required=True, help="export_florence2_onnx.py (an external tool)")
    ap.add_argument("--cli", default=os.path.join(ROOT, "target/release/florence2"))
    ap.add_argument("--image", default=os.path.join(ROOT, "tests/fixtures/images/scene.png"))
    ap.add_argument("--dtypes", default="fp32,fp16,q8,q4")
    ap.add_argument("--ort-formats", default="fp32,int8,int4")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tasks", type=int, default=3, help="tasks per process (the first is cold)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--max-new-tokens", type=int, default=20)
    ap.add_argument("--worker", choices=["ort", "torch"], help=argparse.SUPPRESS)
    ap.add_argument("--format", default="fp32", help=argparse.SUPPRESS)
    return ap.parse_args()


# ---------------------------------------------------------------------------------------------------
# Inputs shared by the workers: pixels as the HF image processor makes them, the prompt's ids.

def model_dir(args):
    return os.path.join(args.work, "base-f32")


def pixels(args):
    from PIL import Image

    pp = json.load(open(os.path.join(model_dir(args), "preprocessor_config.json")))
    h, w = pp["size"]["height"], pp["size"]["width"]
    img = Image.open(args.image).convert("RGB").resize((w, h), Image.BICUBIC)
    x = np.asarray(img, dtype=np.float32) * np.float32(pp.get("rescale_factor", 1 / 255))
    x = (x - np.array(pp["image_mean"], np.float32)) / np.array(pp["image_std"], np.float32)
    return x.transpose(2, 0, 1)[None].astype(np.float32)  # (1, 3, H, W)


def prompt_ids(args):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(model_dir(args), "tokenizer.json"))
    return tok.encode(PROMPT).ids  # <s> ... </s>


def generation_rule(args):
    cfg = json.load(open(os.path.join(model_dir(args), "generation_config.json")))
    text = json.load(open(os.path.join(model_dir(args), "config.json")))["text_config"]
    return {
        "heads": text["decoder_attention_heads"],
        "start": cfg["decoder_start_token_id"],
        "eos": cfg["eos_token_id"],
        "forced_bos": cfg.get("forced_bos_token_id"),
        "forced_eos": cfg.get("forced_eos_token_id"),
        "max_new": args.max_new_tokens,
    }


def next_token(logits, ids, rule):
    """Greedy choice with transformers' forced BOS (first new token) and forced EOS (last position)."""
    if len(ids) == 1 and rule["forced_bos"] is not None:
        return rule["forced_bos"]
    if len(ids) == rule["max_new"] and rule["forced_eos"] is not None:
        return rule["forced_eos"]
    return int(np.argmax(logits))


def finished(ids, rule):
    """ids[0] is the decoder start token (EOS itself in Florence-2): only generated tokens end it."""
    return (len(ids) > 1 and ids[-1] == rule["eos"]) or len(ids) > rule["max_new"]


# ---------------------------------------------------------------------------------------------------
# ONNX Runtime worker: the transformers.js graphs, its best CPU session options.

def ort_sessions(args):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    d = os.path.join(args.work, "onnx-" + args.format)
    names = ["vision_encoder", "embed_tokens", "encoder_model", "decoder_model_merged"]
    return {n: ort.InferenceSession(os.path.join(d, n + ".onnx"), so, providers=["CPUExecutionProvider"])
            for n in names}


def ort_decode(s, enc, mask, rule):
    """Greedy decoding through the merged decoder; returns the ids and each step's seconds."""
    past_names = [i.name for i in s["decoder_model_merged"].get_inputs() if i.name.startswith("past_key")]
    heads, head_dim = rule["heads"], enc.shape[2] // rule["heads"]
    ids, steps, past = [rule["start"]], [], None
    while not finished(ids, rule):
        t = time.perf_counter()
        emb = s["embed_tokens"].run(None, {"input_ids": np.array([[ids[-1]]], np.int64)})[0]
        feeds = {"inputs_embeds": emb, "encoder_hidden_states": enc, "encoder_attention_mask": mask,
                 "use_cache_branch": np.array([past is not None])}
        for i, n in enumerate(past_names):
            feeds[n] = np.zeros((1, heads, 0, head_dim), np.float32) if past is None else past[i]
        out = s["decoder_model_merged"].run(None, feeds)
        past = out[1:]
        ids.append(next_token(out[0][0, -1], ids, rule))
        steps.append(time.perf_counter() - t)
    return ids, steps


def ort_task(s, px, prompt, rule):
    t0 = time.perf_counter()
    feats = s["vision_encoder"].run(None, {"pixel_values": px})[0]  # (1, N, D)
    t1 = time.perf_counter()
    emb = s["embed_tokens"].run(None, {"input_ids": np.array([prompt], np.int64)})[0]
    x = np.concatenate([feats, emb], 1)
    mask = np.ones(x.shape[:2], np.int64)
    enc = s["encoder_model"].run(None, {"inputs_embeds": x, "attention_mask": mask})[0]
    t2 = time.perf_counter()
    ids, steps = ort_decode(s, enc, mask, rule)
    t3 = time.perf_counter()
    return {"vision": t1 - t0, "encoder": t2 - t1, "decode": t3 - t2, "steps": len(steps),
            "task": t3 - t0, "ids": ids}


# ---------------------------------------------------------------------------------------------------
# PyTorch worker: transformers' model, fp32, eager attention; decode timed by a logits processor.

def torch_model(args):
    import torch
    from transformers import Florence2ForConditionalGeneration

    torch.set_num_threads(args.threads)
    return Florence2ForConditionalGeneration.from_pretrained(
        model_dir(args), attn_implementation="eager", dtype=torch.float32).eval()


def torch_task(model, px, prompt, rule):
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    class Clock(LogitsProcessor):
        stamps = []

        def __call__(self, input_ids, scores):
            self.stamps.append(time.perf_counter())
            return scores

    m, cfg = model.model, model.config
    pixels_t = torch.from_numpy(px)
    with torch.inference_mode():
        t0 = time.perf_counter()
        image = m.multi_modal_projector(m.vision_tower(pixels_t).last_hidden_state)
        t1 = time.perf_counter()
        ids = torch.tensor([[cfg.image_token_id] * image.shape[1] + prompt])
        emb = m.get_input_embeddings()(ids).masked_scatter((ids == cfg.image_token_id).unsqueeze(-1), image)
        m.language_model.encoder(inputs_embeds=emb)
        t2 = time.perf_counter()
        clock = Clock()
        out = model.generate(input_ids=ids, pixel_values=pixels_t, max_new_tokens=rule["max_new"],
                             num_beams=1, do_sample=False, no_repeat_ngram_size=0,
                             logits_processor=LogitsProcessorList([clock]))
        t3 = time.perf_counter()
    # `generate` runs the whole task again from the pixels (vision, encoder, decode): it is the task's
    # time; the decode steps are the intervals between consecutive logits.
    steps = [b - a for a, b in zip(clock.stamps, clock.stamps[1:])]
    return {"vision": t1 - t0, "encoder": t2 - t1, "decode": sum(steps), "steps": len(steps),
            "task": t3 - t2, "ids": [int(i) for i in out[0]]}


def worker(args):
    px, prompt, rule = pixels(args), prompt_ids(args), generation_rule(args)
    t = time.perf_counter()
    engine = ort_sessions(args) if args.worker == "ort" else torch_model(args)
    load = time.perf_counter() - t
    run = ort_task if args.worker == "ort" else torch_task
    tasks = [run(engine, px, prompt, rule) for _ in range(args.tasks)]
    print(json.dumps({"load": load, "tasks": tasks}))


# ---------------------------------------------------------------------------------------------------
# Preparation: the checkpoint, the ONNX export, ORT's quantized graphs (each made once, then reused).

def base_config(florence2_config):
    """Florence-2-base's shapes (transformers' defaults are the large text model's)."""
    text = {"d_model": 768, "encoder_layers": 6, "decoder_layers": 6, "encoder_attention_heads": 12,
            "decoder_attention_heads": 12, "encoder_ffn_dim": 3072, "decoder_ffn_dim": 3072,
            "vocab_size": 51328, "max_position_embeddings": 1024}
    return florence2_config(vision_config={"projection_dim": 768}, text_config=text,
                            image_token_id=51289, tie_word_embeddings=True)


def make_checkpoint(args):
    import shutil

    import torch
    from transformers import Florence2Config, Florence2ForConditionalGeneration

    d = model_dir(args)
    if os.path.exists(os.path.join(d, "model.safetensors")):
        return
    torch.manual_seed(0)
    model = Florence2ForConditionalGeneration(base_config(Florence2Config)).eval()
    with torch.no_grad():  # non-trivial values everywhere: random biases and norm affines too
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.02 * torch.randn_like(p))
        # EOS's (tied) embedding row is zero: its logit is 0 while the maximum over 51k random logits is
        # positive, so every engine decodes all --max-new-tokens steps (EOS comes only when forced).
        eos = model.generation_config.eos_token_id
        model.get_input_embeddings().weight[eos].zero_()
    model.generation_config.num_beams = 1
    model.save_pretrained(d, safe_serialization=True)
    pp = {"do_resize": True, "size": {"height": 768, "width": 768}, "resample": 3, "do_rescale": True,
          "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.485, 0.456, 0.406],
          "image_std": [0.229, 0.224, 0.225], "image_processor_type": "CLIPImageProcessor"}
    json.dump(pp, open(os.path.join(d, "preprocessor_config.json"), "w"), indent=1)
    shutil.copy(args.tokenizer, os.path.join(d, "tokenizer.json"))
    print(f"checkpoint: {d}", file=sys.stderr)


def export_onnx(args):
    out = os.path.join(args.work, "export")
    merged = os.path.join(out, "onnx", "decoder_model_merged.onnx")
    if not os.path.exists(merged):
        subprocess.run([sys.executable, args.exporter, "--model", model_dir(args), "--out", out], check=True)
    fp32 = os.path.join(args.work, "onnx-fp32")
    if not os.path.exists(fp32):
        os.symlink(os.path.join(out, "onnx"), fp32)


def quantize_onnx(args, fmt):
    """ORT's own int8 / int4 paths for the three large graphs (embed tokens stays fp32)."""
    d = os.path.join(args.work, "onnx-" + fmt)
    if os.path.exists(os.path.join(d, "decoder_model_merged.onnx")):
        return True
    os.makedirs(d, exist_ok=True)
    src = os.path.join(args.work, "onnx-fp32")
    for name in ["vision_encoder", "embed_tokens", "encoder_model", "decoder_model_merged"]:
        a, b = os.path.join(src, name + ".onnx"), os.path.join(d, name + ".onnx")
        if name == "embed_tokens":
            os.symlink(a, b)
        elif not quantize_graph(a, b, fmt):
            return False
    return True


def quantize_graph(src, dst, fmt):
    if fmt == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(src, dst, weight_type=QuantType.QInt8, per_channel=True)
        return True
    try:
        import onnx
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    except ImportError as e:
        print(f"ORT int4 not available: {e}", file=sys.stderr)
        return False
    q = MatMulNBitsQuantizer(onnx.load(src), block_size=32, is_symmetric=True)
    q.process()
    q.model.save_model_to_file(dst, use_external_data_format=False)
    return True


# ---------------------------------------------------------------------------------------------------
# One engine's process and its peak RSS. wait4's ru_maxrss cannot serve: Linux carries the parent's
# high-water mark into a child across fork/vfork + exec, so every child would report this script's
# peak. The child's own VmHWM (its memory after exec, monotone) is read every 10 ms until it exits.

def vm_hwm_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def run_process(cmd):
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err)
        peak = 0.0
        while p.poll() is None:
            peak = max(peak, vm_hwm_mib(p.pid) or 0.0)
            time.sleep(0.01)
        out.seek(0)
        err.seek(0)
        text, errs = out.read().decode(), err.read().decode()
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd[:4])} ... failed ({p.returncode}):\n{errs[-3000:]}")
    return text, peak


def ours(args, dtype):
    cmd = [args.cli, "run", "--model", model_dir(args), "--task", "<CAPTION>", "--device", "cpu",
           "--dtype", dtype, "--tuning", "off", "--num-beams", "1", "--no-repeat-ngram-size", "0",
           "--max-new-tokens", str(args.max_new_tokens), "--max-batch", "1", "--jsonl"]
    for _ in range(args.tasks):
        cmd += ["--image", args.image]
    t = time.perf_counter()
    text, rss = run_process(cmd)
    wall = time.perf_counter() - t
    tasks = []
    for line in text.splitlines():
        r = json.loads(line)
        ms = r["timings_ms"]
        steps = len(r["token_ids"]) - 1
        tasks.append({"vision": ms["vision"] / 1e3, "encoder": ms["encoder"] / 1e3,
                      "decode": ms["decode"] / 1e3, "steps": steps,
                      "task": (ms["vision"] + ms["encoder"] + ms["decode"]) / 1e3,
                      "ids": r["token_ids"]})
    # The process's time less its tasks (preprocess included) is its load (start, read, conversion).
    load = wall - sum(sum(json.loads(l)["timings_ms"].values()) / 1e3 for l in text.splitlines())
    return {"load": load, "tasks": tasks, "rss": rss}


def peer(args, engine, fmt):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", engine, "--format", fmt]
    for k in ["work", "tokenizer", "exporter", "image", "tasks", "threads", "max_new_tokens"]:
        cmd += ["--" + k.replace("_", "-"), str(getattr(args, k))]
    text, rss = run_process(cmd)
    r = json.loads(text.strip().splitlines()[-1])
    r["rss"] = rss
    return r


# ---------------------------------------------------------------------------------------------------
# The decode step against the memory bandwidth: a STREAM-like triad, and the bytes a step reads.

def triad_gbs(threads, mib=256, reps=5):
    """Best of `reps` STREAM triads a = b + s * c over float64 arrays of `mib` MiB each, split over
    `threads` threads (numpy releases the GIL in its loops): 3 arrays' bytes per pass, as STREAM counts
    them (write-allocate traffic not counted)."""
    from concurrent.futures import ThreadPoolExecutor

    n = mib * (1 << 20) // 8
    a, b, c = np.zeros(n), np.ones(n), np.full(n, 2.0)
    bounds = [(i * n // threads, (i + 1) * n // threads) for i in range(threads)]

    def part(r):
        lo, hi = r
        np.multiply(c[lo:hi], 3.0, out=a[lo:hi])
        np.add(a[lo:hi], b[lo:hi], out=a[lo:hi])

    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(reps):
            t = time.perf_counter()
            list(pool.map(part, bounds))
            best = min(best, time.perf_counter() - t)
    # multiply reads c, writes a; add reads a and b, writes a: 5 array passes in all.
    return 5 * n * 8 / best / 1e9


def step_bytes(args, dtype):
    """Bytes one greedy decode step reads: the decoder's and the LM head's (tied embedding) resident
    weights, from `florence2 estimate`, plus the cross-attention K/V of the encoder's sequence (f32 for
    fp32 weights, f16 otherwise, as the engine keeps them). Self-attention K/V (20 steps) is left out."""
    out = subprocess.run([args.cli, "estimate", "--model", model_dir(args), "--dtype", dtype, "--device",
                          "cpu"], capture_output=True, text=True, check=True).stdout
    parts = json.loads(out)["estimates"][0]["part_bytes"]
    text = json.load(open(os.path.join(model_dir(args), "config.json")))["text_config"]
    pp = json.load(open(os.path.join(model_dir(args), "preprocessor_config.json")))
    tokens = (pp["size"]["height"] // 32) ** 2 + 1 + len(prompt_ids(args))  # image features + prompt
    kv = 2 * text["decoder_layers"] * tokens * text["d_model"] * (4 if dtype == "fp32" else 2)
    return parts["decoder"] + parts["embed"] + kv


def bandwidth_report(results, args):
    gbs = triad_gbs(args.threads)
    print(f"\nmemory bandwidth (STREAM-like triad, {args.threads} threads): {gbs:.1f} GB/s")
    print(f"{'format':<6} {'MB read / step':>15} {'bound ms':>9} {'ms / step':>10} {'% of bound':>11}")
    for (engine, fmt), s in results.items():
        if engine != "ours":
            continue
        b = step_bytes(args, fmt)
        bound = b / (gbs * 1e9)
        print(f"{fmt:<6} {b / 1e6:>15.1f} {bound * 1e3:>9.2f} {s['step'] * 1e3:>10.2f} "
              f"{100 * bound / s['step']:>10.0f}%")


# ---------------------------------------------------------------------------------------------------
# The run: rounds alternating engines, medians, the table.

def engines(args):
    out = [("ours", d, lambda d=d: ours(args, d)) for d in args.dtypes.split(",") if d]
    for f in [f for f in args.ort_formats.split(",") if f]:
        if f == "fp32" or quantize_onnx(args, f):
            out.append(("onnxruntime", f, lambda f=f: peer(args, "ort", f)))
    out.append(("pytorch", "fp32", lambda: peer(args, "torch", "fp32")))
    return out


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def summary(runs):
    """Medians over rounds of each process's warm tasks (all but its first)."""
    warm = [t for r in runs for t in r["tasks"][1:]] or [t for r in runs for t in r["tasks"]]
    med = lambda k: statistics.median(t[k] for t in warm)  # noqa: E731
    step = statistics.median(t["decode"] / max(t["steps"], 1) for t in warm)
    return {"load": statistics.median(r["load"] for r in runs), "vision": med("vision"),
            "encoder": med("encoder"), "step": step, "task": med("task"),
            "rss": max(r["rss"] for r in runs), "ids": runs[-1]["tasks"][-1]["ids"],
            "steps": warm[-1]["steps"]}


def report(results, args):
    ref = results[("pytorch", "fp32")]
    print(f"\nside by side, {args.rounds} rounds x {args.tasks} tasks, {args.threads} threads, <CAPTION> "
          f"{args.max_new_tokens} new tokens max, base shapes, 768 px (medians of warm tasks)")
    print(f"{'engine':<12} {'format':<6} {'load s':>7} {'vision s':>9} {'encoder s':>10} "
          f"{'ms/step':>8} {'task s':>7} {'x PyTorch':>9} {'peak MiB':>9}  ids vs PyTorch")
    for (engine, fmt), s in results.items():
        diff = first_difference(s["ids"], ref["ids"])
        same = f"equal ({s['steps']} steps)" if diff is None else f"differ from step {diff}"
        print(f"{engine:<12} {fmt:<6} {s['load']:>7.2f} {s['vision']:>9.3f} {s['encoder']:>10.3f} "
              f"{s['step'] * 1e3:>8.1f} {s['task']:>7.3f} {s['task'] / ref['task']:>9.2f} "
              f"{s['rss']:>9.0f}  {same}")
    print(json.dumps({f"{e}/{f}": {k: v for k, v in s.items() if k != "ids"} for (e, f), s in results.items()}))


def main():
    args = parse_args()
    if args.worker:
        return worker(args)
    os.makedirs(args.work, exist_ok=True)
    make_checkpoint(args)
    export_onnx(args)
    runs = {}
    plan = engines(args)
    for r in range(args.rounds):
        for engine, fmt, go in plan:
            res = go()
            runs.setdefault((engine, fmt), []).append(res)
            t = statistics.median(x["task"] for x in res["tasks"][1:] or res["tasks"])
            print(f"round {r + 1}: {engine} {fmt}: task {t:.3f} s, load {res['load']:.2f} s", file=sys.stderr)
    results = {k: summary(v) for k, v in runs.items()}
    report(results, args)
    bandwidth_report(results, args)


if __name__ == "__main__":
    main()
