"""The fused CPU inference path: the same encoder, with oneDNN doing more per call.

`models/bert.py` is written to be read; this module makes the same layers cheaper to run on a CPU,
without changing their maths or the model's parameters:

1. Query, key and value are one [3H, H] matmul instead of three, and the attention layout
   (`to_sequences`) is built once for all three.
2. Every weight is re-laid-out once into oneDNN's blocked format (`_reorder_linear_weight`),
   instead of on every call as `F.linear` does.
3. The feed-forward's activation runs inside its up-projection (a oneDNN post-op), and each
   residual add inside the projection before it, so those [N, 4H] and [N, H] tensors are not
   read and written again.
4. Unpadding stays (`model.unpad`): only real tokens go through the matmuls.
5. Attention on unpadded tokens runs in a native kernel (`kernels/varlen_attention.cpp`,
   compiled on first use): each head of each sequence reads its rows of the [N, 3H] QKV
   output where they lie, so nothing is scattered into a padded layout, masked or gathered
   back. In PyTorch ops that glue took ~1.2 ms of a ~1.3 ms attention per layer (MiniLM,
   a sorted SST-2 batch of 32, AMD EPYC, 2 cores); the kernel does the whole of it in ~0.46 ms.
   Without a compiler, and for padded batches, attention is two batched matmuls around a
   softmax (`_attention`), which beat SDPA here: its CPU kernel is tiled for long sequences,
   and on SST-2's ~25 tokens it took 13% of the encoder's time for ~1% of its FLOPs. Either
   way the query's 1/sqrt(head_dim) is folded into the packed query weights.

ModernBERT's pre-norm rotary blocks get the same treatment in `fused_modern.py` (rotary and
the local window inside the kernel, GeGLU as fused matmuls). DeBERTa's blocks are fused as BERT's,
with attention in its own native kernel (`kernels/disentangled_attention.cpp`).
Packed weights and their repacking live in `onednn.py`.

The outputs equal eager PyTorch's up to summation order (about 1e-6 relative; the tests check
1e-4 on real checkpoints). The packed weights are copies: each layer notes the version counter
of every parameter it packed and packs again after any in-place change (an optimizer step, a
`load_state_dict`), so a fused model never runs stale weights. Under CPU autocast to bfloat16
the matmuls run in bfloat16 on weights packed in bfloat16 once (eager autocast casts each weight on
every call); the residual stream, LayerNorms and attention stay float32. Training mode, gradients,
attention maps, non-CPU tensors, non-fp32 inputs and autocast to other dtypes take the eager path
unchanged.

    fuse_for_inference(model)  # in place; returns model
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from .. import kernels
from ..models.bert import BertModel
from ..models.deberta_v2 import DisentangledAttention
from ..models.layers import BertLayer, SelfAttention
from ..models.padding import Packing, from_sequences, pad_rows, to_sequences, varlen
from .fused_modern import fuse_prenorm_layers
from .onednn import Packed, PackedBlock, available, matmul_dtype, matmul_rows, post_op, residual

__all__ = ["available", "fuse_for_inference"]

class _FusedLayer(PackedBlock):
    """A `BertLayer`'s forward on packed weights; it packs on first use and after any change."""

    def __init__(self, layer: BertLayer, attend: Callable | None) -> None:
        super().__init__()
        self.layer = layer
        self.eager: Callable = layer.forward  # the bound method of the class, kept for the fallbacks
        self.attend = attend  # the native varlen attention op, or None for PyTorch ops

    def params(self) -> list[torch.Tensor]:
        a, f = self.layer.attention, self.layer.ffn
        return [p for lin in (a.query, a.key, a.value, a.out, f.up, f.down) for p in (lin.weight, lin.bias)]

    def pack(self, dtype: torch.dtype) -> SimpleNamespace:
        a, f = self.layer.attention, self.layer.ffn
        scale = self.query_scale()
        post = post_op(f.act)
        return SimpleNamespace(
            qkv=Packed(torch.cat([a.query.weight * scale, a.key.weight, a.value.weight]),
                       torch.cat([a.query.bias * scale, a.key.bias, a.value.bias]), dtype=dtype),
            out=Packed(a.out.weight, a.out.bias, dtype=dtype),
            up=Packed(f.up.weight, f.up.bias, post or ("none", ""), dtype=dtype),
            act=None if post else f.act,  # an activation oneDNN cannot fuse runs on its own
            down=Packed(f.down.weight, f.down.bias, dtype=dtype))

    def query_scale(self) -> float:
        """What the packed query rows are multiplied by: softmax(q k^T / sqrt(d)), divided once, here."""
        return 1 / math.sqrt(self.layer.attention.head_dim)

    def __call__(self, x: torch.Tensor, mask: torch.Tensor | None, output_attentions: bool = False,
                 packed: Packing | None = None, **attention_args: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As `BertLayer.forward`: x float [B, T, H] (or [N, H] unpadded) -> the same shape."""
        layer = self.layer
        dtype = matmul_dtype(x)
        if (output_attentions or layer.training or torch.is_grad_enabled() or x.device.type != "cpu" or dtype is None
                or not self.takes(dtype, mask, packed, attention_args)):
            return self.eager(x, mask, output_attentions, packed, **attention_args)
        w = self.packed(dtype)
        n = x.shape[0]
        rows = matmul_rows(n, packed is not None, dtype)  # a bucket in bf16, so oneDNN reuses its matmuls
        with torch.autocast("cpu", enabled=False):  # each op below runs in the dtype chosen for it
            stream = pad_rows(x, rows) if rows != n else x
            qkv = w.qkv(stream.to(dtype))  # (..., 3H)
            context = self.context(w, qkv[:n], x, mask, packed, **attention_args)
            if rows != n:
                context = pad_rows(context, rows)
            stream = layer.attention_norm(residual(w.out, context, stream))
            hidden = w.up(stream.to(dtype))
            if w.act is not None:
                hidden = w.act(hidden)
            return layer.ffn_norm(residual(w.down, hidden, stream))[:n], None

    def takes(self, dtype: torch.dtype, mask: torch.Tensor | None, packed: Packing | None, attention_args: dict) -> bool:
        """Whether this call runs fused (the checks every fused block makes are done already)."""
        return True

    def context(self, w: SimpleNamespace, qkv: torch.Tensor, x: torch.Tensor, mask: torch.Tensor | None,
                packed: Packing | None, bias: torch.Tensor | None = None) -> torch.Tensor:
        """Attention: qkv [..., 3H] (the query pre-scaled) -> the context, shaped like x. bias: MPNet's
        float [1, nh, T, T] score bias (`SelfAttention.forward`), which the native kernel does not take."""
        H = x.shape[-1]
        heads = self.layer.attention.num_heads
        attend = self.attend if bias is None else None
        if packed is None:  # the padded batch [B, T, H], with no mask or a [B, 1, 1|T, T] one
            B, T = x.shape[:2]
            if mask is None and attend is not None:  # no padding: B sequences of T tokens
                starts = torch.arange(0, B * T + 1, T, dtype=torch.int32)
                return attend(qkv.view(B * T, 3 * H), starts, heads).view(B, T, H)
            return _attention(qkv.view(B * T, 3 * H), B, T, heads, mask, bias).view(B, T, H)
        if attend is not None:  # straight on the real tokens, sequence by sequence
            return attend(qkv, packed.cu_seqlens, heads)
        if packed.key_mask is None and packed.num_seqs * packed.max_seqlen == x.shape[0]:
            # Every sequence is full length: the real tokens already are the attention layout.
            return _attention(qkv, packed.num_seqs, packed.max_seqlen, heads, None, bias)
        # One scatter into the attention layout for q, k and v together, one gather back.
        S, T = packed.num_seqs, packed.max_seqlen
        context = _attention(to_sequences(qkv, packed).view(S * T, 3 * H), S, T, heads, packed.key_mask, bias)
        return from_sequences(context.view(S, T, H), packed)


class _FusedDisentangledLayer(_FusedLayer):
    """A DeBERTa block (`BertLayer` around `DisentangledAttention`): its matmuls on weights packed once
    with GELU and the residual adds fused (as BERT's), attention in the native disentangled kernel,
    reading q, k and v where the one QKV matmul left them and the distance table projected by the
    same packed matmul (v3 shares its keys; separate position projections, a masked padded batch or
    no kernel run the block eager). Measured against the eager block with the same kernel, fp32,
    interleaved: 1.04 ± 0.03x on batches of 32 sentences, 1.04x at 8 x 512 tokens (before the kernel,
    packing alone was 0.95x: MKL's fp32 matmul beats oneDNN's on this project's AMX host)."""

    def query_scale(self) -> float:
        return 1.0  # DeBERTa scales scores by 1/sqrt(d (1 + terms)), which its kernel applies

    def takes(self, dtype: torch.dtype, mask: torch.Tensor | None, packed: Packing | None, attention_args: dict) -> bool:
        a = self.layer.attention
        return ((packed is not None or mask is None) and a.pos_key is None and a.pos_query is None
                and kernels.disentangled_attention() is not None)

    def context(self, w: SimpleNamespace, qkv: torch.Tensor, x: torch.Tensor, mask: torch.Tensor | None,
                packed: Packing | None, positions: Any = None) -> torch.Tensor:
        a = self.layer.attention
        H = x.shape[-1]
        (q, k, v), cu_seqlens = varlen(qkv.split(H, dim=-1), packed)  # views of the one matmul's output
        pos_key = pos_query = None
        rows = torch.zeros(1, dtype=torch.long)
        if positions is not None:
            table = w.qkv(positions.table.to(qkv.dtype))  # (R, 3H): the query and key projections
            pos_query = table[:, :H].contiguous() if a.p2c else None
            pos_key = table[:, H:2 * H].contiguous() if a.c2p else None
            rows = positions.rows
        context = kernels.disentangled_attention()(q, k, v, cu_seqlens, a.num_heads, pos_key, pos_query, rows,
                                                   1.0 / a.scale)
        return context.view(x.shape)


def _attention(qkv: torch.Tensor, S: int, T: int, num_heads: int, mask: torch.Tensor | None,
               position_bias: torch.Tensor | None = None) -> torch.Tensor:
    """Multi-head attention over S sequences of T tokens, the query pre-scaled by 1/sqrt(d).

    qkv: float32 or bfloat16 [S*T, 3H], sequence by sequence (rows past a sequence's end are zeros,
    or masked); mask: bool [S, 1, 1, T] or [S, 1, T, T], True where a key may be attended to, or None;
    position_bias: float [1, nh, T, T] added to every sequence's scores (MPNet's), or None.
    Returns the context, float32 [S*T, H]: attention computes in float32 whatever qkv's dtype, as the
    native kernel does.
    """
    qkv = qkv.float()
    H = qkv.shape[1] // 3
    d = H // num_heads
    # [S, T, 3, nh, d] -> [3, nh, S, T, d]: every (head, sequence) pair a contiguous [T, d] matrix,
    # so q k^T and p v are each one batched matmul over nh*S small products.
    q, k, v = (t.view(num_heads * S, T, d)
               for t in qkv.view(S, T, 3, num_heads, d).permute(2, 3, 0, 1, 4).contiguous().unbind(0))
    if mask is None and position_bias is None:
        scores = torch.bmm(q, k.transpose(1, 2))  # (nh*S, T, T)
    else:  # -inf where masked, added inside the matmul; broadcast over heads (and queries for a key mask)
        bias = torch.zeros((S, 1, 1, T) if mask is None else mask.shape, dtype=qkv.dtype)
        if mask is not None:
            bias.masked_fill_(~mask, float("-inf"))
        bias = bias.transpose(0, 1)  # (1, S, 1|T, T)
        if position_bias is None:  # a view over the heads (and the queries of a key mask): nothing copied
            bias = bias.expand(num_heads, S, -1, T).reshape(num_heads * S, -1, T).expand(-1, T, -1)
        else:  # (1, nh, T, T) -> (nh, 1, T, T), the same for every sequence, added once
            bias = (bias + position_bias.float().transpose(0, 1)).reshape(num_heads * S, T, T)
        scores = torch.baddbmm(bias, q, k.transpose(1, 2))
    probs = scores.softmax(dim=-1)
    if mask is not None and not bool(mask.any(dim=-1).all()):
        # A query with no key to see (a row of padding alone, padded layout): SDPA answers zeros,
        # where this softmax over -inf alone gives NaN.
        probs = probs.nan_to_num_(0.0)
    context = torch.bmm(probs, v)  # (nh*S, T, d)
    return context.view(num_heads, S, T, d).permute(1, 2, 0, 3).reshape(S * T, H)


def fuse_for_inference(model: torch.nn.Module, native_attention: bool = True) -> torch.nn.Module:
    """Run `model`'s encoder layers on the fused path (see the module docstring); in place.

    native_attention: use the native varlen attention kernel for unpadded batches, building it
    now if this machine has not yet (so the one-off compile happens at load, not mid-request);
    False, or a machine where it cannot be built, runs attention in PyTorch ops.
    The parameters, `state_dict()` and `save_pretrained` are untouched; only each layer's
    forward changes. Returns the same model, in eval mode.
    """
    if not available():
        raise RuntimeError("this torch build has no oneDNN (mkldnn) CPU kernels; use --backend torch")
    attend = kernels.varlen_attention() if native_attention else None
    backbone = model if isinstance(model, BertModel) else model.backbone
    # Every block once, however often it runs (ALBERT runs its shared blocks several times): BERT's
    # attention and DeBERTa's (see _FusedDisentangledLayer).
    for layer in (m for m in backbone.modules() if isinstance(m, BertLayer)):
        if isinstance(layer.forward, _FusedLayer):
            layer.forward.attend = attend  # fused already: only the attention choice may change
            continue
        if type(layer.attention) is SelfAttention:
            layer.forward = _FusedLayer(layer, attend)
        elif type(layer.attention) is DisentangledAttention:
            layer.forward = _FusedDisentangledLayer(layer, attend)
    fuse_prenorm_layers(backbone, attend)  # ModernBERT's blocks (fused_modern.py)
    return model.eval()
