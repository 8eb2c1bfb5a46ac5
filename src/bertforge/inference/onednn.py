"""Linear layers on oneDNN with their weights packed once, and the bookkeeping that repacks them.

`F.linear` hands oneDNN a plain [out, in] weight, which it re-lays-out into its blocked format on
every call. `Packed` does that once and keeps the copy; it can also fuse an activation into the
matmul (a post-op) or add or multiply a second tensor into its output, so that tensor is not
read and written again by a separate op. `PackedBlock` is what a fused encoder block builds on:
it packs its layer's weights on first use and again after any in-place change to them.
"""

from __future__ import annotations

import torch

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


class Packed:
    """One linear layer's weight in oneDNN's layout: y = act(x W^T + b), x W^T + b + other, or
    (x W^T + b) * other. bias may be None (the bias-free layers of pre-norm families)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, post: tuple[str, str] = ("none", "")) -> None:
        self.weight = _mkldnn._reorder_linear_weight(weight.detach().contiguous())
        self.bias = bias.detach().contiguous() if bias is not None else None
        self.post = post

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: float [..., K] -> float [..., N]."""
        return _mkldnn._linear_pointwise(x, self.weight, self.bias, self.post[0], [], self.post[1])

    def plus(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """x W^T + b + residual, in one pass over the output."""
        return _mkldnn._linear_pointwise.binary(x, residual, self.weight, self.bias, "add")

    def times(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """(x W^T + b) * other, in one pass over the output."""
        return _mkldnn._linear_pointwise.binary(x, other, self.weight, self.bias, "mul")


class PackedBlock:
    """A block's forward on packed weights, packed on first use and again whenever a parameter
    changes. Subclasses list the parameters they pack (`params`) and pack them (`pack`)."""

    def __init__(self) -> None:
        self.versions: list[tuple[int, int]] | None = None

    def params(self) -> list[torch.Tensor | None]:
        raise NotImplementedError

    def pack(self) -> None:
        raise NotImplementedError

    def stamp(self) -> list[tuple[int, int]]:
        """Where each parameter's data lives and its version counter: any in-place change (an
        optimizer step, a `load_state_dict`), or new data put in its place, changes one of the two."""
        return [(p.data_ptr(), p._version) for p in self.params() if p is not None]

    def packed(self) -> None:
        """Pack now if the weights changed since the last packing (or were never packed)."""
        stamp = self.stamp()
        if self.versions != stamp:
            self.pack()
            self.versions = stamp
