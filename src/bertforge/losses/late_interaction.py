"""PyLate's ColBERT losses over MaxSim scores (token vectors, each query token's best match summed).

queries float [B, Tq, D] with query_kept bool [B, Tq] (None: every vector counts, as with query expansion);
documents float [B, N, Td, D], row b's positive first, with document_kept bool [B, N, Td]; scores float [B, N]
(a teacher's, for Distillation). Each loss takes all of them and the temperature, and uses what it needs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..models.colbert import maxsim
from ..training.distributed import gather

# Floats of a training batch's [queries, documents, Tq, Td] MaxSim similarities held at once (256 MiB), and as
# many again for their gradient: past it they are computed a block of documents at a time.
SIMILARITY_BUDGET = 2**26


def contrastive(queries: torch.Tensor, query_kept: torch.Tensor | None, documents: torch.Tensor,
                document_kept: torch.Tensor, scores: torch.Tensor | None = None,
                temperature: float = 1.0) -> torch.Tensor:
    """PyLate's Contrastive loss: each query's MaxSim against every document of the (global) batch, its positive,
    its negatives and every other row's, in cross-entropy at `temperature`. Under torchrun every process's
    documents are gathered (with gradients)."""
    B, N = documents.shape[:2]
    gathered, offset = gather(documents)
    kept, _ = gather(document_kept.float())
    if query_kept is None:
        query_kept = torch.ones(queries.shape[:2], dtype=torch.bool, device=queries.device)
    similarities = training_maxsim(queries, query_kept, gathered.flatten(0, 1), kept.flatten(0, 1).bool())
    labels = (torch.arange(B, device=queries.device) + offset) * N  # each row's positive in [B, world * B * N]
    return F.cross_entropy(similarities / temperature, labels)


def distillation(queries: torch.Tensor, query_kept: torch.Tensor | None, documents: torch.Tensor,
                 document_kept: torch.Tensor, scores: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """PyLate's Distillation loss: KL(teacher || student) over each row's N documents, the student's MaxSim scores
    min-max normalised per row, both through log-softmax, batch-averaged. PyLate's has no temperature: it is
    not used."""
    every = torch.ones(queries.shape[:2], dtype=torch.bool, device=queries.device)
    student = torch.stack([maxsim(queries[b:b + 1], (query_kept if query_kept is not None else every)[b:b + 1],
                                  documents[b], document_kept[b], dropped_as_zero=True)[0]
                           for b in range(queries.shape[0])])  # [B, N]
    low, high = student.min(dim=1, keepdim=True).values, student.max(dim=1, keepdim=True).values
    student = (student - low) / (high - low + 1e-8)
    return F.kl_div(student.log_softmax(-1), scores.detach().to(student.dtype).log_softmax(-1),
                    reduction="batchmean", log_target=True)


def training_maxsim(queries: torch.Tensor, query_kept: torch.Tensor, documents: torch.Tensor,
                    document_kept: torch.Tensor, budget: int = SIMILARITY_BUDGET) -> torch.Tensor:
    """`maxsim(..., dropped_as_zero=True)` [Q, N] with the [Q, N, Tq, Td] similarities held a block of documents at a
    time: each block is checkpointed (its similarities recomputed in the backward), so a large batch's loss, the
    one GradCache makes possible, needs `budget` floats for them rather than Q * N * Tq * Td."""
    per_document = queries.shape[0] * queries.shape[1] * documents.shape[1]
    block = max(1, budget // max(1, per_document))
    if block >= documents.shape[0]:
        return maxsim(queries, query_kept, documents, document_kept, dropped_as_zero=True)
    return torch.cat([checkpoint(maxsim, queries, query_kept, documents[s:s + block], document_kept[s:s + block],
                                 True, use_reentrant=False) for s in range(0, documents.shape[0], block)], dim=1)
