"""`bertforge evaluate retrieval`: embed a corpus and its queries with a model, search exactly, score as trec_eval.

The model is read as `predict embed` and `serve` read it (its sentence-transformers modules, or mean pooling
for a plain checkpoint), so the figures describe the vectors users get.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from .beir import RetrievalSet, from_pairs, read_beir, write_run
from .metrics import DEFAULT_MEASURES, evaluate_run, parse_measure
from .search import as_run, dense_top_k


def read_retrieval_set(path: str, split: str) -> RetrievalSet:
    """A BEIR folder's `split`, or a (query, passage) pair file as a retrieval set."""
    if Path(path).is_dir():
        return read_beir(path, split)
    from ..data.retrieval import read_tuples

    data = read_tuples(path, split)
    if data.scores is not None:
        raise InputError(f"{path}: scored pairs; retrieval is evaluated on a BEIR folder or (query, passage) pairs")
    return from_pairs([(r[0], r[1]) for r in data.rows], path)


def read_dev_set(path: str, split: str) -> RetrievalSet | None:
    """A trainer's --dev set (`read_retrieval_set`), or None without one (nothing is evaluated)."""
    return read_retrieval_set(path, split) if path else None


def check_measures(measures: str | None) -> tuple[str, ...]:
    """--measures (comma-separated) as measure names, each checked; none: DEFAULT_MEASURES."""
    names = tuple(m.strip() for m in measures.split(",") if m.strip()) if measures else DEFAULT_MEASURES
    for name in names:
        try:
            parse_measure(name)
        except ValueError as exc:
            raise InputError(f"--measures: {exc}") from None
    return names


@dataclass
class Encoded:
    """A retrieval set's judged queries and corpus, embedded by one model, and how that model compares them."""

    query_ids: list[str]
    doc_ids: list[str]
    queries: Any  # float32 [Q, D]: a NumPy array; a scipy CSR matrix (SPLADE); a list of [n_i, D] arrays (ColBERT)
    documents: Any  # float32 [N, D], the same
    similarity: str
    prompts: dict[str, str]

    @property
    def multi_vector(self) -> bool:
        return isinstance(self.documents, list)

    @property
    def sparse(self) -> bool:
        return not isinstance(self.documents, (np.ndarray, list))

    def scores(self, query: int, documents: list[int]) -> list[float]:
        """Query number `query` against the given documents (indices), by the model's similarity."""
        if self.multi_vector:
            from .late_interaction import maxsim_scores

            return maxsim_scores([self.queries[query]], [self.documents[i] for i in documents],
                                 self.queries[query].shape[1])[0].tolist()
        if self.sparse:
            return (self.queries[query] @ self.documents[documents].T).toarray()[0].astype(np.float32).tolist()
        import torch

        from ..models.pooling import similarity

        q = torch.from_numpy(self.queries[query:query + 1])
        return similarity(q, torch.from_numpy(self.documents[documents]), self.similarity)[0].tolist()

    def search(self, k: int) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
        """(scores [Q, k'], document indices [Q, k'], what the search cost): exact dense search, or an inverted
        index over sparse vectors (its memory, the vectors' mean non-zeros and the time per query reported)."""
        if self.multi_vector:
            import time

            from .late_interaction import maxsim_top_k

            started = time.perf_counter()
            dim = self.documents[0].shape[1] if self.documents else 0
            scores, indices = maxsim_top_k(self.queries, self.documents, k, dim)
            return scores, indices, {
                "index_mib": sum(d.nbytes for d in self.documents) / 2**20,
                "query_ms": (time.perf_counter() - started) / max(1, len(self.queries)) * 1e3,
                "vectors_per_query": float(np.mean([len(q) for q in self.queries])) if self.queries else 0.0,
                "vectors_per_document": float(np.mean([len(d) for d in self.documents])) if self.documents else 0.0}
        if not self.sparse:
            return (*dense_top_k(self.queries, self.documents, k, self.similarity), {})
        import time

        from .sparse_index import InvertedIndex

        index = InvertedIndex(self.documents)
        started = time.perf_counter()
        scores, indices = index.search(self.queries, k)
        per_query = (time.perf_counter() - started) / max(1, self.queries.shape[0])
        return scores, indices, {
            "index_mib": index.nbytes / 2**20, "query_ms": per_query * 1e3,
            "nonzero_per_query": float(self.queries.getnnz(axis=1).mean()) if self.queries.shape[0] else 0.0,
            "nonzero_per_document": float(self.documents.getnnz(axis=1).mean()) if self.documents.shape[0] else 0.0}


def encode_set(model_dir: str, data: RetrievalSet, batch_size: int = 64, seq_len: int | None = None,
               query_prompt: str | None = None, document_prompt: str | None = None) -> Encoded:
    """Embed `data`'s judged queries and whole corpus as `predict embed` and `serve` embed with the model (its
    sentence-transformers modules, or mean pooling), with its query and document prompts unless given."""
    from ..inference.pipelines import embed
    from ..interop.hf import family_of, load_pretrained
    from ..interop.sentence_dir import sentence_pipeline, side_prompt
    from ..interop.sparse_dir import is_sparse_dir
    from ..tokenization.kinds import load_tokenizer

    from ..interop.colbert_dir import is_colbert_dir

    if is_sparse_dir(model_dir):
        return _encode_sparse(model_dir, data, batch_size, seq_len, query_prompt, document_prompt)
    if is_colbert_dir(model_dir):
        return _encode_colbert(model_dir, data, batch_size, seq_len, query_prompt, document_prompt)
    backbone = load_pretrained(family_of(model_dir).backbone, model_dir).eval()
    tokenizer = load_tokenizer(model_dir)
    sentence = sentence_pipeline(model_dir, backbone.config.hidden_size)
    if seq_len is not None:  # asked for: it replaces the directory's max_seq_length, within the model's positions
        from ..settings import check_seq_len

        check_seq_len(seq_len, backbone.config)
        sentence.max_length = seq_len
    prompts = {"query": query_prompt if query_prompt is not None else side_prompt(sentence.prompts, "query") or "",
               "document": document_prompt if document_prompt is not None
               else side_prompt(sentence.prompts, "document") or ""}
    queries = data.judged_queries()
    doc_ids = list(data.corpus)
    common = dict(sentence=sentence, batch_size=batch_size)
    q = embed(backbone, tokenizer, list(queries.values()), prompt=prompts["query"], **common)
    d = embed(backbone, tokenizer, [data.corpus[i] for i in doc_ids], prompt=prompts["document"], progress=True,
              **common)
    return Encoded(list(queries), doc_ids, q, d, sentence.similarity, prompts)


def _encode_sparse(model_dir: str, data: RetrievalSet, batch_size: int, seq_len: int | None,
                   query_prompt: str | None, document_prompt: str | None) -> Encoded:
    """`encode_set` for a SparseEncoder (SPLADE) directory: sparse vectors as `SparseEncoder.encode_query` and
    `encode_document` give them (an inference-free model's queries by its query weights)."""
    from ..inference.sparse import SparseModel
    from ..interop.sentence_dir import side_prompt

    sparse = SparseModel.load(model_dir)
    if seq_len is not None:
        from ..settings import check_seq_len

        check_seq_len(seq_len, sparse.model.config)
    spec = sparse.spec
    prompts = {"query": query_prompt if query_prompt is not None else side_prompt(spec.prompts, "query") or "",
               "document": document_prompt if document_prompt is not None
               else side_prompt(spec.prompts, "document") or ""}
    queries = data.judged_queries()
    doc_ids = list(data.corpus)
    q = sparse.encode(list(queries.values()), True, prompts["query"], batch_size, seq_len)
    d = sparse.encode([data.corpus[i] for i in doc_ids], False, prompts["document"], batch_size, seq_len,
                      progress=True)
    return Encoded(list(queries), doc_ids, q, d, spec.similarity, prompts)


def _encode_colbert(model_dir: str, data: RetrievalSet, batch_size: int, seq_len: int | None,
                    query_prompt: str | None, document_prompt: str | None) -> Encoded:
    """`encode_set` for a ColBERT directory: each text's token vectors as PyLate's `ColBERT.encode` gives them (its
    query and document prefixes are its prompts; other prompts and --seq-len are refused)."""
    from ..inference.multi_vector import multi_vector_embed
    from ..interop.colbert_dir import load_colbert

    if query_prompt or document_prompt or seq_len is not None:
        raise InputError(f"{model_dir}: a ColBERT model marks queries and documents with its own prefix tokens and "
                         "lengths (query_prefix, query_length, ... in config_sentence_transformers.json); "
                         "--query-prompt, --document-prompt and --seq-len are not applied to it")
    model, spec, tokenizer = load_colbert(model_dir)
    queries = data.judged_queries()
    doc_ids = list(data.corpus)
    q = multi_vector_embed(model, tokenizer, spec, list(queries.values()), True, batch_size)
    d = multi_vector_embed(model, tokenizer, spec, [data.corpus[i] for i in doc_ids], False, batch_size,
                           progress=True)
    return Encoded(list(queries), doc_ids, q, d, spec.similarity,
                   {"query": spec.query_prefix, "document": spec.document_prefix})


def run_retrieval_evaluation(model_dir: str, data_path: str, split: str = "test", top_k: int = 100,
                             batch_size: int = 64, seq_len: int | None = None, query_prompt: str | None = None,
                             document_prompt: str | None = None, measures: str | None = None,
                             run_file: str | None = None) -> dict[str, Any]:
    """The metrics of `model_dir` on a retrieval set (and the TREC run written to `run_file`)."""
    names = check_measures(measures)
    if top_k < 1:
        raise InputError("--top-k must be at least 1")
    data = read_retrieval_set(data_path, split)
    enc = encode_set(model_dir, data, batch_size, seq_len, query_prompt, document_prompt)
    scores, indices, cost = enc.search(top_k)
    run = as_run(enc.query_ids, enc.doc_ids, scores, indices)
    if run_file:
        write_run(run, run_file, name=Path(model_dir).resolve().name)
    means, _ = evaluate_run(run, data.qrels, names)
    no_relevant = sum(1 for judged in data.qrels.values() if not any(r >= 1 for r in judged.values()))
    return {**means, "queries": len(enc.query_ids), "documents": len(enc.doc_ids),
            "queries_without_relevant": no_relevant, "similarity": enc.similarity,
            "query_prompt": enc.prompts["query"], "document_prompt": enc.prompts["document"], **cost}
