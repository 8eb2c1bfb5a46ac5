"""Native CPU kernels, compiled from the C++ beside this file the first time they are needed.

Eight kernels, built together into one library (`simd.h` holds what they share, and
`attention_blocks.h` what the two inference attentions share):
- `varlen_attention`: attention straight on the unpadded tokens of the fused encoder, for
  inference, with ModernBERT's rotary positions and local window as options (see
  `varlen_attention.cpp` for how and why);
- `disentangled_attention`: DeBERTa's attention for inference, its c2p and p2c terms picked by
  relative distance inside the kernel instead of gathered from [B, nh, T, 2k] products
  (`disentangled_attention.cpp`);
- `varlen_attention_train`: the same for training, forward and backward, with attention dropout
  hashed in (`attention_train.cpp`; the autograd wrapper is `kernels.attention`);
- `hashed_dropout`: training's dropout with a mask hashed from each element's index, so it is
  cheap to draw and never stored (`dropout.cpp`; the autograd wrapper is `kernels.dropout`);
- `layer_norm_bf16`, `add_bf16`, `add_layer_norm_bf16`: the residual add of a bf16 matmul's
  output to the float32 stream and the LayerNorm writing bf16, each in one pass, for the fused
  blocks under bf16 autocast (`layer_norm.cpp`);
- `rotary`: ModernBERT's rotary positions applied to a fused QKV's q and k in one pass, for the
  global layers the fused blocks hand to SDPA (`rotary.cpp`);
- `cross_entropy`: the masked-LM loss over the vocabulary without torch's [M, V] float32
  intermediates (`cross_entropy.cpp`; the autograd wrapper is `kernels.cross_entropy`);
- `residual_layer_norm`: a post-LN block's residual add and LayerNorm for training, forward and
  backward in one pass each (`residual_norm.cpp`; the autograd wrapper is `kernels.residual_norm`).

They are compiled with PyTorch's own extension tooling (a C++ compiler and ninja) on the machine
that runs them, once, into PyTorch's extension cache (`TORCH_EXTENSIONS_DIR`, by default
~/.cache/torch_extensions): about 40-55 s on a 2-core machine, said on stderr while it lasts, then a
load of a few milliseconds. `kernels/build.py` keeps that cache: what names a build, the lock that
lets one process build while the others wait, and the progress lines. `bertforge kernels build`
compiles them ahead of time (images, CI); `bertforge kernels` says what the cache holds.

Where they cannot be built (no compiler) bertforge says so once and runs them in PyTorch ops
instead: inference attention and the loss give the same numbers within float rounding (attention
measured ~7% slower end to end), dropout the same bits (its hash is written in torch's integer ops
too), only slower; training attention takes the explicit padded path, whose attention-dropout masks
are drawn over another layout.
`BERTFORGE_NATIVE_KERNELS=0` chooses those paths on purpose.

    attend = varlen_attention()      # None where unavailable
    context = attend(qkv, cu_seqlens, num_heads)   # [N, 3H] -> [N, H], float32 or bfloat16
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

import torch

from ..errors import Stopped
from . import build

log = logging.getLogger(__name__)

SWITCH = "BERTFORGE_NATIVE_KERNELS"
# What the last `library()` call found: "cached", "compiled", "off" or "unavailable", and the seconds a
# compile (or a wait for another process's) took. A run's summary reports the compile apart from training.
status: dict[str, Any] = {"state": None, "compile_seconds": None}


def enabled() -> bool:
    """False when BERTFORGE_NATIVE_KERNELS=0 chose the PyTorch paths."""
    return os.environ.get(SWITCH, "1") != "0"


@functools.cache
def library() -> bool:
    """Build (once per machine) or load the native kernels; False where they cannot be had.

    Never raises: a missing source, no compiler or a failed compile is one warning line and the
    PyTorch paths (the same numbers, slower)."""
    if not enabled():
        status.update(state="off", compile_seconds=None)
        return False
    try:
        seconds = build.load(build.current())
    except Stopped:  # a signal ended the wait for another process's build: the run stops, as asked
        raise
    except Exception as error:  # noqa: BLE001  no compiler, no ninja, an incomplete install: slower paths, not wrong ones
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        log.warning("bertforge's native kernels could not be built (%s); attention, dropout and the "
                    "masked-LM loss run in PyTorch ops instead (the same numbers, slower). Set %s=0 "
                    "to skip this attempt.", reason, SWITCH)
        status.update(state="unavailable", compile_seconds=None)
        return False
    status.update(state="cached" if seconds is None else "compiled", compile_seconds=seconds)
    return True


def varlen_attention() -> Callable[..., torch.Tensor] | None:
    """The native attention op, built or loaded on first call; None where it cannot be had.

    The op: (qkv float32 or bfloat16 [N, 3H] contiguous, cu_seqlens int [S + 1], num_heads,
    cos=None, sin=None, window=-1) -> [N, H] in qkv's dtype: softmax(q k^T) v per head within
    each sequence, the query already scaled by 1/sqrt(d), computed in float32. cos and sin
    (float32 [N, head size]) rotate q and k as ModernBERT's rotary positions do; window >= 0
    lets query i see only the keys j with |i - j| <= window.
    """
    return torch.ops.bertforge.varlen_attention if library() else None


def disentangled_attention() -> Callable[..., torch.Tensor] | None:
    """DeBERTa's native inference attention op, built or loaded on first call; None where it cannot be had.

    The op: (q, k, v float32 or bfloat16 [N, H], rows contiguous, one dtype; cu_seqlens int [S + 1];
    num_heads; pos_key, pos_query: the distance table projected by the key and query matrices,
    [R, H] in q's dtype, or None for a term left out (c2p, p2c); rows: long [2T - 1], the table row
    of distance i - j at (i - j) + T - 1, nondecreasing, T at least the longest sequence; scale)
    -> [N, H] in q's dtype: per head within each sequence, softmax(scale (q_i k_j + q_i pk[r] +
    pq[r] k_j)) v with r = rows[i - j], computed in float32.
    """
    return torch.ops.bertforge.disentangled_attention if library() else None


def layer_norm_bf16() -> Callable[..., torch.Tensor] | None:
    """The native LayerNorm-to-bf16 op, built or loaded on first call; None where it cannot be had.

    The op: (x float32 [N, H] contiguous, weight float32 [H] or None, bias float32 [H] or None, eps)
    -> bf16 [N, H]: LayerNorm in float32, each output rounded once to bf16.
    """
    return torch.ops.bertforge.layer_norm_bf16 if library() else None


def rotary() -> Callable[..., torch.Tensor] | None:
    """The native rotary op, built or loaded on first call; None where it cannot be had.

    The op: (qkv float32 or bf16 [N, 3H] contiguous, cos, sin float32 [N, head size], num_heads) ->
    [2, N, H] in qkv's dtype: q and k turned as `models.modernbert.rotate` turns them, in float32,
    rounded once.
    """
    return torch.ops.bertforge.rotary if library() else None


def add_bf16() -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
    """The native residual add, built or loaded on first call; None where it cannot be had.

    The op: (stream float32 [N, H], y bf16 [N, H], both contiguous) -> stream + y, float32 [N, H].
    """
    return torch.ops.bertforge.add_bf16 if library() else None


def add_layer_norm_bf16() -> Callable[..., tuple[torch.Tensor, torch.Tensor]] | None:
    """The native residual add and LayerNorm, built or loaded on first call; None where it cannot be had.

    The op: (stream float32 [N, H], y bf16 [N, H], weight, bias (float32 [H] or None), eps) ->
    (x = stream + y float32 [N, H], LayerNorm(x) rounded to bf16 [N, H]).
    """
    return torch.ops.bertforge.add_layer_norm_bf16 if library() else None


def residual_layer_norm() -> tuple[Callable, Callable] | None:
    """The training ops of a post-LN block's residual add and LayerNorm (residual_norm.cpp), built or
    loaded on first call; None where they cannot be had.

    forward (x float32 [N, H], y float32 or bfloat16 [N, H], weight, bias float32 [H], eps) ->
    (LayerNorm(x + y) float32 [N, H], x + y, mean [N], rstd [N]); backward (grad float32 [N, H], x + y,
    mean, rstd, weight, y_bf16) -> (dx float32 [N, H], dy bfloat16 [N, H] or empty, dweight, dbias).
    """
    if not library():
        return None
    return torch.ops.bertforge.residual_layer_norm, torch.ops.bertforge.residual_layer_norm_backward


def hashed_dropout() -> Callable[[torch.Tensor, int, int, float], torch.Tensor] | None:
    """The native dropout op, built or loaded on first call; None where it cannot be had.

    The op: (x float32 or bfloat16, contiguous; key int64; threshold in [0, 2^32); scale) -> a tensor
    like x, `x * scale` where hash(index, key) >= threshold and 0 elsewhere (see dropout.cpp).
    """
    return torch.ops.bertforge.hashed_dropout if library() else None


def varlen_attention_train() -> tuple[Callable, Callable] | None:
    """The native training attention's (forward, backward) ops, built or loaded on first call;
    None where they cannot be had. See `kernels.attention` for what they take and return."""
    if not library():
        return None
    return torch.ops.bertforge.varlen_attention_train, torch.ops.bertforge.varlen_attention_train_backward


def native_cross_entropy() -> tuple[Callable, Callable] | None:
    """The native cross-entropy's (forward, backward) ops, built or loaded on first call; None where
    they cannot be had. See `kernels.cross_entropy` for what they take and return."""
    if not library():
        return None
    return torch.ops.bertforge.cross_entropy, torch.ops.bertforge.cross_entropy_backward
