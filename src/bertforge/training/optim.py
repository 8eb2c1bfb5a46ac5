"""Optimisers and the learning-rate schedule used by the one training loop.

- AdamW (torch's fused kernel), with no weight decay on biases and LayerNorm, as in google-research/bert.
- LAMB (You et al., 2019) for large batches: Adam's update rescaled per tensor by the trust
  ratio ||w|| / ||update||. torch has no LAMB, and the packages that did are unmaintained,
  so the few lines live here.
- Linear warmup to the peak rate, then linear decay to zero at the last step.
"""

from __future__ import annotations

import math

import torch


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: matrices and embeddings decay; biases and LayerNorm parameters (all 1-D) do not. A parameter
    marked with an `lr_ratio` (a learned loss scale) gets a group of its own, without decay, whose learning rate
    is that multiple of the run's (the loop applies it at every step)."""
    decay, no_decay, own = [], [], []
    for _, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if hasattr(p, "lr_ratio"):
            own.append({"params": [p], "weight_decay": 0.0, "lr_ratio": p.lr_ratio})
        else:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}, *own]


class Lamb(torch.optim.Optimizer):
    """LAMB: layer-wise adaptive moments. Bias-corrected Adam direction plus decoupled decay, times a trust ratio.

    The update runs on all of a group's tensors at once (torch's `_foreach_*` kernels), and the trust ratios stay
    on the device: one host sync per group (the step count), not two per parameter.
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            beta1, beta2 = group["betas"]
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float64)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
            t = self.state[params[0]]["step"].item()  # one count for the group: its tensors step together
            grads = [p.grad for p in params]
            m = [self.state[p]["exp_avg"] for p in params]
            v = [self.state[p]["exp_avg_sq"] for p in params]
            torch._foreach_lerp_(m, grads, 1 - beta1)  # m = beta1 m + (1 - beta1) g
            torch._foreach_mul_(v, beta2)
            torch._foreach_addcmul_(v, grads, grads, value=1 - beta2)
            denominators = torch._foreach_sqrt(torch._foreach_div(v, 1 - beta2 ** t))
            torch._foreach_add_(denominators, group["eps"])
            updates = torch._foreach_div(torch._foreach_div(m, 1 - beta1 ** t), denominators)
            if group["weight_decay"]:
                torch._foreach_add_(updates, params, alpha=group["weight_decay"])
            w_norms, u_norms = torch._foreach_norm(params), torch._foreach_norm(updates)
            ratios = [torch.where((w > 0) & (u > 0), w / u, torch.ones_like(w)) * -group["lr"]
                      for w, u in zip(w_norms, u_norms)]
            torch._foreach_mul_(updates, ratios)
            torch._foreach_add_(params, updates)
        return loss


def build_optimizer(model: torch.nn.Module, name: str, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    groups = parameter_groups(model, weight_decay)
    if name == "adamw":
        # torch's fused kernel: one pass over each tensor for the whole update (3x the foreach version on a
        # mini-sized model here); the same maths, to float rounding.
        fused = all(p.device.type in ("cpu", "cuda") for g in groups for p in g["params"])
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6, fused=fused or None)
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
