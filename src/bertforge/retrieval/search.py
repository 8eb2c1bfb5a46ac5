"""Exact search: every query scored against every document, the top k kept.

At the corpus sizes bertforge trains and evaluates on (up to a few million vectors on one machine)
an exact scan is the reference every approximate index is measured against, and it has no
settings to get wrong. Scores are computed in blocks of queries so memory stays at
`block x documents` floats.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..interop.sentence_dir import similarity


def dense_top_k(queries: np.ndarray, documents: np.ndarray, k: int, kind: str = "cosine",
                block: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Query vectors float [Q, D] and document vectors float [N, D] -> (scores float32 [Q, k'], document
    indices int64 [Q, k']) with k' = min(k, N), best first, by sentence-transformers' similarity `kind`."""
    q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))
    d = torch.from_numpy(np.ascontiguousarray(documents, dtype=np.float32))
    return blocked_top_k(lambda rows: similarity(q[rows], d, kind), q.shape[0], d.shape[0], k, block)


def blocked_top_k(score: Callable[[slice], torch.Tensor], queries: int, documents: int, k: int,
                  block: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """The top k' = min(k, documents) of every query, `score(rows)` giving a block of queries' scores against every
    document (float [rows, documents]): (scores float32 [queries, k'], document indices int64 [queries, k'])."""
    k = min(k, documents)
    scores, indices = [], []
    for start in range(0, queries, block):
        top = score(slice(start, start + block)).topk(k, dim=1)
        scores.append(top.values)
        indices.append(top.indices)
    if not scores:
        return np.zeros((0, k), np.float32), np.zeros((0, k), np.int64)
    return torch.cat(scores).numpy(), torch.cat(indices).numpy()


def as_run(query_ids: Sequence[str], doc_ids: Sequence[str], scores: np.ndarray,
           indices: np.ndarray) -> dict[str, dict[str, float]]:
    """query id -> {document id: score} from `dense_top_k`'s arrays (scores as Python floats, exactly)."""
    return {qid: {doc_ids[int(i)]: float(s) for s, i in zip(row_s, row_i)}
            for qid, row_s, row_i in zip(query_ids, scores, indices)}
