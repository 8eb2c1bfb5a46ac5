"""Exact late-interaction search: every query's MaxSim against every document, the top k kept.

ColBERT's documents keep a variable number of vectors each; they are padded once into one
[N, T, D] tensor with a mask, and scored in blocks of queries and documents so that the
[queries, documents, Tq, Td] similarity block stays near `budget` floats. At the SQuAD-retrieval
set's size (2,067 passages) this exact scan is the reference an approximate (PLAID) index would be
measured against.
"""

from __future__ import annotations

import numpy as np
import torch

from ..models.colbert import maxsim


def padded(vectors: list[np.ndarray], dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Variable-length [n_i, D] arrays -> (float32 [N, T, D] zero-padded, bool [N, T] mask of real vectors)."""
    longest = max((len(v) for v in vectors), default=0)
    out = torch.zeros(len(vectors), max(longest, 1), dim)
    mask = torch.zeros(len(vectors), max(longest, 1), dtype=torch.bool)
    for i, v in enumerate(vectors):
        out[i, :len(v)] = torch.from_numpy(np.asarray(v, dtype=np.float32))
        mask[i, :len(v)] = True
    return out, mask


def maxsim_scores(queries: list[np.ndarray], documents: list[np.ndarray], dim: int,
                  budget: int = 2**24) -> torch.Tensor:
    """MaxSim of every query against every document: float32 [Q, N]."""
    q, q_mask = padded(queries, dim)
    d, d_mask = padded(documents, dim)
    q_block = min(len(queries), 64)
    d_block = max(1, budget // (q.shape[1] * d.shape[1] * max(1, q_block)))  # [q_block, d_block, Tq, Td] floats
    rows = []
    for qs in range(0, len(queries), q_block):
        rows.append(torch.cat([maxsim(q[qs:qs + q_block], q_mask[qs:qs + q_block], d[ds:ds + d_block],
                                      d_mask[ds:ds + d_block]) for ds in range(0, len(documents), d_block)], dim=1))
    return torch.cat(rows) if rows else torch.zeros(0, len(documents))


def maxsim_top_k(queries: list[np.ndarray], documents: list[np.ndarray], k: int, dim: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(scores float32 [Q, k'], document indices int64 [Q, k']) with k' = min(k, N), best first."""
    k = min(k, len(documents))
    if not queries or not documents:
        return np.zeros((len(queries), k), np.float32), np.zeros((len(queries), k), np.int64)
    top = maxsim_scores(queries, documents, dim).topk(k, dim=1)
    return top.values.numpy(), top.indices.numpy()
