"""Linear layers on oneDNN with their weights packed once, and the bookkeeping that repacks them.

`F.linear` hands oneDNN a plain [out, in] weight, which it re-lays-out into its blocked format on
every call. `Packed` does that once and keeps the copy; it can also fuse an activation into the
matmul (a post-op) or add or multiply a second tensor into its output, so that tensor is not
read and written again by a separate op. `PackedBlock` is what a fused encoder block builds on:
it packs its layer's weights on first use and again after any in-place change to them.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import kernels
from ..models.padding import bucket_rows

_mkldnn = torch.ops.mkldnn
# Activations oneDNN can fuse into a matmul, by module type: its name and algorithm.
POST_OPS = {torch.nn.GELU: lambda m: ("gelu", "tanh" if m.approximate == "tanh" else "none"),
            torch.nn.ReLU: lambda m: ("relu", "")}


def available() -> bool:
    """True when this torch build has the oneDNN CPU kernels the fused paths use."""
    return torch.backends.mkldnn.is_available() and hasattr(_mkldnn, "_linear_pointwise")


def post_op(act: torch.nn.Module) -> tuple[str, str] | None:
    """oneDNN's (name, algorithm) for an activation module, or None where it has no such post-op."""
    make = POST_OPS.get(type(act))
    return make(act) if make else None


def matmul_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The dtype a fused block runs its matmuls in for the hidden states x: float32, or bfloat16
    under CPU autocast to bfloat16 (the residual stream, LayerNorms and attention's softmax stay
    float32, as autocast keeps them); None where only the eager block can honour the request
    (x not float32, or autocast to another dtype)."""
    if x.dtype != torch.float32:
        return None
    if not torch.is_autocast_enabled("cpu"):
        return torch.float32
    return torch.bfloat16 if torch.get_autocast_dtype("cpu") == torch.bfloat16 else None


def matmul_rows(n: int, unpadded: bool, dtype: torch.dtype) -> int:
    """How many rows a fused block hands its matmuls for n tokens: in bf16 on unpadded tokens, n rounded
    up to a bucket (`padding.bucket_rows`; zero rows below the real ones, which attention never reads
    and the block drops at its end), else n. oneDNN compiles its bf16 matmuls anew for each new row
    count (~1-20 ms each, ~10x the product at sentence batches; docs/notes/2026-12-02-retired-benchmarks.md), and an
    unpadded batch has a new count nearly every time. Its fp32 products showed no such cost."""
    return bucket_rows(n) if unpadded and dtype == torch.bfloat16 else n


class Packed:
    """One linear layer's weight in oneDNN's layout: y = act(x W^T + b), x W^T + b + other, or
    (x W^T + b) * other. bias may be None (the bias-free layers of pre-norm families). dtype is
    what the weight is packed in, float32 or bfloat16; x and other must then be of that dtype."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, post: tuple[str, str] = ("none", ""),
                 dtype: torch.dtype = torch.float32) -> None:
        self.dtype = dtype
        self.weight = _mkldnn._reorder_linear_weight(weight.detach().to(dtype).contiguous())
        self.bias = bias.detach().to(dtype).contiguous() if bias is not None else None
        self.post = post

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., K] -> [..., N], in the packed dtype."""
        return _mkldnn._linear_pointwise(x, self.weight, self.bias, self.post[0], [], self.post[1])

    def plus(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """x W^T + b + residual, in one pass over the output."""
        return _mkldnn._linear_pointwise.binary(x, residual, self.weight, self.bias, "add")

    def times(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """(x W^T + b) * other, in one pass over the output."""
        return _mkldnn._linear_pointwise.binary(x, other, self.weight, self.bias, "mul")


def residual(linear: Packed, x: torch.Tensor, stream: torch.Tensor) -> torch.Tensor:
    """stream + linear(x), the residual stream float32: in one pass over the output where the
    weights are float32; a bfloat16 matmul's output is added to the stream on its own (in one
    native pass, `kernels.add_bf16`, where the kernels are built)."""
    if linear.dtype == torch.float32:
        return linear.plus(x, stream)
    y = linear(x.to(linear.dtype))
    add = kernels.add_bf16() if linear.dtype == torch.bfloat16 and stream.is_contiguous() else None
    # torch's mixed add would first widen y into a float32 copy: two passes where the kernel takes one
    if add is None or not y.is_contiguous() or y.shape != stream.shape:
        return stream + y
    H = stream.shape[-1]
    return add(stream.view(-1, H), y.view(-1, H)).view(stream.shape)


class PackedBlock:
    """A block's forward on packed weights, packed on first use for each dtype asked for, and again
    whenever a parameter changes. Subclasses list the parameters they pack (`params`) and pack
    them (`pack`, returning whatever their forward reads)."""

    def __init__(self) -> None:
        self.versions: list[tuple[int, int]] | None = None
        self.packs: dict[torch.dtype, Any] = {}

    def params(self) -> list[torch.Tensor | None]:
        raise NotImplementedError

    def pack(self, dtype: torch.dtype) -> Any:
        raise NotImplementedError

    def stamp(self) -> list[tuple[int, int]]:
        """Where each parameter's data lives and its version counter: any in-place change (an
        optimizer step, a `load_state_dict`), or new data put in its place, changes one of the two."""
        return [(p.data_ptr(), p._version) for p in self.params() if p is not None]

    def packed(self, dtype: torch.dtype = torch.float32) -> Any:
        """The weights packed in `dtype`, packed now if they changed since (or were never packed)."""
        stamp = self.stamp()
        if self.versions != stamp:
            self.packs.clear()
            self.versions = stamp
        if dtype not in self.packs:
            self.packs[dtype] = self.pack(dtype)
        return self.packs[dtype]
