"""Reranking a first stage's candidates with a cross-encoder, and `bertforge evaluate rerank`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import InputError
from ..inference.pipelines import relevance
from ..tokenization.base import Tokenizer
from .beir import RetrievalSet, candidates_for, write_run
from .evaluate import check_measures, read_retrieval_set
from .metrics import evaluate_run, ranked


def rerank_run(model, tokenizer: Tokenizer, data: RetrievalSet, candidates: dict[str, dict[str, float]], top_k: int,
               batch_size: int = 32, activation: str = "sigmoid") -> dict[str, dict[str, float]]:
    """Each judged query's first `top_k` candidates (in trec_eval's order) rescored by the cross-encoder."""
    pairs = []
    for qid in data.judged_queries():
        for did in ranked(candidates.get(qid, {}))[:top_k]:
            if did not in data.corpus:
                raise InputError(f"the candidates name document {did!r} for query {qid!r}, which the corpus lacks")
            pairs.append((qid, did))
    scores = relevance(model, tokenizer, [(data.queries[q], data.corpus[d]) for q, d in pairs], batch_size=batch_size,
                       activation=activation)
    run: dict[str, dict[str, float]] = {qid: {} for qid in data.judged_queries()}
    for (qid, did), (score, _) in zip(pairs, scores):
        run[qid][did] = score
    return run


def run_rerank_evaluation(model_dir: str, data_path: str, candidates: str, split: str = "test", top_k: int = 50,
                          batch_size: int = 32, measures: str | None = None,
                          run_file: str | None = None) -> dict[str, Any]:
    """The metrics of the `candidates` run's top `top_k` per judged query reranked by the cross-encoder at
    `model_dir`, beside the first stage's own (and the reranked run written to `run_file`)."""
    from ..interop.hf import head_of
    from ..interop.sentence_dir import cross_encoder_activation
    from ..tokenization.kinds import load_tokenizer

    names = check_measures(measures)
    if top_k < 1:
        raise InputError("--top-k must be at least 1")
    head = head_of(model_dir)
    if head.kind != "sequence-classification":
        raise InputError(f"{model_dir}: a {head.cls.hf_architecture}, not a cross-encoder (a sequence-classification "
                         "model scoring (query, passage) pairs)")
    data = read_retrieval_set(data_path, split)
    first = candidates_for(data, candidates)
    model = head.cls.from_pretrained(model_dir).eval()
    run = rerank_run(model, load_tokenizer(model_dir), data, first, top_k, batch_size,
                     cross_encoder_activation(model_dir))
    if run_file:
        write_run(run, run_file, name=Path(model_dir).resolve().name)
    before = {qid: {d: first.get(qid, {})[d] for d in ranked(first.get(qid, {}))[:top_k]} for qid in data.qrels}
    return {**evaluate_run(run, data.qrels, names)[0],
            "first_stage": evaluate_run(before, data.qrels, names)[0], "queries": len(data.judged_queries()),
            "top_k": top_k}
