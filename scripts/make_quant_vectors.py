#!/usr/bin/env python3
"""Write tests/fixtures/quant/edge_vectors.safetensors: float32 rows chosen to stress the block quantizer
(exact rounding ties for q8 and q4, zero blocks, NaN/inf, scales that overflow or underflow float16,
subnormal scales, random rows of many magnitudes) and what scripts/convert_checkpoint.py's quantizer makes of
them (`q8`, `q4`: U8 rows in the engine's layout). tests/model/quantized_checkpoints.rs checks that the engine's
quantizer (src/quant.rs) makes the same bytes. Needs torch + safetensors.

  python3 scripts/make_quant_vectors.py
"""
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import convert_checkpoint as cc  # noqa: E402

K = 64
OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests/fixtures/quant")


def ties(qmax, step):
    """A 32-block whose largest magnitude makes d = step exactly, then exact (i + 1/2) * step ties."""
    vals = [qmax * step] + [(i + 0.5) * step * (-1) ** i for i in range(31)]
    return [max(-qmax * step, min(qmax * step, v)) for v in vals]


def main():
    g = torch.Generator().manual_seed(7)
    rows = []
    rows.append(ties(127, 2.0**-7) + ties(127, 2.0**-3))  # q8 ties
    rows.append(ties(7, 2.0**-4) + ties(7, 1.0))  # q4 ties
    nan_inf = [float("nan"), float("inf"), float("-inf")] + [0.25 * (i % 5 - 2) for i in range(29)]
    rows.append([0.0] * 32 + nan_inf)  # a zero block; non-finite values count as 0
    rows.append([3e38 * (1 if i % 2 else -1) / (1 + i) for i in range(32)] + [1e6 * (i - 16) for i in range(32)])
    rows.append([1e-9 * (i - 16) for i in range(32)] + [3e-6 * (i - 16) for i in range(32)])  # f16 under/subnormal
    rows.append([-1.0] + [0.5] * 31 + [1.0] + [-0.5] * 31)  # sign of the extreme
    for scale in (1e-4, 0.02, 1.0, 300.0):
        rows.append((torch.randn(K, generator=g) * scale).tolist())
    rows.append((torch.rand(K, generator=g) * 2 - 1).tolist())
    x = torch.tensor(rows, dtype=torch.float32)
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "edge_vectors.safetensors")
    save_file({"input": x, "q8": cc.quantize_rows(x, 8), "q4": cc.quantize_rows(x, 4)}, path, metadata={"k": str(K)})
    os.chmod(path, 0o644)
    print(f"wrote {path}: {x.shape[0]} rows of {K}")


if __name__ == "__main__":
    main()
