"""Embedding fine-tuning checks more than one test file makes."""

from __future__ import annotations

import torch


def first_step_gradients(task, model: torch.nn.Module) -> tuple[float, dict[str, torch.Tensor]]:
    """The loss of `task`'s first micro-batch and every parameter's gradient, backpropagated as the loop does."""
    loss, _ = task.loss(model, task.micro_batch(0, 0))
    (loss / 2).backward()  # as the loop scales it for gradient accumulation
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
