"""The word-embedding matrix a masked-LM decoder is tied to, with one gradient matrix instead of three.

A tied [V, E] matrix W is used twice in a pretraining step: the lookup of the N input tokens and the
decoder's product with the M masked positions. Eager autograd gives each use its own dense [V, E]
gradient: the decoder's (from its matmul), and the lookup's (a zero-filled [V, E] matrix into which
N rows are added), then adds the two into a third. On a `base` step (V = 30,522, E = 768) the zero
fill and the add moved ~280 MB for N ~ 2,000 rows of real information.

Here the decoder's gradient is the only dense one. The decoder's backward keeps it from autograd and
leaves it with the lookup, whose backward adds its N rows into it in place (`index_add_`) and
returns it as W's gradient. The lookup runs first in the forward pass, so its backward runs after
the decoder's. The decoder's backward keeps its gradient only when autograd says the lookup's
backward will run in the same call (`_will_engine_execute_node`); otherwise it passes it on as
usual. When no decoder gradient was left (an untied model, a backward that never reaches the
decoder) the lookup builds its dense gradient as torch does. So W's gradient is the same sum,
whatever the graph. Outside eager autograd (no grad, torch.compile, export) both uses are plain
`nn.Embedding` and `weight`.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class _Pending:
    """What the decoder's backward leaves for the lookup's: its dense gradient of W, the backward call
    (autograd's graph-task id) it belongs to, and the lookup's node, to ask whether it will run."""

    def __init__(self) -> None:
        self.grad: torch.Tensor | None = None
        self.task: int = -1
        self.node: weakref.ref | None = None  # weak: the lookup's node holds this object


class _DecoderUse(torch.autograd.Function):
    """W as the decoder uses it: identity forward. The backward keeps the gradient back from autograd
    and leaves it with the lookup, when autograd will run the lookup's backward in this same call;
    otherwise it passes the gradient on unchanged."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, pending: _Pending) -> torch.Tensor:
        ctx.pending = pending
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        pending, task = ctx.pending, torch._C._current_graph_task_id()
        node = pending.node() if pending.node is not None else None
        # The rows are added in place, so only into a plain dense gradient (never an expanded one).
        if (grad.layout != torch.strided or not grad.is_contiguous() or node is None
                or not torch._C._will_engine_execute_node(node)):
            return grad, None
        if pending.task == task and pending.grad is not None:  # a second decoder use of the same lookup
            pending.grad = pending.grad + grad
        else:
            pending.grad, pending.task = grad, task
        return None, None


class _Lookup(torch.autograd.Function):
    """weight[ids], whose backward adds its rows into the decoder's gradient when one was left for it."""

    @staticmethod
    def forward(ctx: Any, ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None,
                pending: _Pending) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.weight_shape, ctx.weight_dtype, ctx.padding_idx, ctx.pending = weight.shape, weight.dtype, padding_idx, pending
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor, None, None]:
        (ids,) = ctx.saved_tensors
        flat_ids, rows = ids.reshape(-1), grad.reshape(-1, grad.shape[-1]).to(ctx.weight_dtype)
        if ctx.padding_idx is not None:  # as nn.Embedding: the padding row is never trained
            rows = rows.masked_fill(flat_ids.eq(ctx.padding_idx).unsqueeze(1), 0.0)
        pending = ctx.pending
        dense = pending.grad if pending.task == torch._C._current_graph_task_id() else None
        pending.grad = None
        if dense is None:  # no decoder gradient left for this call: torch's own dense gradient
            dense = torch.zeros(ctx.weight_shape, dtype=ctx.weight_dtype, device=rows.device)
        return None, dense.index_add_(0, flat_ids, rows), None, None


class TiedEmbedding(nn.Embedding):
    """nn.Embedding (same arguments, same state dict) whose matrix a decoder may share through
    `decoder_weight()`; see the module docstring for what that saves."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending = _Pending()

    def _tracked(self) -> bool:
        return (torch.is_grad_enabled() and self.weight.requires_grad and not self.sparse
                and self.max_norm is None and not self.scale_grad_by_freq and not torch.compiler.is_compiling())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """long [...] -> float [..., E]."""
        if not self._tracked():
            return super().forward(ids)
        self._pending = _Pending()  # one per forward pass: a decoder use after it pairs with this lookup
        out = _Lookup.apply(ids, self.weight, self.padding_idx, self._pending)
        self._pending.node = weakref.ref(out.grad_fn)
        return out

    def decoder_weight(self) -> torch.Tensor:
        """The [V, E] matrix for a tied decoder: `weight` itself, whose gradient the last lookup adds into.

        It must go straight into the decoder's product (F.linear, or a cast before it: autocast's, or
        `kernels.scratch.cast`, whose gradients are their own new tensors): the
        lookup adds into the gradient that product returns, in place, which is the decoder's own."""
        if not self._tracked():
            return self.weight
        return _DecoderUse.apply(self.weight, self._pending)
