"""Optimisers and the learning-rate schedule used by the one training loop.

- AdamW (torch's), with no weight decay on biases and LayerNorm, as in google-research/bert.
- LAMB (You et al., 2019) for large batches: Adam's update rescaled per tensor by the trust
  ratio ||w|| / ||update||. torch has no LAMB, and the packages that did are unmaintained,
  so the few lines live here.
- Linear warmup to the peak rate, then linear decay to zero at the last step.
"""

from __future__ import annotations

import math

import torch


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: matrices and embeddings decay; biases and LayerNorm parameters (all 1-D) do not."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class Lamb(torch.optim.Optimizer):
    """LAMB: layer-wise adaptive moments. Bias-corrected Adam direction plus decoupled decay, times a trust ratio."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float64)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = state["step"].item()
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                update = (m / (1 - beta1 ** t)) / ((v / (1 - beta2 ** t)).sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(p, alpha=group["weight_decay"])
                w_norm, u_norm = p.norm(), update.norm()
                trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                p.add_(update, alpha=-group["lr"] * trust.item())
        return loss


def build_optimizer(model: torch.nn.Module, name: str, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    groups = parameter_groups(model, weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6)
    if name == "lamb":
        return Lamb(groups, lr=lr)
    raise ValueError(f"unknown optimizer {name!r} (adamw or lamb)")


def warmup_steps_for(warmup: float, total_steps: int) -> int:
    """`--warmup` as a number of steps: a fraction (< 1) of total_steps rounded up, as transformers'
    TrainingArguments.get_warmup_steps does, or else a step count."""
    return math.ceil(warmup * total_steps) if warmup < 1 else int(warmup)


def warmup_linear(warmup_steps: int, total_steps: int):
    """Multiplier of the peak rate at a (0-based) step: step/warmup over the warmup, then linear to 0 at total_steps.

    The first step's rate is 0, as in google-research/bert (`global_step / num_warmup_steps`)
    and transformers' `get_linear_schedule_with_warmup`. That step still fills Adam's moments,
    and it keeps bertforge's schedule step for step equal to the Trainer's, so side-by-side runs
    differ only by their random draws. With no warmup the first step runs at the peak rate.
    """

    def factor(step: int) -> float:
        if step < warmup_steps:
            return step / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return factor
