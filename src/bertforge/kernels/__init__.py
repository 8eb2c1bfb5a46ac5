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

They are built with PyTorch's own extension
tooling (`torch.utils.cpp_extension.load`: a C++ compiler and ninja), once per machine, into
PyTorch's extension cache (`TORCH_EXTENSIONS_DIR`, by default ~/.cache/torch_extensions);
about 35-55 s on a 2-core machine (eight sources, 2026-11-26), then a load of a few milliseconds.

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
import hashlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SWITCH = "BERTFORGE_NATIVE_KERNELS"
_SOURCES = [Path(__file__).with_name(name) for name in ("varlen_attention.cpp", "disentangled_attention.cpp",
                                                     "attention_train.cpp", "dropout.cpp", "cross_entropy.cpp",
                                                     "layer_norm.cpp", "rotary.cpp", "residual_norm.cpp")]
_HEADERS = [Path(__file__).with_name(name) for name in ("simd.h", "attention_blocks.h", "amx.h")]
# -fopenmp: at::parallel_for is inline and, in OpenMP builds of torch, an `omp parallel` region;
# without the flag it runs on one thread. No OpenMP library is linked: the symbols resolve to the
# one torch already loaded, so the process keeps a single thread pool.
# Compiler flags for the vector ISA ATen itself detected (and would use): the kernel's vector
# types then lower to that width. Any other CPU gets the compiler's defaults.
_ISA_FLAGS = {"AVX512": ["-mavx512f", "-mavx512vl", "-mavx512bw", "-mavx512dq", "-mavx2", "-mfma"],
              "AVX2": ["-mavx2", "-mfma"]}


def isa() -> str:
    """ATen's CPU capability ("AVX512", "AVX2", "DEFAULT", ...): one build per capability, so a
    cache shared by different machines never hands one a binary its CPU cannot run."""
    return torch.backends.cpu.get_cpu_capability()


STALE_LOCK_S = 600  # a build takes seconds; a lock this old was left by a process that died


def _clear_stale_lock(lock: Path) -> None:
    """torch's build lock is a file that a killed build leaves behind, and the next build waits on
    it forever; one older than any build could take is removed, saying so."""
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > STALE_LOCK_S:
        log.warning("removing %s, left %.0f s ago by a kernel build that did not finish", lock, age)
        lock.unlink(missing_ok=True)


@functools.cache
def library() -> bool:
    """Build (once per machine) or load the native kernels; False where they cannot be had."""
    if os.environ.get(SWITCH, "1") == "0":
        return False
    capability = isa()
    # torch rebuilds when a source's text changes, but not a header's: the name carries them all.
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in _SOURCES + _HEADERS)).hexdigest()[:10]
    name = f"bertforge_kernels_{capability.lower()}_{digest}"
    start = time.perf_counter()
    try:
        from torch.utils.cpp_extension import _get_build_directory, load

        build_dir = Path(_get_build_directory(name, verbose=False))
        _clear_stale_lock(build_dir / "lock")
        if not (build_dir / f"{name}.so").exists():  # a first start pauses here; say why (with -v)
            log.info("compiling bertforge's native kernels for this machine (%s), once: about half a minute", capability)
        load(name=name, sources=[str(source) for source in _SOURCES],
             extra_cflags=["-O3", "-fopenmp", *_ISA_FLAGS.get(capability, [])], is_python_module=False, verbose=False)
    except Exception as error:  # no compiler or no ninja: slower paths, not wrong ones
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        log.warning("bertforge's native kernels could not be built (%s); attention, dropout and the "
                    "masked-LM loss run in PyTorch ops instead (the same numbers, slower). Set %s=0 "
                    "to skip this attempt.", reason, SWITCH)
        return False
    log.debug("native kernels ready (%s) in %.1f s", capability, time.perf_counter() - start)
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
