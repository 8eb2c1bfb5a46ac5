"""A reranker's losses, over the one logit per (query, passage) pair that a batch's single forward gives.

`logits` float [pairs]; for rows of a query and its passages the batch lays the pairs out passage column by
passage column (`batch["candidates"]` columns, the positive's first), so `grid` reads them back as [B, candidates].
`batch["scores"]`: the labels [pairs] of scored pairs, or a teacher's scores [B, ...].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .distillation import margin_targets


def grid(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The logits of a batch of rows as [B, candidates], each row's positive first."""
    return logits.view(int(batch["candidates"]), -1).T


def binary_cross_entropy(logits: torch.Tensor, batch: dict[str, torch.Tensor], scale: float,
                         pos_weight: float | None) -> torch.Tensor:
    """BinaryCrossEntropyLoss: each pair's logit against its label in [0, 1], positives weighted by `pos_weight`."""
    weight = None if pos_weight is None else torch.tensor(pos_weight, device=logits.device)
    return F.binary_cross_entropy_with_logits(logits, batch["scores"], pos_weight=weight)


def multiple_negatives_ranking(logits: torch.Tensor, batch: dict[str, torch.Tensor], scale: float,
                               pos_weight: float | None) -> torch.Tensor:
    """MultipleNegativesRankingLoss (the cross-encoder's): cross-entropy over each row's sigmoid(logit) x `scale`,
    the positive the label, as sentence-transformers' activation and scale."""
    scores = torch.sigmoid(grid(logits, batch)) * scale
    return F.cross_entropy(scores, torch.zeros(scores.shape[0], dtype=torch.long, device=scores.device))


def margin_mse(logits: torch.Tensor, batch: dict[str, torch.Tensor], scale: float,
               pos_weight: float | None) -> torch.Tensor:
    """MarginMSELoss: the logits' margins (positive minus each negative) against the teacher's."""
    rows = grid(logits, batch)
    margins = rows[:, :1] - rows[:, 1:]
    return F.mse_loss(margins, margin_targets(batch["scores"], margins.shape[1]))


def listnet(logits: torch.Tensor, batch: dict[str, torch.Tensor], scale: float,
            pos_weight: float | None) -> torch.Tensor:
    """ListNetLoss: the teacher's softmax over a row's passages as the soft target of the logits'."""
    return F.cross_entropy(grid(logits, batch), batch["scores"].softmax(dim=1))
