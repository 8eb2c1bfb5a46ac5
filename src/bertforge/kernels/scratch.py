"""Reused memory for a training step's largest short-lived tensors on the CPU.

glibc's malloc serves a block over its mmap threshold (32 MB at most) with fresh pages from the
kernel and hands them back when the block is freed, so a tensor that size made every step is
faulted in and zeroed by the kernel every step: on this project's host, writing 35 MB into fresh
pages took ~11 ms against ~1 ms into pages already mapped. The masked-LM decoder's float32 logits
[M, V] and their gradient are such tensors (M ~ 300 masked positions × 30,522 words: 35 MB each,
twice a step), and so are its [V, E] weight's gradient and, under bf16 autocast, the weight's bf16
copy and its gradient's float32 copy back. A `Scratch` keeps a few blocks and carves tensors out
of them; `cast` is a tensor's dtype cast, as autograd sees it, with both copies on scratch memory.

A block is handed out again only when nothing but the scratch holds its memory (the storage's use
count, which every view and saved tensor raises), so a tensor someone still holds (a `logits` the
caller kept, one autograd saved for the backward pass) is never written over: that request gets
another block, or fresh memory when `max_blocks` are all held.

    scratch = Scratch()
    logits = scratch.take((M, V), torch.float32)   # uninitialised, like torch.empty
    w16 = cast(weight, torch.bfloat16, scratch)    # weight.to(torch.bfloat16), gradient included
"""

from __future__ import annotations

import math
import threading

import torch

# torch's count of references to a storage (every tensor and view on it); without it nothing is reused.
_use_count = getattr(torch._C, "_storage_Use_Count", None)


def _refs(block: torch.Tensor) -> int:
    return _use_count(block.untyped_storage()._cdata)


class Scratch:
    """Up to `max_blocks` reusable CPU blocks; `take` returns a tensor on a block nobody else holds."""

    def __init__(self, max_blocks: int = 4) -> None:
        self.max_blocks = max_blocks
        self._blocks: list[tuple[torch.Tensor, int]] = []  # (block, its use count when only we hold it)
        self._lock = threading.Lock()

    # A copy (copy.deepcopy of a model, pickling) starts empty: blocks are per process and per model.
    def __getstate__(self) -> dict:
        return {"max_blocks": self.max_blocks}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["max_blocks"])

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised contiguous CPU tensor of `shape` and `dtype`, on a reused block when one is
        free and large enough (the smallest such), else on a new block kept for next time (replacing the
        smallest free one when all `max_blocks` are kept), else (every block held) on fresh memory."""
        nbytes = math.prod(shape) * dtype.itemsize
        if _use_count is None or nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        with self._lock:
            free = [i for i, (block, alone) in enumerate(self._blocks) if _refs(block) == alone]
            fits = [i for i in free if self._blocks[i][0].numel() >= nbytes]
            if fits:
                block = self._blocks[min(fits, key=lambda i: self._blocks[i][0].numel())][0]
            elif free or len(self._blocks) < self.max_blocks:
                if len(self._blocks) >= self.max_blocks:
                    self._blocks.pop(min(free, key=lambda i: self._blocks[i][0].numel()))
                # An eighth more than asked, so that the next step's slightly larger M fits too.
                block = torch.empty(nbytes + nbytes // 8, dtype=torch.uint8)
                self._blocks.append((block, _refs(block)))
            else:
                return torch.empty(shape, dtype=dtype)
            # A tensor on the block's memory, not a view of the block: autograd treats it as any new tensor.
            return torch.empty(0, dtype=dtype).set_(block.untyped_storage(), 0, shape)


class _Cast(torch.autograd.Function):
    """x.to(dtype) into scratch memory; the backward pass casts the gradient back the same way."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dtype: torch.dtype, scratch: Scratch) -> torch.Tensor:
        ctx.dtype, ctx.scratch = x.dtype, scratch
        return scratch.take(tuple(x.shape), dtype).copy_(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return ctx.scratch.take(tuple(grad.shape), ctx.dtype).copy_(grad), None, None


def cast(x: torch.Tensor, dtype: torch.dtype, scratch: Scratch) -> torch.Tensor:
    """`x.to(dtype)` for a CPU tensor, the same values forward and backward (autograd's gradient of a
    cast is the gradient cast back), with the copy and the gradient's copy on `scratch` memory."""
    return _Cast.apply(x, dtype, scratch)
