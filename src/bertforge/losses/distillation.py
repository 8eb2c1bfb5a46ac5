"""Distillation from a teacher's scores (`mine --scores` writes them): the student's dot products against them.

`columns[0]` is the queries float [B, D], `columns[1:]` each row's passages (the positive first). Dot product
whatever the model's similarity, as sentence-transformers computes these losses.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def margin_mse(columns: list[torch.Tensor], scores: torch.Tensor, scale: float = 1.0, kind: str = "dot") -> torch.Tensor:
    """MarginMSELoss: the squared error between the student's margins dot(q, positive) - dot(q, negative_i) and the
    teacher's. `scores` float [B] (one negative), [B, n] (the teacher's margins) or [B, n + 1] (its scores)."""
    query, positive, negatives = columns[0], columns[1], columns[2:]
    positive_score = (query * positive).sum(-1)
    margins = torch.stack([positive_score - (query * n).sum(-1) for n in negatives], dim=1)
    return F.mse_loss(margins, margin_targets(scores, len(negatives)).to(margins.dtype))


def distill_kl_div(columns: list[torch.Tensor], scores: torch.Tensor, scale: float = 1.0,
                   kind: str = "dot") -> torch.Tensor:
    """DistillKLDivLoss (listwise): KL(teacher || student) between the softmax over each row's passages of the
    teacher's scores (float [B, passages], the positive's first) and of the student's dot products, both at
    temperature `scale`, times scale^2, averaged over rows."""
    query = columns[0]
    student = torch.stack([(query * passage).sum(-1) for passage in columns[1:]], dim=1) / scale
    teacher = scores.detach().to(student.dtype) / scale
    return F.kl_div(student.log_softmax(dim=1), teacher.softmax(dim=1), reduction="batchmean") * scale ** 2


def margin_targets(scores: torch.Tensor, negatives: int) -> torch.Tensor:
    """A teacher's margins float [B, negatives] from what a row gives: one margin [B], the margins [B, n], or the
    scores [B, n + 1] (the positive's first), as sentence-transformers' MarginMSE losses read them."""
    labels = scores.detach()
    labels = labels.unsqueeze(1) if labels.dim() == 1 else labels
    return labels[:, :1] - labels[:, 1:] if labels.shape[1] == negatives + 1 else labels
