"""Pairs with a similarity score (STS-style rows): the model's similarity of each pair against its score.

`columns[0]`, `columns[1]`: float [B, D], the pairs' two texts; `scores`: float [B]. Under torchrun CoSENT's
pairwise comparison runs over the gathered global batch, as one process would compute it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..models.pooling import similarity
from ..training.distributed import gather


def cosent(columns: list[torch.Tensor], scores: torch.Tensor, scale: float = 20.0, kind: str = "cosine") -> torch.Tensor:
    """CoSENTLoss: every pair (i, j) with score_i > score_j should have similarity_i > similarity_j:
    log(1 + sum over such pairs of exp(scale (sim_j - sim_i)))."""
    a, b = gather(columns[0])[0], gather(columns[1])[0]
    y = gather(scores.unsqueeze(-1))[0].squeeze(-1)
    sims = scale * paired(a, b, kind)
    diff = sims[None, :] - sims[:, None]  # [i, j] = sim_j - sim_i
    wanted = y[:, None] > y[None, :]  # score_i > score_j
    terms = diff[wanted]
    return torch.logsumexp(torch.cat([terms.new_zeros(1), terms]), dim=0)


def cosine_similarity(columns: list[torch.Tensor], scores: torch.Tensor, scale: float = 1.0,
                      kind: str = "cosine") -> torch.Tensor:
    """CosineSimilarityLoss: mean squared error between each pair's cosine similarity and its score."""
    return F.mse_loss(paired(columns[0], columns[1], "cosine"), scores.to(columns[0].dtype))


def paired(a: torch.Tensor, b: torch.Tensor, kind: str) -> torch.Tensor:
    """Row i of a against row i of b: float [B]."""
    if kind == "cosine":
        return F.cosine_similarity(a, b, dim=-1)
    if kind == "dot":
        return (a * b).sum(-1)
    return similarity(a, b, kind).diagonal()
