"""In-batch negatives: each anchor must pick its own positive among every positive and negative of the batch.

`columns[c]` is float [B, D], the c-th text of every row (anchor, positive, negatives...). In a torchrun job the
candidates are gathered from every process with their gradients (`training.distributed.gather`), so N processes
train exactly as one process with the global batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..models.pooling import similarity
from ..training.distributed import gather


def multiple_negatives_ranking(columns: list[torch.Tensor], scores: torch.Tensor | None, scale: float = 20.0,
                               kind: str = "cosine", symmetric: bool = False) -> torch.Tensor:
    """MultipleNegativesRankingLoss: cross-entropy over `scale` x similarity of each anchor against the (global)
    batch's positives and negatives, its own positive the label. `symmetric` averages it with the positives
    picking their anchor among the batch's anchors."""
    anchors = columns[0]
    gathered = [gather(c) for c in columns[1:]]
    candidates = torch.cat([g for g, _ in gathered])  # [world * B * (columns - 1), D]
    offset = gathered[0][1]
    labels = torch.arange(anchors.shape[0], device=anchors.device) + offset
    forward = F.cross_entropy(scale * similarity(anchors, candidates, kind), labels)
    if not symmetric:
        return forward
    all_anchors, _ = gather(anchors)
    backward = F.cross_entropy(scale * similarity(columns[1], all_anchors, kind), labels)
    return (forward + backward) / 2


def multiple_negatives_symmetric_ranking(columns: list[torch.Tensor], scores: torch.Tensor | None,
                                         scale: float = 20.0, kind: str = "cosine") -> torch.Tensor:
    """MultipleNegativesSymmetricRankingLoss: `multiple_negatives_ranking` both ways, averaged."""
    return multiple_negatives_ranking(columns, scores, scale, kind, symmetric=True)
