"""Which arithmetic a training run uses: `--precision fp32`, `bf16`, or `auto` (the default).

bf16 here is mixed precision as the fast CPU and GPU training stacks do it: `torch.autocast` runs
the matrix multiplications (linear layers, attention) in bfloat16, while the master weights, their
gradients and the optimizer's moments stay float32. PyTorch's CPU kernels for LayerNorm and softmax
accumulate bf16 inputs in float32, and every loss is computed on float32 logits (`models/heads.py`).
bf16 keeps float32's exponent range, so no loss scaling is needed.

`auto` picks bf16 where the hardware multiplies bf16 natively, and fp32 elsewhere:
- a CPU with AMX tiles (Sapphire Rapids and later Xeons) or AVX512-BF16 (Cooper Lake, Zen 4 and
  later): there a bf16 matmul ran 6.2x the fp32 one (2,253 vs 362 GFLOP/s, 2048², on a 2-core AMX
  Xeon; `benchmarks/train_peak.py`), and a whole training step 1.42x even at the main job's `tiny`
  size, whose matmuls are the smallest (docs/notes/2026-12-02-retired-benchmarks.md);
- a CUDA GPU that supports bf16 (Ampere and later);
- anything else runs fp32, where emulated bf16 would be slower, not faster.

Whether bf16 trains as well is measured, not assumed (`benchmarks/precision_quality.py`, results in
docs/results.md). A resumed run keeps the precision it started with, whatever `auto` would choose on
the machine it resumes on, so that the resume stays exact.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

PRECISIONS = ("auto", "fp32", "bf16")


def native_bf16(device: torch.device) -> str | None:
    """Why `device` multiplies bf16 natively (a few words), or None when it does not."""
    if device.type == "cuda":
        return "this GPU supports bf16" if torch.cuda.is_bf16_supported() else None
    if device.type == "cpu":
        if getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)():
            return "this CPU has AMX (bf16 matrix tiles)"
        if getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)():
            return "this CPU has AVX512-BF16"
    return None


def resolve(precision: str, device: torch.device) -> tuple[str, str]:
    """(fp32 or bf16, the reason in a few words) for a `--precision` setting on `device`."""
    if precision != "auto":
        return precision, "as asked"
    why = native_bf16(device)
    if why:
        return "bf16", f"auto: {why}; master weights and optimizer state stay fp32"
    return "fp32", f"auto: this {device.type.upper()} has no native bf16 arithmetic"


def autocast_for(precision: str, device: torch.device) -> Callable[[], contextlib.AbstractContextManager]:
    """The context the forward pass runs in: bf16 autocast, or nothing."""
    if precision == "bf16":
        return lambda: torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext
