"""GradCache (Gao et al., 2021; sentence-transformers' Cached* losses, PyLate's CachedContrastive): the loss of a
batch far larger than memory allows, with the gradients of the uncached loss, at the cost of one more forward.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch


def cached(model: torch.nn.Module, inputs: dict[str, torch.Tensor], mini_batch_size: int,
           loss_of: Callable[[torch.Tensor], torch.Tensor], loss_params: tuple[torch.Tensor, ...] = ()) -> torch.Tensor:
    """GradCache for a model of one input: the batch's texts (`inputs`: long [N, T] each) are embedded
    `mini_batch_size` at a time, and `loss_of(vectors [N, D])` sees them all (`cached_calls`, with one call per
    mini-batch)."""
    rows = inputs["input_ids"].shape[0]
    calls = [functools.partial(embed_rows, model, inputs, slice(start, start + mini_batch_size))
             for start in range(0, rows, mini_batch_size)]
    return cached_calls(model, calls, lambda pieces: loss_of(torch.cat(pieces)), loss_params)


def embed_rows(model: Callable[..., torch.Tensor], inputs: dict[str, torch.Tensor], rows: slice) -> torch.Tensor:
    """One GradCache call: `model`'s float vectors for `rows` of the batch's `inputs`."""
    return model(**{k: v[rows] for k, v in inputs.items()}).float()


class RandomState:
    """The random state a GradCache call ran under, on the CPU and on each CUDA device the model runs on, replayed
    (as sentence-transformers' RandContext does) so that the call's second run draws the same dropout masks on
    every device. Replaying restores the caller's states afterwards (`torch.random.fork_rng`)."""

    def __init__(self, devices: list[int]) -> None:
        self.devices = devices
        self.cpu = torch.get_rng_state()
        self.cuda = [torch.cuda.get_rng_state(d) for d in devices]

    @staticmethod
    def devices_of(model: torch.nn.Module) -> list[int]:
        """The CUDA devices of `model`'s parameters (none on the CPU)."""
        return sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})

    @contextlib.contextmanager
    def replayed(self):
        with torch.random.fork_rng(devices=self.devices):
            torch.set_rng_state(self.cpu)
            for device, state in zip(self.devices, self.cuda):
                torch.cuda.set_rng_state(state, device)
            yield


def cached_calls(model: torch.nn.Module, calls: list[Callable[[], torch.Tensor]],
                 loss_of: Callable[[list[torch.Tensor]], torch.Tensor],
                 loss_params: tuple[torch.Tensor, ...] = ()) -> torch.Tensor:
    """GradCache over any split of a batch into model calls, each of which embeds a part of it (a mini-batch of
    texts; for ColBERT, of queries or of documents).

    Every call runs once without gradients; `loss_of(pieces)` (the calls' outputs, in order) and its gradients with
    respect to every piece are computed once; then, when the returned value is backpropagated, each call runs again
    with gradients (its random state replayed, so dropout draws the same masks) and is backpropagated with its
    piece's cached gradient. Activation memory is one call's, whatever the batch size; the cost is one more forward
    per step. `loss_params`: parameters of the loss itself (a learned scale), whose gradients join the last call's
    backward, the one that DDP (`model`, when wrapped) reduces."""
    states, pieces = [], []
    devices = RandomState.devices_of(model)
    with torch.no_grad():
        for call in calls:
            states.append(RandomState(devices))
            pieces.append(call().requires_grad_())
    with torch.enable_grad():
        loss = loss_of(pieces)
        found = torch.autograd.grad(loss, [*pieces, *loss_params])
    grads, param_grads = found[:len(pieces)], found[len(pieces):]
    value = loss.detach().requires_grad_()

    def replay(grad_output: torch.Tensor) -> None:
        no_sync = getattr(model, "no_sync", None)  # DDP: reduce the gradients once, after the last call
        for n, call in enumerate(calls):
            sync = no_sync() if no_sync is not None and n < len(calls) - 1 else contextlib.nullcontext()
            with states[n].replayed(), sync, torch.enable_grad():  # a backward hook runs with gradients off
                total = (call() * grads[n]).sum()
                if n == len(calls) - 1:
                    total = total + sum((p * g).sum() for p, g in zip(loss_params, param_grads))
                total.mul(grad_output).backward()

    value.register_hook(replay)
    return value
