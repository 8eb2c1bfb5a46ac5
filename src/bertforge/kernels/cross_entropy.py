"""Cross-entropy over a large vocabulary for training on CPU: the masked-LM loss on a native kernel.

`cross_entropy(logits, targets)` is `F.cross_entropy(logits.float(), targets)` (the mean over rows)
computed without the [M, V] float32 tensors torch's log-softmax writes forward and backward: each
row's max and log-sum-exp are found in two reads, and the gradient, softmax minus the one-hot
target, is written straight in the logits' dtype (`cross_entropy.cpp`). bf16 logits (autocast's
decoder) are read as they are; the arithmetic is float32. Where the native op cannot be had (no
compiler, another device, another dtype, under torch.compile) it is torch's own.

`linear_cross_entropy(x, weight, bias, targets, scratch)` is the decoder and the loss in one
autograd node: `logits = F.linear(x, weight, bias)` and their mean cross-entropy, the same products
on torch's BLAS, with the float32 logits and their gradient written into reused memory (`Scratch`)
instead of fresh pages every step. It applies to float32 training on the CPU when nothing
intercepts the decoder's `F.linear`: no autocast, and no torch function mode but those that say they
leave float32 linears alone (`leaves_fp32_linear`; `--matmul`'s routing does not, bf16's bucketing
does). Otherwise it returns None, for the caller to take the two steps.

    loss = cross_entropy(logits, targets)   # float [M, V], long [M] -> float32 scalar
    logits, loss = linear_cross_entropy(x, weight, bias, targets, scratch) or (the two steps)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import _get_current_function_mode_stack

from . import native_cross_entropy
from .scratch import Scratch

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


class _LinearCrossEntropy(torch.autograd.Function):
    """logits = x W^T + b, and per-row losses; the backward pass writes the logits' gradient into the
    scratch, then dX = G W, dW = G^T X, db = sum G, as torch's addmm backward computes them."""

    @staticmethod
    def forward(ctx, x, weight, bias, targets, scratch, ops):
        forward, ctx.backward_op = ops
        logits = scratch.take((x.shape[0], weight.shape[0]), x.dtype)
        if bias is None:
            torch.mm(x, weight.t(), out=logits)
        else:
            torch.addmm(bias, x, weight.t(), out=logits)
        losses, lse = forward(logits, targets)
        ctx.save_for_backward(x, weight, logits, targets, lse)
        ctx.scratch, ctx.has_bias = scratch, bias is not None
        ctx.set_materialize_grads(False)
        return logits, losses

    @staticmethod
    def backward(ctx, grad_logits, grad_losses):
        x, weight, logits, targets, lse = ctx.saved_tensors
        grad = grad_logits
        if grad_losses is not None:
            grad = ctx.backward_op(grad_losses.float().contiguous(), logits, targets, lse,
                                   ctx.scratch.take(logits.shape, logits.dtype))
            if grad_logits is not None:  # the caller used the logits in its own loss too
                grad.add_(grad_logits)
        if grad is None:
            return None, None, None, None, None, None
        dx = grad.mm(weight) if ctx.needs_input_grad[0] else None
        # The [V, E] weight's gradient (94 MB at `base`) on scratch memory too; autograd takes it as the
        # parameter's gradient, and the block comes back once that gradient is dropped (zero_grad).
        dw = torch.mm(grad.t(), x, out=ctx.scratch.take(tuple(weight.shape), weight.dtype)) \
            if ctx.needs_input_grad[1] else None
        db = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db, None, None, None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits float [M, V] (M >= 1) against targets long [M], each in [0, V);
    a float32 scalar, as `F.cross_entropy(logits.float(), targets)` gives."""
    ops = None
    if logits.device.type == "cpu" and logits.dtype in NATIVE_DTYPES and not torch.compiler.is_compiling():
        ops = native_cross_entropy()
    if ops is None:
        return F.cross_entropy(logits.float(), targets)
    return _NativeCrossEntropy.apply(logits.contiguous(), targets.contiguous(), ops).mean()


def _linear_left_alone() -> bool:
    """Whether every torch function mode now active says it leaves a float32 F.linear as it is: one that
    might route it elsewhere (or record it) must see the decoder's product as an F.linear."""
    return (not torch._C._is_torch_function_mode_enabled()
            or all(getattr(mode, "leaves_fp32_linear", False) for mode in _get_current_function_mode_stack()))


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                         scratch: Scratch) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(logits, loss) of `F.linear(x, weight, bias)` and `cross_entropy(logits, targets)`, or None where
    this path does not apply (see the module's docstring).

    x: float32 [M, E] (M >= 1); weight: float32 [V, E]; bias: float32 [V] or None; targets: long [M]
    -> logits float32 [M, V] (on scratch memory), loss float32 scalar.
    """
    if not (x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32 and x.dim() == 2
            and (bias is None or bias.dtype == torch.float32) and torch.is_grad_enabled()
            and not torch.is_autocast_enabled("cpu") and _linear_left_alone() and not torch.compiler.is_compiling()):
        return None
    ops = native_cross_entropy()
    if ops is None:
        return None
    logits, losses = _LinearCrossEntropy.apply(x.contiguous(), weight, bias, targets.contiguous(), scratch, ops)
    return logits, losses.mean()
