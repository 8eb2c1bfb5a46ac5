"""The one inference loop: features in length-sorted batches through a model, results in input order.

Task evaluation (`tasks/`), every pipeline (`pipelines.py`) and so the CLI and the server all
run through `run_sorted`. Sorting by length keeps padding per batch small (and the model unpads
what is left); the longest batch goes first, so memory peaks at the start rather than at the end.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..data.batching import collate


class Abandoned(Exception):
    """The work was given up between two batches: a server whose shutdown grace has passed."""


_ABANDON = threading.Event()


def abandon_all() -> None:
    """From now on every `run_sorted` in this process stops before its next batch, raising `Abandoned`.

    A server past its shutdown grace calls it, so that it exits within one batch's time (at most
    `batch_size` rows of the model's length) rather than a request's, which may hold thousands of rows.
    Nothing resets it: it is for a process on its way out.
    """
    _ABANDON.set()


def length_batches(lengths: list[int], batch_size: int) -> Iterator[list[int]]:
    """Indices grouped into batches of similar length (longest first, so memory peaks early)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    for start in range(0, len(order), batch_size):
        yield order[start:start + batch_size]


def device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def evaluating(module: Any) -> Any:
    """`module.eval()`, skipped when no part of it is training: eval() sets the flag on every submodule, ~0.3 ms
    for a 6-layer encoder on every call (every request a server answers), where looking costs a third of that."""
    if not isinstance(module, torch.nn.Module) or any(m.training for m in module.modules()):
        module.eval()
    return module


def run_sorted(features: list[dict], pad_id: int, batch_size: int, step: Callable[[dict, list[int]], list],
               device: torch.device | None = None, progress: bool = False) -> list:
    """Call `step(batch, rows)` on length-sorted batches of `features` and return its results in input order.

    features: dicts with at least `input_ids` (and `token_type_ids`); batch: their collated tensors
    (input_ids, token_type_ids, attention_mask: long [B, T], on `device` when given); rows: which
    features the batch holds, in batch order. `step` returns one result per row.
    """
    results: list = [None] * len(features)
    batches = list(length_batches([len(f["input_ids"]) for f in features], batch_size))
    if progress:
        from tqdm import tqdm

        batches = tqdm(batches, desc="predict", unit="batch")
    for rows in batches:
        if _ABANDON.is_set():
            raise Abandoned("the server is shutting down")
        batch = collate([features[i] for i in rows], pad_id)
        if device is not None:
            batch = {k: v.to(device) for k, v in batch.items()}
        for i, value in zip(rows, step(batch, rows)):
            results[i] = value
    return results
