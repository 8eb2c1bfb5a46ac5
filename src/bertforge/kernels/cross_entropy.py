"""Cross-entropy over a large vocabulary for training on CPU: the masked-LM loss on a native kernel.

`cross_entropy(logits, targets)` is `F.cross_entropy(logits.float(), targets)` (the mean over rows)
computed without the [M, V] float32 tensors torch's log-softmax writes forward and backward: each
row's max and log-sum-exp are found in two reads, and the gradient, softmax minus the one-hot
target, is written straight in the logits' dtype (`cross_entropy.cpp`). bf16 logits (autocast's
decoder) are read as they are; the arithmetic is float32. Where the native op cannot be had (no
compiler, another device, another dtype, under torch.compile) it is torch's own.

    loss = cross_entropy(logits, targets)   # float [M, V], long [M] -> float32 scalar
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import native_cross_entropy

NATIVE_DTYPES = (torch.float32, torch.bfloat16)


class _NativeCrossEntropy(torch.autograd.Function):
    """Per-row losses; the backward pass reads the logits once more with the saved log-sum-exps."""

    @staticmethod
    def forward(ctx, logits, targets, ops):
        forward, ctx.backward_op = ops
        losses, lse = forward(logits, targets)
        ctx.save_for_backward(logits, targets, lse)
        return losses

    @staticmethod
    def backward(ctx, grad):
        logits, targets, lse = ctx.saved_tensors
        return ctx.backward_op(grad.float().contiguous(), logits, targets, lse), None, None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits float [M, V] (M >= 1) against targets long [M], each in [0, V);
    a float32 scalar, as `F.cross_entropy(logits.float(), targets)` gives."""
    ops = None
    if logits.device.type == "cpu" and logits.dtype in NATIVE_DTYPES and not torch.compiler.is_compiling():
        ops = native_cross_entropy()
    if ops is None:
        return F.cross_entropy(logits.float(), targets)
    return _NativeCrossEntropy.apply(logits.contiguous(), targets.contiguous(), ops).mean()
