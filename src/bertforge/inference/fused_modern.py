"""The fused CPU inference path for pre-norm rotary blocks (ModernBERT's `PreNormLayer`).

The same maths as `models/modernbert.py`, with the work arranged for a CPU:
1. The four matmuls run on weights packed once for oneDNN (`onednn.Packed`); the query rows of
   Wqkv carry the 1/sqrt(head_dim) of the softmax, as in BERT's fused path.
2. Rotary positions are applied inside the native attention kernel, as it reads each query and
   key (`kernels/varlen_attention.cpp`): torch would write rotated copies of q and k in five
   element-wise passes (two casts, a concatenation, two products and a sum) per layer.
3. A local layer's queries score only the key blocks within their window, in the same kernel:
   its cost grows as T * window, not T^2, and nothing T x T exists. A global layer over sequences
   longer than `LONGEST_NATIVE_GLOBAL`, or under bf16 autocast, runs SDPA, which is faster there,
   on q and k rotated by a native one-pass kernel (`kernels/rotary.cpp`).
4. GeGLU, act(x Wv) * (x Wg), is two matmuls with the activation and the product fused into
   them as oneDNN post-ops, instead of one wide matmul, a split, an activation and a product.
5. Each residual add runs inside the projection before it (float32).
6. Under bf16 autocast the residual adds and LayerNorms run in native one-pass kernels
   (`kernels/layer_norm.cpp`): the attention's residual add and the norm after it together, the
   norm writing bf16 for the matmul after it, where torch would widen the bf16 matmul output,
   add, normalise in float32 and cast (four passes).
Unpadding stays: only real tokens go through the matmuls and attention.

Under CPU autocast to bfloat16 the matmuls run in bfloat16 on weights packed once in bfloat16
(eager autocast casts every weight again on every call), while the residual stream, the LayerNorms
and the local layers' attention arithmetic stay float32 (the kernel reads and writes bfloat16 and
computes in float32); global layers run SDPA in bfloat16, as under eager autocast.

Outputs equal eager PyTorch's up to summation order (bfloat16: up to its rounding). Training,
gradients, attention maps, non-fp32 or non-CPU tensors, autocast to another dtype, padded batches
with a mask (`model.unpad = False`), and machines where the kernel cannot be built run the eager
block unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import SimpleNamespace

import torch

import torch.nn.functional as F

from .. import kernels
from ..models.modernbert import PreNormLayer, rotate
from ..models.padding import Packing, from_sequences, pad_rows, to_sequences
from .onednn import Packed, PackedBlock, matmul_dtype, matmul_rows, post_op, residual

# A global layer over sequences longer than this runs SDPA instead of the native kernel: the kernel
# scores each group of queries against all keys, which outgrows the L2 cache; SDPA's tiles do not.
# Measured per layer at ModernBERT-base's width (12 heads of 64): the kernel 15.7 ms against 16.7 at
# 4 x 512 tokens, level at 2 x 1,024 (29.8 / 29.6), behind at 1 x 2,048 (69.7 / 54.5).
# Under bf16 autocast every global layer runs SDPA in bf16, whose kernel uses the CPU's bf16 units
# where the native kernel computes in float32: 6.8 against 11.2 ms at 16 x 128 tokens, 9.4 against
# 18.9 at 4 x 512. Local layers stay native: 8.0 ms at 4 x 512 against 10.8 for SDPA with a band mask.
LONGEST_NATIVE_GLOBAL = 1024


class FusedPreNormLayer(PackedBlock):
    """A `PreNormLayer`'s forward on packed weights and the native rotary/windowed attention."""

    def __init__(self, layer: PreNormLayer, attend: Callable) -> None:
        super().__init__()
        self.layer = layer
        self.eager: Callable = layer.forward  # the bound method of the class, kept for the fallbacks
        self.attend = attend

    def params(self) -> list[torch.Tensor | None]:
        a, f = self.layer.attention, self.layer.ffn
        return [p for lin in (a.qkv, a.out, f.up, f.down) for p in (lin.weight, lin.bias)]

    def pack(self, dtype: torch.dtype) -> SimpleNamespace:
        a, f = self.layer.attention, self.layer.ffn
        H = a.out.weight.shape[0]
        scale = torch.ones(3 * H, 1)
        scale[:H] = 1 / math.sqrt(a.head_dim)  # softmax(q k^T / sqrt(d)), divided once, here
        I = f.down.weight.shape[1]  # noqa: E741  (the GeGLU width, as transformers names it)
        value_w, gate_w = f.up.weight.split(I)
        value_b, gate_b = f.up.bias.split(I) if f.up.bias is not None else (None, None)
        post = post_op(f.act)
        return SimpleNamespace(
            qkv=Packed(a.qkv.weight * scale, a.qkv.bias * scale[:, 0] if a.qkv.bias is not None else None, dtype=dtype),
            out=Packed(a.out.weight, a.out.bias, dtype=dtype),
            value=Packed(value_w, value_b, post or ("none", ""), dtype=dtype),
            act=None if post else f.act,  # an activation oneDNN cannot fuse runs on its own
            gate=Packed(gate_w, gate_b, dtype=dtype),
            down=Packed(f.down.weight, f.down.bias, dtype=dtype))

    def __call__(self, x: torch.Tensor, mask: torch.Tensor | None, output_attentions: bool = False,
                 packed: Packing | None = None, rotary: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As `PreNormLayer.forward`: x float [B, T, H] (or [N, H] unpadded) -> the same shape."""
        layer = self.layer
        dtype = matmul_dtype(x)
        if (output_attentions or mask is not None or layer.training or torch.is_grad_enabled()
                or x.device.type != "cpu" or dtype is None or torch.compiler.is_compiling()):
            return self.eager(x, mask, output_attentions, packed, rotary)
        w = self.packed(dtype)
        attention = layer.attention
        shape, H = x.shape, x.shape[-1]
        x = x.reshape(-1, H)  # (N, H)
        if packed is None:  # B full rows of T tokens
            T = shape[1]
            starts = torch.arange(0, x.shape[0] + 1, T, dtype=torch.int32)
        else:
            starts = packed.cu_seqlens
        cos, sin = (t.reshape(-1, attention.head_dim) for t in rotary[layer.kind])
        n = x.shape[0]
        rows = matmul_rows(n, packed is not None, dtype)  # a bucket in bf16, so oneDNN reuses its matmuls
        with torch.autocast("cpu", enabled=False):  # each op below runs in the dtype chosen for it
            if rows != n:
                x = pad_rows(x, rows)
            qkv = w.qkv(normed(layer.attention_norm, x, dtype))[:n]  # (N, 3H), the query already scaled
            longest = packed.max_seqlen if packed is not None else shape[1]
            if attention.window is None and (dtype != torch.float32 or longest > LONGEST_NATIVE_GLOBAL):
                context = _sdpa(qkv, cos, sin, attention.num_heads, packed, shape[:-1])
            else:
                window = attention.window if attention.window is not None else -1
                context = self.attend(qkv, starts, attention.num_heads, cos, sin, window)  # (N, H), qkv's dtype
            if rows != n:
                context = pad_rows(context, rows)
            x, h = residual_normed(w.out, context, x, layer.ffn_norm, dtype)
            value = w.value(h)
            if w.act is not None:
                value = w.act(value)
            x = residual(w.down, w.gate.times(h, value), x)
        return x[:n].view(shape), None


def normed(norm: torch.nn.Module, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """norm(x) in `dtype`, the matmuls' input: x float32 [N, H] -> [N, H]. For bf16 a LayerNorm runs
    in the native kernel that writes bf16 as it normalises (one pass instead of a norm and a cast)."""
    if dtype == torch.bfloat16 and isinstance(norm, torch.nn.LayerNorm) and x.is_contiguous():
        op = kernels.layer_norm_bf16()
        if op is not None:
            return op(x, norm.weight, norm.bias, norm.eps)
    return norm(x).to(dtype)


def residual_normed(linear: Packed, inp: torch.Tensor, stream: torch.Tensor, norm: torch.nn.Module,
                    dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x = stream + linear(inp) (float32 [N, H]) and norm(x) in `dtype`. For bf16 a LayerNorm is
    fused with the add in the native kernel: the sum is written once and normalised in cache."""
    if dtype == torch.bfloat16 and isinstance(norm, torch.nn.LayerNorm) and stream.is_contiguous():
        op = kernels.add_layer_norm_bf16()
        if op is not None:
            return op(stream, linear(inp), norm.weight, norm.bias, norm.eps)
    x = residual(linear, inp, stream)
    return x, normed(norm, x, dtype)


def _sdpa(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, packed: Packing | None,
          rows: torch.Size) -> torch.Tensor:
    """Global attention through SDPA: qkv float [N, 3H] (query pre-scaled), cos/sin float32 [N, hd],
    sequences as `packed` says, or `rows` (B, T) of full rows -> the context, float [N, H]."""
    N, H = qkv.shape[0], qkv.shape[1] // 3
    q, k, v = qkv.view(N, 3, heads, H // heads).unbind(1)  # each (N, nh, hd)
    turn = kernels.rotary()
    if turn is not None:  # one pass over q and k instead of five each
        q, k = turn(qkv, cos, sin, heads).view(2, N, heads, H // heads).unbind(0)
    else:
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    if packed is None:
        mask = None
        q, k, v = (t.reshape(*rows, heads, -1).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hd)
    else:
        mask = packed.key_mask  # (S, 1, 1, T) or None
        q, k, v = (to_sequences(t, packed).transpose(1, 2) for t in (q, k, v))  # (S, nh, T, hd)
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0).transpose(1, 2)
    return context.reshape(N, H) if packed is None else from_sequences(context, packed).reshape(N, H)


def fuse_prenorm_layers(backbone: torch.nn.Module, attend: Callable | None) -> None:
    """Give every `PreNormLayer` of `backbone` the fused forward, in place; without the native
    kernel (`attend` None) they stay eager, as their attention needs its rotary and window."""
    for layer in (m for m in backbone.modules() if isinstance(m, PreNormLayer)):
        if isinstance(layer.forward, FusedPreNormLayer):
            if attend is None:
                del layer.forward  # the class's own forward again
            else:
                layer.forward.attend = attend
        elif attend is not None:
            layer.forward = FusedPreNormLayer(layer, attend)
