#!/usr/bin/env python3
"""Reference data for the beam-search bookkeeping (tests/model/beam_scripted.rs): transformers' own beam search
(`generate(num_beams=...)`, transformers 5.24, `_beam_search`) run on a scripted "model" whose next-token
logits are a seeded random function of the whole sequence (decoder-only, prompt = the decoder start token
2, so `decoder_prompt_len` = 1 exactly as Florence-2's decoder).

For every scenario (beams, early_stopping true/false/"never", length_penalty, no-repeat-n-gram, forced
BOS/EOS, max_length, EOS boost) it records the kwargs, every log-prob row the reference computed
(`log_softmax` of the logits, float32, keyed by the sequence it continues) and the returned ids. The Rust
test replays those rows through `model::generate::beam` and must return the same ids.

Run: python3 scripts/make_beam_scripted.py  (writes tests/beam_scripted/reference.json; deterministic)
"""
import hashlib
import itertools
import json
import os

import torch
from torch import nn
import transformers
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

V = 12
EOS, PAD, BOS, START = 2, 1, 0, 2


class Cfg(PretrainedConfig):
    model_type = "scripted"


class Scripted(PreTrainedModel, GenerationMixin):
    config_class = Cfg

    def __init__(self, cfg, salt, eos_boost):
        super().__init__(cfg)
        self.dummy = nn.Parameter(torch.zeros(1))
        self.salt, self.eos_boost = salt, eos_boost
        self.rows = {}

    def logits_of(self, seq):
        h = int(hashlib.sha256(f"{self.salt}:{list(seq)}".encode()).hexdigest()[:8], 16)
        x = torch.randn(V, generator=torch.Generator().manual_seed(h)) * 2.0
        x[EOS] += self.eos_boost
        return x

    def forward(self, input_ids, attention_mask=None, **kw):
        b, t = input_ids.shape
        logits = torch.zeros(b, t, V)
        for i in range(b):
            seq = tuple(input_ids[i].tolist())
            logits[i, -1] = self.logits_of(seq)
        # What _beam_search computes from them (same op, same dtype).
        lp = nn.functional.log_softmax(logits[:, -1, :].to(torch.float32), dim=-1)
        for i in range(b):
            self.rows[",".join(map(str, input_ids[i].tolist()))] = lp[i].tolist()
        return CausalLMOutput(logits=logits)


def main():
    torch.set_num_threads(1)
    scenarios = []
    grid = itertools.product(
        [2, 3, 4],  # beams
        [True, False, "never"],
        [1.0, 0.0, 2.0, -0.5],  # length_penalty
        [0, 2],  # no_repeat_ngram_size
        [True, False],  # forced BOS / EOS
        [(7, 0.0), (10, 1.5)],  # (max_length, EOS logit boost)
    )
    for nb, early, lp, nrng, forced, (max_length, boost) in grid:
        # The same scripted model for the three early_stopping values, so their answers can be compared.
        salt = f"{nb}/{lp}/{nrng}/{forced}/{max_length}"
        m = Scripted(Cfg(vocab_size=V), salt, boost).eval()
        kwargs = dict(
            num_beams=nb,
            early_stopping=early,
            length_penalty=lp,
            no_repeat_ngram_size=nrng,
            max_length=max_length,
            do_sample=False,
            use_cache=False,
            eos_token_id=EOS,
            pad_token_id=PAD,
            bos_token_id=BOS,
        )
        if forced:
            kwargs.update(forced_bos_token_id=BOS, forced_eos_token_id=EOS)
        with torch.no_grad():
            out = m.generate(
                input_ids=torch.tensor([[START]]),
                attention_mask=torch.ones(1, 1, dtype=torch.long),
                **kwargs,
            )
        scenarios.append(
            {
                "salt": salt,
                "kwargs": {k: v for k, v in kwargs.items() if k not in ("do_sample", "use_cache")},
                "token_ids": out[0].tolist(),
                "rows": m.rows,
            }
        )
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "beam_scripted", "reference.json")
    meta = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "vocab": V,
        "start": START,
        "scenarios": scenarios,
    }
    with open(path, "w") as f:
        json.dump(meta, f, separators=(",", ":"))
    lens = [len(s["token_ids"]) for s in scenarios]
    natural = sum(1 for s in scenarios if len(s["token_ids"]) < s["kwargs"]["max_length"])
    groups = {}
    for s in scenarios:
        groups.setdefault(s["salt"], set()).add(tuple(s["token_ids"]))
    differ = sum(1 for g in groups.values() if len(g) > 1)
    print(f"{len(scenarios)} scenarios, lengths {min(lens)}..{max(lens)}, {natural} end before max_length, "
          f"early_stopping changes the answer in {differ} of {len(groups)} settings")


if __name__ == "__main__":
    main()
