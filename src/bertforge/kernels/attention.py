"""Self-attention for training on CPU over unpadded sequences, with attention dropout hashed in.

`attention(q, k, v, cu_seqlens, num_heads, dropout_p)` is what bertforge's `SelfAttention` runs in
training: per sequence and head, softmax(q k^T / sqrt(d)) with dropout on the probabilities, @ v.
The native op (`attention_train.cpp`) keeps only each sequence's probabilities between the forward
and backward passes, nh * L^2 floats and none for padding, and recomputes the dropout mask from
the index of each probability, as `kernels.dropout` does for activations: the key is one draw from
torch's default generator per call, so seeding, exact resume and each DDP rank's own stream hold.

`reference()` is the same maths in torch ops with the same dropout mask (a Python loop over the
sequences, autograd doing the backward pass): what the tests hold the kernel to, and the path
`attention()` takes where the native op cannot. The model layers take their own explicit padded
path there instead (`models.layers.fused_training`), which is faster than this loop on many
short sequences; its attention-dropout masks are drawn over the padded layout, so they differ.
Shapes: N real tokens, H = num_heads * d, S sequences.

    context = attention(q, k, v, cu_seqlens, num_heads=12, dropout_p=0.1)   # [N, H] x3 -> [N, H]
"""

from __future__ import annotations

import math

import torch

from . import varlen_attention_train
from .dropout import draw_key, keep_mask, threshold

NATIVE_HEAD_SIZES = (16, 32, 64, 128)  # the head sizes the native op is compiled for
NATIVE_DTYPES = (torch.float32, torch.bfloat16)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, num_heads: int,
              key: int, cut: int, keep_scale: float) -> torch.Tensor:
    """The native op in torch ops: q, k, v float [N, H] -> context [N, H] in q's dtype.

    Sequence s's head h drops probability (i, j) when the dropout hash of its index in the packed
    probabilities (nh * sum of the earlier sequences' L^2 + h * L^2 + i * L + j) falls below `cut`;
    cut 0 keeps everything. The arithmetic is float32, as in the kernel."""
    N, H = q.shape
    d = H // num_heads
    bounds = [int(b) for b in cu_seqlens]
    total = sum(num_heads * (b - a) ** 2 for a, b in zip(bounds, bounds[1:]))
    keep = keep_mask(total, key, cut) if cut else None
    outputs, first = [], 0
    for a, b in zip(bounds, bounds[1:]):
        L = b - a
        qs, ks, vs = (t[a:b].float().view(L, num_heads, d).transpose(0, 1) for t in (q, k, v))  # (nh, L, d)
        probs = torch.softmax((qs @ ks.transpose(1, 2)) / math.sqrt(d), dim=-1)  # (nh, L, L)
        if keep is not None:
            kept = keep[first:first + num_heads * L * L].view(num_heads, L, L)
            probs = torch.where(kept, probs * keep_scale, torch.zeros((), dtype=probs.dtype))
        first += num_heads * L * L
        outputs.append((probs @ vs).transpose(0, 1).reshape(L, H))
    return torch.cat(outputs).to(q.dtype)


class _NativeAttention(torch.autograd.Function):
    """The native forward; the backward reuses its probabilities and recomputes the dropout mask."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, num_heads, key, cut, keep_scale, ops):
        forward, ctx.backward_op = ops
        scale = 1.0 / math.sqrt(q.shape[1] // num_heads)
        out, probs = forward(q, k, v, cu_seqlens, num_heads, scale, key, cut, keep_scale)
        ctx.save_for_backward(q, k, v, probs, cu_seqlens)
        ctx.args = (num_heads, scale, key, cut, keep_scale)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, probs, cu_seqlens = ctx.saved_tensors
        dq, dk, dv = ctx.backward_op(grad.contiguous(), q, k, v, probs, cu_seqlens, *ctx.args)
        return dq, dk, dv, None, None, None, None, None, None


def amx(enabled: bool | None = None) -> bool:
    """Whether the native op runs bf16 attention's products on AMX tiles (Intel Sapphire Rapids and
    later; head sizes 32, 64 and 128): on wherever the CPU has them, as bf16 products with float32
    sums, P and dS rounded to bf16 for theirs as autocast's matmuls would round them. `enabled`
    switches it, for comparing both paths in one process; returns whether it is on now."""
    if varlen_attention_train() is None:
        return False
    return bool(torch.ops.bertforge.attention_amx(-1 if enabled is None else int(enabled)))


def native(q: torch.Tensor, num_heads: int) -> bool:
    """Whether the native op takes these queries (float [..., H]): CPU, float32 or bf16, a head size
    it is built for."""
    return (q.device.type == "cpu" and q.dtype in NATIVE_DTYPES and q.shape[-1] % num_heads == 0
            and q.shape[-1] // num_heads in NATIVE_HEAD_SIZES and varlen_attention_train() is not None)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, num_heads: int,
              dropout_p: float) -> torch.Tensor:
    """Training attention over unpadded sequences.

    q, k, v: float [N, H], the N real tokens of the S sequences back to back;
    cu_seqlens: int [S + 1], where each sequence begins (0 first, N last);
    dropout_p: the attention-probability dropout, hashed (a key is drawn only when it is > 0).
    Returns the context, float [N, H] in q's dtype."""
    key, cut, keep_scale = 0, 0, 1.0
    if dropout_p > 0.0:
        key, cut, keep_scale = draw_key(), threshold(dropout_p), 1.0 / (1.0 - dropout_p)
    cu = cu_seqlens.to(torch.int64)
    if native(q, num_heads):
        return _NativeAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), cu, num_heads, key, cut,
                                      keep_scale, varlen_attention_train())
    return reference(q, k, v, cu, num_heads, key, cut, keep_scale)
