"""Dropout's effect on training, measured where training feels it: the gradient.

From one start and one batch, `gradient_moments` averages a model's gradient of every
parameter over many dropout draws, and `compare` tells whether two models' mean gradients differ
by more than the Monte Carlo noise (z about 1 when they agree) and how their gradient noise
compares. tests/test_hf_parity.py uses it to hold bertforge's dropout to transformers'. The
script that ran it on MiniLM and on bertforge's own `mini` is retired; its figures are in
docs/results.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import torch

from bertforge.models.heads import span_loss


LossFn = Callable[[torch.nn.Module, dict], torch.Tensor]


def ours_loss(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    return model(**batch).loss


def theirs_loss(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    out = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                attention_mask=batch["attention_mask"])
    return span_loss(out.start_logits, out.end_logits, batch["start_positions"], batch["end_positions"],
                     batch["attention_mask"])


def gradient_moments(model: torch.nn.Module, batch: dict, loss_fn: LossFn, draws: int,
                     names: dict[str, str]) -> dict:
    """Mean gradient and the trace of its per-draw covariance, per parameter, over `draws` dropout draws.

    names: the model's parameter names -> a shared name (transformers'), so two libraries line up.
    Returns {"mean": {name: float64 tensor shaped like the parameter}, "trace": {name: float},
    "loss_mean": float, "loss_std": float}.
    """
    model.train()
    params = {names[n]: p for n, p in model.named_parameters()}
    total = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in params.items()}
    squares = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in params.items()}
    losses = []
    for _ in range(draws):
        model.zero_grad(set_to_none=True)
        loss = loss_fn(model, batch)
        loss.backward()
        losses.append(loss.item())
        for n, p in params.items():
            g = p.grad.double()
            total[n] += g
            squares[n] += g * g
    mean = {n: t / draws for n, t in total.items()}
    # Unbiased per-element variance, summed: the trace of one draw's gradient covariance.
    trace = {n: float(((squares[n] - draws * mean[n] ** 2) / (draws - 1)).sum()) for n in params}
    return {"mean": mean, "trace": trace, "loss_mean": float(np.mean(losses)), "loss_std": float(np.std(losses, ddof=1))}


def block_of(name: str) -> str:
    """A transformers parameter name -> its block: 'embeddings', 'layer N' or 'head'."""
    if ".embeddings." in name:
        return "embeddings"
    m = re.search(r"\.layer\.(\d+)\.", name)
    return f"layer {m.group(1)}" if m else "head"


def compare(a: dict, b: dict, draws: int) -> dict:
    """z (whole model and per block) and the ratio of the gradient noise, for two `gradient_moments` results."""
    blocks: dict[str, list[float]] = {}
    for n in a["mean"]:
        gap = float(((a["mean"][n] - b["mean"][n]) ** 2).sum())
        noise = (a["trace"][n] + b["trace"][n]) / draws
        gap_noise = blocks.setdefault(block_of(n), [0.0, 0.0])
        gap_noise[0] += gap
        gap_noise[1] += noise
    gap, noise = sum(v[0] for v in blocks.values()), sum(v[1] for v in blocks.values())
    return {"z": gap / noise, "z_per_block": {k: v[0] / v[1] for k, v in blocks.items()},
            "noise_ratio": sum(a["trace"].values()) / sum(b["trace"].values()),
            "loss": [a["loss_mean"], b["loss_mean"]],
            "loss_gap_in_se": (a["loss_mean"] - b["loss_mean"])
            / float(np.hypot(a["loss_std"], b["loss_std"]) / np.sqrt(draws))}
