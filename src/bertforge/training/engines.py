"""Which engine runs the one training loop: the torch `Trainer`, or the same loop on JAX.

This choice sits above both engines, so that the JAX loop (which subclasses `Trainer`) and the torch
loop never import each other, and the torch path never loads JAX.
"""

from __future__ import annotations

from typing import Any

import torch

from ..settings import TrainConfig
from .trainer import Task, Trainer


def check_engine(config: Any) -> None:
    """Refuse what the run's engine cannot do before anything is read or written: with --backend jax, JAX
    missing, or a per-process batch that does not split over the JAX devices."""
    if config.backend == "jax":
        from ..errors import require

        require("jax", "jax", "flax", "optax", what="--backend jax")
        from ..jax.devices import check_batch_split

        check_batch_split(config.batch_size)


def make_trainer(model: torch.nn.Module, task: Task, config: TrainConfig, run_info: dict[str, Any],
                 seq_len: int, pad_id: int) -> Trainer:
    """The loop for `config.backend`: the torch `Trainer`, or the same loop on JAX (`jax/loop.py`,
    imported only then, so the torch path never loads JAX). seq_len and pad_id: how JAX pads."""
    if config.backend == "jax":
        from ..errors import require

        require("jax", "jax", "flax", "optax", what="--backend jax")
        from ..jax.loop import jax_trainer

        return jax_trainer(model, task, config, run_info, seq_len, pad_id)
    return Trainer(model, task, config, run_info)
