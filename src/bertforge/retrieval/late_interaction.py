"""Exact late-interaction search: every query's MaxSim against every document, the top k kept.

ColBERT's documents keep a variable number of vectors each; they are scored in blocks of queries
and of documents of similar length, each block padded to its own longest, one matrix product a
block, so that the [queries x Tq, documents x Td] similarity block stays near `budget` floats. At
the SQuAD-retrieval set's size (2,067 passages) this exact scan is the reference an approximate
(PLAID) index would be measured against.
"""

from __future__ import annotations

import numpy as np
import torch



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
                  budget: int = 2**22) -> torch.Tensor:
    """MaxSim of every query against every document: float32 [Q, N].

    Equal to `models.colbert.maxsim` over the kept vectors, computed for search: documents in order of length, each
    block padded only to its own longest, and padded with copies of the document's own first vector, which cannot
    change its maximum, so no mask is applied to the [queries x Tq, documents x Td] similarities, one matrix product
    per block (a query's padding is zeros: its best match is 0, adding nothing; so is an empty document's score)."""
    if not queries or not documents:
        return torch.zeros(len(queries), len(documents))
    q, _ = padded(queries, dim)
    q_block, tq = min(len(queries), 64), q.shape[1]
    order = sorted(range(len(documents)), key=lambda i: len(documents[i]))
    scores = torch.empty(len(queries), len(documents))
    start = 0
    while start < len(order):
        # As many documents as keep [q_block * Tq, block * Td] within `budget` floats at the width the block ends
        # with (its last, longest document's).
        block = 1
        while start + block < len(order):
            if q_block * tq * max(1, len(documents[order[start + block]])) * (block + 1) > budget:
                break
            block += 1
        chosen = order[start:start + block]
        d = _padded_with_repeats([documents[i] for i in chosen], dim)  # [block, Td, D]
        flat = d.reshape(-1, dim).T  # [D, block * Td]
        columns = torch.tensor(chosen)
        for qs in range(0, len(queries), q_block):
            part = q[qs:qs + q_block]  # [b, Tq, D]
            sims = part.reshape(-1, dim) @ flat  # [b * Tq, block * Td]
            best = sims.view(-1, len(chosen), d.shape[1]).amax(-1)  # [b * Tq, block]
            scores[qs:qs + q_block, columns] = best.view(part.shape[0], tq, len(chosen)).sum(1)
        start += block
    return scores


def _padded_with_repeats(vectors: list[np.ndarray], dim: int) -> torch.Tensor:
    """Variable-length [n_i, D] arrays -> float32 [N, T, D], each padded with its own first vector (zeros if empty)."""
    longest = max(1, max(len(v) for v in vectors))
    out = torch.zeros(len(vectors), longest, dim)
    for i, v in enumerate(vectors):
        if len(v):
            out[i, :len(v)] = torch.from_numpy(np.asarray(v, dtype=np.float32))
            out[i, len(v):] = out[i, 0]
    return out


def maxsim_top_k(queries: list[np.ndarray], documents: list[np.ndarray], k: int, dim: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(scores float32 [Q, k'], document indices int64 [Q, k']) with k' = min(k, N), best first."""
    k = min(k, len(documents))
    if not queries or not documents:
        return np.zeros((len(queries), k), np.float32), np.zeros((len(queries), k), np.int64)
    top = maxsim_scores(queries, documents, dim).topk(k, dim=1)
    return top.values.numpy(), top.indices.numpy()
