"""Multi-process data parallelism with torchrun and PyTorch DDP. The only module that reads RANK or WORLD_SIZE.

Launch with `torchrun --nproc-per-node N -m bertforge pretrain ...` (gloo on CPU, nccl on
GPU); multi-node is plain torchrun with `--nnodes` and `--rdzv-endpoint`. Everything
else asks `is_main()`, `rank()` or `world_size()`.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from .. import invocation


def init() -> None:
    """Join the process group when launched by torchrun; a no-op for a single process."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend=backend)


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def wrap(model: torch.nn.Module) -> torch.nn.Module:
    """DDP around the model when distributed; the model itself otherwise."""
    if not is_distributed():
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device().index] if device().type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    model = getattr(model, "module", model)  # DDP
    return getattr(model, "_orig_mod", model)  # torch.compile


def sum_across(values: list[float]) -> list[float]:
    """Element-wise sum over all processes (for metrics)."""
    if not is_distributed():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device() if device().type == "cuda" else "cpu")
    dist.all_reduce(t)
    return t.tolist()


def broadcast_flag(flag: bool) -> bool:
    """True on every rank if it is True on rank 0 (e.g. 'stop now', decided by the main process's clock)."""
    if not is_distributed():
        return flag
    t = torch.tensor([1 if flag else 0], device=device() if device().type == "cuda" else "cpu")
    dist.broadcast(t, src=0)
    return bool(t.item())


def broadcast_int(value: int) -> int:
    """Rank 0's value on every rank (e.g. a schedule length measured on rank 0's clock)."""
    if not is_distributed():
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device() if device().type == "cuda" else "cpu")
    dist.broadcast(t, src=0)
    return int(t.item())


def gather_cpu(t: torch.Tensor) -> list[torch.Tensor] | None:
    """Every rank's copy of a small CPU tensor of one shape (e.g. its RNG state), in rank order; None
    when not distributed. Every rank must call it."""
    if not is_distributed():
        return None
    on = device() if device().type == "cuda" else torch.device("cpu")
    parts = [torch.empty_like(t, device=on) for _ in range(world_size())]
    dist.all_gather(parts, t.to(on))
    return [p.cpu() for p in parts]


def gather(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Every process's rows of `x` [B, D], concatenated in rank order with the gradient flowing back to each
    process's own rows, and where this process's rows start. Without a process group: (x, 0)."""
    if world_size() == 1:
        return x, 0
    from torch.distributed.nn.functional import all_gather

    parts = [_ContiguousGrad.apply(part) for part in all_gather(x.contiguous())]
    return torch.cat(parts), rank() * x.shape[0]


class _ContiguousGrad(torch.autograd.Function):
    """The identity, whose gradient is made contiguous. all_gather's backward reduce-scatters the gradients of its
    outputs, and on gloo a strided one (an einsum's gradient, sliced by cat's backward) comes back scrambled:
    measured on ColBERT's MaxSim, whose 2-process gradients were wrong until this."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def cleanup() -> None:
    """End the process group once every rank is here, so that no rank tears its connections down
    while rank 0 still writes the final model, and note it for the CLI's exit (`cli.main`)."""
    if is_distributed():
        dist.barrier()
        dist.destroy_process_group()
        invocation.ended_process_group = True
