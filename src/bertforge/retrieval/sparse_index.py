"""Exact search over sparse vectors: an inverted index, scored by dot product.

The documents' SPLADE vectors, transposed, are the classic inverted index: for every vocabulary word,
its posting list (the documents with a non-zero weight for it, and that weight), here a scipy CSR
matrix [V, N] whose row w is word w's postings. A query's scores are the sum over its non-zero
words of its weight times each posting's: one sparse product, no approximation, so its rankings are
the reference an approximate engine (Lucene's, a vector database's) would be measured against.
"""

from __future__ import annotations

import numpy as np


class InvertedIndex:
    """Posting lists of documents' sparse vectors (scipy CSR float32 [N, V])."""

    def __init__(self, documents) -> None:
        self.postings = documents.T.tocsr()  # [V, N]: row w lists the documents that have word w
        self.documents = documents.shape[0]

    @property
    def nbytes(self) -> int:
        """The index's memory: postings (document id int32 + weight float32 each) and the words' offsets."""
        p = self.postings
        return p.data.nbytes + p.indices.nbytes + p.indptr.nbytes

    def search(self, queries, k: int, block: int = 256) -> tuple[np.ndarray, np.ndarray]:
        """Sparse query vectors (CSR float32 [Q, V]) -> (scores float32 [Q, k'], document indices int64 [Q, k']),
        k' = min(k, N), best first (equal scores are ordered later by document id, as trec_eval orders them)."""
        import torch

        from .search import blocked_top_k

        return blocked_top_k(lambda rows: torch.from_numpy((queries[rows] @ self.postings).toarray().astype(np.float32)),
                             queries.shape[0], self.documents, k, block)
