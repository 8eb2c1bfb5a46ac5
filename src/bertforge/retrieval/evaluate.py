"""`bertforge evaluate retrieval`: embed a corpus and its queries with a model, search exactly, score as trec_eval.

The model is read as `predict embed` and `serve` read it (its sentence-transformers modules, or mean pooling
for a plain checkpoint), so the figures describe the vectors users get.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def run_retrieval_evaluation(model_dir: str, data_path: str, split: str = "test", top_k: int = 100,
                             batch_size: int = 64, seq_len: int | None = None, query_prompt: str | None = None,
                             document_prompt: str | None = None, measures: str | None = None,
                             run_file: str | None = None) -> dict[str, Any]:
    """The metrics of `model_dir` on a retrieval set (and the TREC run written to `run_file`)."""
    from ..inference.pipelines import embed
    from ..interop.hf import family_of, load_pretrained
    from ..interop.sentence_dir import sentence_pipeline, side_prompt
    from ..tokenization.kinds import load_tokenizer

    names = tuple(m.strip() for m in measures.split(",") if m.strip()) if measures else DEFAULT_MEASURES
    for name in names:
        try:
            parse_measure(name)
        except ValueError as exc:
            raise InputError(f"--measures: {exc}") from None
    if top_k < 1:
        raise InputError("--top-k must be at least 1")
    data = read_retrieval_set(data_path, split)
    backbone = load_pretrained(family_of(model_dir).backbone, model_dir).eval()
    tokenizer = load_tokenizer(model_dir)
    sentence = sentence_pipeline(model_dir, backbone.config.hidden_size)
    if seq_len is not None:  # asked for: it replaces the directory's max_seq_length, within the model's positions
        from ..runconfig import check_seq_len

        check_seq_len(seq_len, backbone.config)
        sentence.max_length = seq_len
    prompts = {"query": query_prompt if query_prompt is not None else side_prompt(sentence.prompts, "query"),
               "document": document_prompt if document_prompt is not None
               else side_prompt(sentence.prompts, "document")}
    queries = data.judged_queries()
    doc_ids = list(data.corpus)
    common = dict(sentence=sentence, batch_size=batch_size)
    q = embed(backbone, tokenizer, list(queries.values()), prompt=prompts["query"] or "", **common)
    d = embed(backbone, tokenizer, [data.corpus[i] for i in doc_ids], prompt=prompts["document"] or "",
              progress=True, **common)
    run = as_run(list(queries), doc_ids, *dense_top_k(q, d, top_k, sentence.similarity))
    if run_file:
        write_run(run, run_file, name=Path(model_dir).resolve().name)
    means, _ = evaluate_run(run, data.qrels, names)
    no_relevant = sum(1 for judged in data.qrels.values() if not any(r >= 1 for r in judged.values()))
    return {**means, "queries": len(queries), "documents": len(doc_ids),
            "queries_without_relevant": no_relevant, "similarity": sentence.similarity,
            "query_prompt": prompts["query"] or "", "document_prompt": prompts["document"] or ""}
