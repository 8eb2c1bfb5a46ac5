"""Will a training step fit in memory? An estimate of its peak, checked before the first step, and the
one line a run ends with when an allocation fails anyway.

A run asked for more than the machine or its limits allow must not train for minutes and then die in a
raw `DefaultCPUAllocator: can't allocate memory` traceback. Before the first step the loop compares what a
step will add to the process with what the process may still use:

- what it may use: the tightest of the cgroup's memory limit (less what the cgroup holds now), the
  address-space limit (`RLIMIT_AS`, less the process's virtual size now: torch maps its allocations
  anew, so they count there in full) and the memory the kernel reports available;
- what a step adds (`step_bytes`, fp32 bytes, every token real, the upper bound of a step): the gradients
  and AdamW's two moments (12 bytes a parameter; bf16 autocast keeps a bf16 copy of each weight too, 2
  more), the activations backward keeps (per layer and token, about ten hidden-size vectors and three
  intermediate-size ones, plus the attention probabilities, heads x length per token), and the
  masked-LM head's logits and their gradient over the vocabulary for the predicted positions.

The estimate is checked against measured peaks in docs/results.md ("Memory: a step's estimate against
its peak"). bertforge has no gradient checkpointing; the refusal names the batch size that fits and
the --grad-accum that keeps the global batch. CPU only: on a GPU the allocator's own error applies.
"""

from __future__ import annotations

import math
import resource
from collections.abc import Callable
from pathlib import Path

import torch

from ..errors import BertforgeError

GB = 1024 ** 3
# Floats backward keeps per token and layer, in hidden-size and intermediate-size vectors, and copies of one
# row of attention scores per head (see above): the shape of what a step adds.
HIDDEN_VECTORS, INTERMEDIATE_VECTORS, ATTENTION_COPIES = 10, 3, 2
# What that shape comes to, measured (benchmarks/memory_estimate.py, docs/results.md), per precision and attention
# path: the smallest ratio of measured activations to the shape over six models and lengths, so that the estimate
# stays at or under a real step's peak (a refusal must never turn away a run that would have fit). The native
# kernels keep only the real tokens' probabilities; without them the padded path keeps more; bf16 keeps many
# activations in half the bytes.
ACTIVATION_SCALE = {("fp32", True): 0.7, ("fp32", False): 1.35, ("bf16", True): 0.45, ("bf16", False): 0.9}


class OutOfMemory(BertforgeError):
    """A step asks for more memory than the process may use."""


def step_bytes(model: torch.nn.Module, batch_size: int, seq_len: int, precision: str = "fp32",
               predictions: int | None = None, native: bool = True) -> int:
    """What one optimizer step's micro-batch adds to the process, in bytes, every token real; an estimate that
    leans low (0.53-1.02 of the measured peak), so that only a run that cannot fit is refused.

    `predictions`: masked positions per row (the masked-LM head's logits are [rows x predictions, vocab]);
    None for heads that read every token or one per row, whose outputs are small beside the layers'.
    `native`: whether the native attention kernels run (`kernels.library()`)."""
    config = model.config
    params = sum(p.numel() for p in model.parameters())
    state = params * (12 + (2 if precision == "bf16" else 0))
    tokens = batch_size * seq_len
    per_token = (HIDDEN_VECTORS * config.hidden_size + INTERMEDIATE_VECTORS * config.intermediate_size
                 + ATTENTION_COPIES * config.num_attention_heads * seq_len)
    scale = ACTIVATION_SCALE[("bf16" if precision == "bf16" else "fp32", native)]
    activations = int(scale * 4 * config.num_hidden_layers * tokens * per_token)
    head = 8 * batch_size * predictions * config.vocab_size if predictions else 0  # logits and their gradient
    return state + activations + head


def available_bytes() -> tuple[int, str]:
    """What this process may still allocate, and what sets it: a cgroup limit, RLIMIT_AS or the memory available."""
    candidates: list[tuple[int, str]] = []
    cgroup = _cgroup_room()
    if cgroup is not None:
        candidates.append(cgroup)
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        mapped = _proc_bytes("/proc/self/status", "VmSize") or 0
        candidates.append((soft - mapped, f"the address-space limit (ulimit -v, {soft / GB:.1f} GB)"))
    meminfo = _proc_bytes("/proc/meminfo", "MemAvailable")
    if meminfo is not None:
        candidates.append((meminfo, "the memory available on this machine"))
    if not candidates:
        return 1 << 62, "no limit found"
    return min(candidates)


def check_fits(model: torch.nn.Module, batch_size: int, seq_len: int, grad_accum: int, precision: str,
               device: torch.device, predictions: int | None = None, native: bool = True,
               rows: Callable[[int], int] | None = None) -> None:
    """Refuse, in one line naming what would fit, a run whose step cannot fit in the memory left (CPU only).
    `rows(batch_size)`: the texts one forward with gradients holds, when that is not one per example (an
    embedder's rows hold several texts; GradCache holds one mini-batch whatever the batch size)."""
    if device.type != "cpu":
        return
    rows = rows or (lambda b: b)
    need = step_bytes(model, rows(batch_size), seq_len, precision, predictions, native)
    room, limit = available_bytes()
    if need <= room:
        return
    fits = next((b for b in range(batch_size - 1, 0, -1)
                 if step_bytes(model, rows(b), seq_len, precision, predictions, native) <= room), None)
    said = (f"a step of --batch-size {batch_size} at --seq-len {seq_len} needs about {need / GB:.1f} GB more "
            f"(gradients, optimizer state, activations), and {limit} leaves {max(room, 0) / GB:.1f} GB")
    if fits is None:
        raise OutOfMemory(f"{said}; even --batch-size 1 does not fit: use a smaller --model or --seq-len")
    accum = math.ceil(batch_size * grad_accum / fits)
    raise OutOfMemory(f"{said}; --batch-size {fits} fits: --batch-size {fits} --grad-accum {accum} keeps the global "
                      f"batch of {batch_size * grad_accum} (or about it)")


def is_allocation_failure(error: BaseException) -> bool:
    """torch's CPU allocator refusing a request (or a GPU running out), as opposed to any other error."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text.lower())


def _cgroup_room() -> tuple[int, str] | None:
    """(limit - usage, description) of this process's cgroup (v2, else v1), or None where there is no limit."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for entry in lines:
        parts = entry.split(":", 2)
        if len(parts) != 3:
            continue
        controllers, path = parts[1], parts[2]
        if controllers == "":  # v2
            base = Path("/sys/fs/cgroup") / path.lstrip("/")
            limit, usage = base / "memory.max", base / "memory.current"
        elif "memory" in controllers.split(","):
            base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            limit, usage = base / "memory.limit_in_bytes", base / "memory.usage_in_bytes"
        else:
            continue
        try:
            cap = limit.read_text().strip()
            if cap == "max" or int(cap) >= 1 << 60:
                return None
            return int(cap) - int(usage.read_text().strip()), f"the cgroup's memory limit ({int(cap) / GB:.1f} GB)"
        except (OSError, ValueError):
            return None
    return None


def _proc_bytes(file: str, key: str) -> int | None:
    """A "Key: N kB" line of /proc/self/status or /proc/meminfo, in bytes; None where it is not there."""
    try:
        for line in Path(file).read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
