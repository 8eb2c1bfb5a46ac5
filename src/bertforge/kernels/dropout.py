"""Dropout for training on CPU with a hashed mask: drawn in a few vector instructions, never stored.

Element i of a contiguous tensor is kept when `hash(i, key) >= round(p * 2^32)` (see dropout.cpp
for the hash and why), the 64-bit key drawn from torch's default generator once per call. So the
masks follow `torch.manual_seed` and are saved and restored with the generator's state like any
other draw (exact resume holds), each DDP rank draws its own, and the backward pass recomputes the
mask from the key instead of keeping it.

`reference()` computes the same hash in torch's integer ops: the path where the native kernel
cannot be built (bit for bit the same outputs, only slower) and what the tests hold the kernel to.
Other devices and dtypes keep `torch.nn.functional.dropout`.

    y = dropout(x, p=0.1, training=True)   # float [...] -> float [...], like F.dropout
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from . import hashed_dropout

SPREAD = 0x9E3779B1  # the kernel's constants, in the same order (dropout.cpp)
MIX = (0x21F0AAAD, 0x735A2D97)
LOW32 = 0xFFFFFFFF
NATIVE_DTYPES = (torch.float32, torch.bfloat16)


def threshold(p: float) -> int:
    """The 32-bit cut for drop probability p: an element is dropped when its hash falls below it."""
    return min(round(p * 2**32), LOW32)


def _mix(h: torch.Tensor) -> torch.Tensor:
    """The kernel's 32-bit mixer on int64 tensors holding unsigned 32-bit values (no product
    overflows 63 bits: both multipliers are below 2^31)."""
    h = h ^ (h >> 16)
    h = (h * MIX[0]) & LOW32
    h = h ^ (h >> 15)
    h = (h * MIX[1]) & LOW32
    return h ^ (h >> 15)


def keep_mask(numel: int, key: int, cut: int) -> torch.Tensor:
    """bool [numel]: which elements the key keeps, computed as dropout.cpp does."""
    k0, k1 = key & LOW32, (key >> 32) & LOW32
    index = torch.arange(numel, dtype=torch.int64)
    # index * SPREAD mod 2^32 without an int64 overflow: the multiplier split into 16-bit halves.
    spread = (index * (SPREAD & 0xFFFF) + (((index * (SPREAD >> 16)) & 0xFFFF) << 16)) & LOW32
    h = _mix((spread + k0) & LOW32)
    return _mix(h ^ k1) >= cut


def reference(x: torch.Tensor, key: int, cut: int, scale: float) -> torch.Tensor:
    """The native op in torch ops: x (contiguous) -> `x * scale` where kept, 0 elsewhere."""
    keep = keep_mask(x.numel(), key, cut).view(x.shape)
    return torch.where(keep, x * scale, torch.zeros((), dtype=x.dtype))


class _HashedDropout(torch.autograd.Function):
    """y = op(x, key): the gradient is the same op on the incoming gradient, with the same key."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, key: int, cut: int, scale: float, op: Callable) -> torch.Tensor:
        ctx.args, ctx.op = (key, cut, scale), op
        return op(x.contiguous(), key, cut, scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return ctx.op(grad.contiguous(), *ctx.args), None, None, None, None


def draw_key() -> int:
    """A 64-bit key from torch's default generator (so seeding and RNG-state checkpoints cover it)."""
    return int(torch.empty((), dtype=torch.int64).random_())


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """F.dropout's contract (zero with probability p, scale the rest by 1 / (1 - p)), with a hashed
    mask for float32 and bfloat16 tensors on CPU. x: any shape -> the same shape and dtype."""
    if not training or p == 0.0:
        return x
    # Under torch.compile, Inductor generates its own fused random masks (and a key drawn on the host
    # would break the graph); elsewhere than the CPU, and for other dtypes, torch's dropout as it is.
    if torch.compiler.is_compiling() or x.device.type != "cpu" or x.dtype not in NATIVE_DTYPES or p >= 1.0:
        return F.dropout(x, p, True)
    op = hashed_dropout() or reference
    return _HashedDropout.apply(x, draw_key(), threshold(p), 1.0 / (1.0 - p), op)
