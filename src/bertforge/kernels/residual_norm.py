"""A post-LN block's `LayerNorm(x + y)` for training on CPU, on the native kernel (residual_norm.cpp).

In torch ops the add and the LayerNorm are separate passes over [N, H], and under bf16 autocast y
(a bf16 matmul's output) is first widened into a float32 copy by type promotion; the backward pass
adds a cast of the gradient for y. The kernel makes each direction one pass and keeps x + y for the
backward pass, as torch's LayerNorm keeps its input. The numbers are torch's up to float32 rounding
(tests/test_residual_norm.py). Anywhere else (no kernel, other devices or dtypes, no gradient, a
LayerNorm without both affine parameters, torch.compile) it is `norm(x + y)` as it was.

    x = residual_layer_norm(self.attention_norm, x, self.dropout(attended))
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from . import residual_layer_norm as native_ops


class _ResidualLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                eps: float, ops: tuple) -> torch.Tensor:
        H = x.shape[-1]
        out, s, mean, rstd = ops[0](x.reshape(-1, H), y.reshape(-1, H), weight, bias, eps)
        ctx.save_for_backward(s, mean, rstd, weight)
        ctx.shape, ctx.y_dtype, ctx.backward_op = x.shape, y.dtype, ops[1]
        return out.view(x.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        s, mean, rstd, weight = ctx.saved_tensors
        y_bf16 = ctx.y_dtype == torch.bfloat16
        dx, dy, dw, db = ctx.backward_op(grad.reshape(s.shape).float().contiguous(), s, mean, rstd, weight, y_bf16)
        dx = dx.view(ctx.shape)
        return dx, (dy.view(ctx.shape) if y_bf16 else dx), dw, db, None, None


def _native(norm: nn.LayerNorm, x: torch.Tensor, y: torch.Tensor) -> tuple | None:
    """The kernel's ops when they apply to this call, else None."""
    if (torch.compiler.is_compiling() or not torch.is_grad_enabled() or x.device.type != "cpu"
            or x.dtype != torch.float32 or y.dtype not in (torch.float32, torch.bfloat16) or x.shape != y.shape
            or x.dim() < 2 or norm.weight is None or norm.bias is None or norm.weight.dtype != torch.float32
            or norm.bias.dtype != torch.float32 or tuple(norm.normalized_shape) != (x.shape[-1],)):
        return None
    return native_ops()


def residual_layer_norm(norm: nn.LayerNorm, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """norm(x + y): x float32 [..., H] (the residual stream), y float32 or bf16 of the same shape -> float32 [..., H]."""
    ops = _native(norm, x, y)
    if ops is None:
        return norm(x + y)
    return _ResidualLayerNorm.apply(x.contiguous(), y.contiguous(), norm.weight, norm.bias, norm.eps, ops)
