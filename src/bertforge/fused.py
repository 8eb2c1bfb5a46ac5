"""The fused CPU inference path: the same encoder, with oneDNN doing more per call.

`model.py` is written to be read; this module makes the same layers cheaper to run on a CPU,
without changing their maths or the model's parameters:

1. Query, key and value are one [3H, H] matmul instead of three, and the attention layout
   (`to_sequences`) is built once for all three.
2. Every weight is re-laid-out once into oneDNN's blocked format (`_reorder_linear_weight`),
   instead of on every call as `F.linear` does.
3. The feed-forward's activation runs inside its up-projection (a oneDNN post-op), and each
   residual add inside the projection before it, so those [N, 4H] and [N, H] tensors are not
   read and written again.
4. Unpadding stays (`model.unpad`): only real tokens go through the matmuls.

The outputs equal eager PyTorch's up to summation order (about 1e-6 relative; the tests check
1e-4 on real checkpoints). The packed weights are copies: each layer notes the version counter
of every parameter it packed and packs again after any in-place change (an optimizer step, a
`load_state_dict`), so a fused model never runs stale weights. Training mode, gradients, attention
maps, non-CPU tensors and non-fp32 inputs take the eager path unchanged.

    fuse_for_inference(model)  # in place; returns model
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .model import BertLayer, BertModel
from .padding import Packing, from_sequences, to_sequences

_mkldnn = torch.ops.mkldnn
# config.hidden_act kinds that oneDNN can fuse into the up-projection, with its name and algorithm.
_POST_OPS = {torch.nn.GELU: lambda m: ("gelu", "tanh" if m.approximate == "tanh" else "none"),
             torch.nn.ReLU: lambda m: ("relu", "")}


def available() -> bool:
    """True when this torch build has the oneDNN CPU kernels the fused path uses."""
    return torch.backends.mkldnn.is_available() and hasattr(_mkldnn, "_linear_pointwise")


class _Packed:
    """One linear layer's weight in oneDNN's layout: y = act(x W^T + b) or x W^T + b + other."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, post: tuple[str, str] = ("none", "")) -> None:
        self.weight = _mkldnn._reorder_linear_weight(weight.detach().contiguous())
        self.bias = bias.detach().contiguous()
        self.post = post

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: float [..., K] -> float [..., N]."""
        return _mkldnn._linear_pointwise(x, self.weight, self.bias, self.post[0], [], self.post[1])

    def plus(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """x W^T + b + residual, in one pass over the output."""
        return _mkldnn._linear_pointwise.binary(x, residual, self.weight, self.bias, "add")


class _FusedLayer:
    """A `BertLayer`'s forward on packed weights; it packs on first use and after any change."""

    def __init__(self, layer: BertLayer) -> None:
        self.layer = layer
        self.eager: Callable = layer.forward  # the bound method of the class, kept for the fallbacks
        self.versions: list[tuple[int, int]] | None = None

    def params(self) -> list[torch.Tensor]:
        a, f = self.layer.attention, self.layer.ffn
        return [p for lin in (a.query, a.key, a.value, a.out, f.up, f.down) for p in (lin.weight, lin.bias)]

    def stamp(self) -> list[tuple[int, int]]:
        """Where each parameter's data lives and its version counter: any in-place change, or new
        data put in its place, changes one of the two."""
        return [(p.data_ptr(), p._version) for p in self.params()]

    def pack(self) -> None:
        a, f = self.layer.attention, self.layer.ffn
        self.qkv = _Packed(torch.cat([a.query.weight, a.key.weight, a.value.weight]),
                           torch.cat([a.query.bias, a.key.bias, a.value.bias]))
        self.out = _Packed(a.out.weight, a.out.bias)
        post = _POST_OPS.get(type(f.act))
        self.up = _Packed(f.up.weight, f.up.bias, post(f.act) if post else ("none", ""))
        self.act = None if post else f.act  # an activation oneDNN cannot fuse runs on its own
        self.down = _Packed(f.down.weight, f.down.bias)
        self.versions = self.stamp()

    def __call__(self, x: torch.Tensor, mask: torch.Tensor | None, output_attentions: bool = False,
                 packed: Packing | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As `BertLayer.forward`: x float [B, T, H] (or [N, H] unpadded) -> the same shape."""
        layer = self.layer
        if (output_attentions or layer.training or torch.is_grad_enabled() or x.device.type != "cpu"
                or x.dtype != torch.float32):
            return self.eager(x, mask, output_attentions, packed)
        if self.versions != self.stamp():
            self.pack()
        attention, H = layer.attention, x.shape[-1]
        qkv = self.qkv(x)  # (..., 3H)
        if packed is not None:  # one scatter into the attention layout for q, k and v together
            qkv = to_sequences(qkv, packed)
            mask = packed.key_mask
        q, k, v = qkv.split(H, dim=-1)
        context, _ = attention.attend(q, k, v, mask, False)
        if packed is not None:
            context = from_sequences(context, packed)
        x = layer.attention_norm(self.out.plus(context, x))
        hidden = self.up(x)
        if self.act is not None:
            hidden = self.act(hidden)
        return layer.ffn_norm(self.down.plus(hidden, x)), None


def fuse_for_inference(model: torch.nn.Module) -> torch.nn.Module:
    """Run `model`'s encoder layers on the fused path (see the module docstring); in place.

    The parameters, `state_dict()` and `save_pretrained` are untouched; only each layer's
    forward changes. Returns the same model, in eval mode.
    """
    if not available():
        raise RuntimeError("this torch build has no oneDNN (mkldnn) CPU kernels; use --backend torch")
    backbone = model if isinstance(model, BertModel) else model.bert
    for layer in backbone.layers:
        if isinstance(layer.forward, _FusedLayer):
            continue  # fused already
        layer.forward = _FusedLayer(layer)
    return model.eval()
