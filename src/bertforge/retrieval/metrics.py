"""Ranking metrics computed as trec_eval computes them.

A run maps each query id to {document id: score}; qrels map each query id to {document id: relevance}
(graded integers; 0 or less is judged non-relevant). The rules, each one trec_eval's (and so BEIR's,
MTEB's and pytrec_eval's, which wrap it), checked against pytrec_eval in tests/test_retrieval_metrics.py:

- A query's documents are ranked by score, highest first; equal scores are ordered by document id,
  the larger string first (trec_eval's `comp_sim_docno`). Ranks written in a run file are ignored.
- A document is relevant when its relevance is at least 1; a retrieved document absent from the qrels
  is non-relevant.
- nDCG's gain is the relevance value itself (not 2^rel - 1) with a log2(rank + 1) discount; the ideal
  ranking orders every judged document of the query by relevance.
- MAP@k and Recall@k divide by all of the query's relevant documents, not by min(k, that number);
  P@k divides by k even when fewer than k documents were retrieved.
- MRR@k is trec_eval's recip_rank over the first k ranked documents.
- A query with no relevant document scores 0 on every measure, and counts in the mean.

The mean is over the queries of the qrels (trec_eval's `-c`): a judged query missing from the run
scores 0, so a run cannot look better by leaving its hard queries out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

Run = Mapping[str, Mapping[str, float]]
Qrels = Mapping[str, Mapping[str, int]]

# What `evaluate retrieval` reports unless asked otherwise: BEIR's headline measure first.
DEFAULT_MEASURES = ("ndcg@10", "mrr@10", "map@100", "recall@1", "recall@10", "recall@100", "precision@10")
_MEASURE = re.compile(r"^(ndcg|mrr|map|recall|precision)@([1-9][0-9]*)$")


def parse_measure(name: str) -> tuple[str, int]:
    """'ndcg@10' -> ('ndcg', 10); a name outside the five families with a positive cutoff is refused."""
    match = _MEASURE.match(name.strip().lower())
    if not match:
        raise ValueError(f"unknown measure {name!r}: use ndcg@K, mrr@K, map@K, recall@K or precision@K")
    return match.group(1), int(match.group(2))


def ranked(scores: Mapping[str, float]) -> list[str]:
    """Document ids in trec_eval's order: score descending, then document id descending."""
    # Two stable sorts: by id descending, then by score descending (stability keeps the id order within a tie).
    by_id = sorted(scores, reverse=True)
    return sorted(by_id, key=lambda d: -float(scores[d]))


def query_measures(scores: Mapping[str, float], judged: Mapping[str, int], measures: Iterable[str]) -> dict[str, float]:
    """Each measure for one query: its retrieved documents' scores and its judgements."""
    order = ranked(scores)
    relevant = {d for d, rel in judged.items() if rel >= 1}
    hits = [1 if d in relevant else 0 for d in order]
    out = {}
    for name in measures:
        kind, k = parse_measure(name)
        top = hits[:k]
        if not relevant:
            out[name] = 0.0
        elif kind == "precision":
            out[name] = sum(top) / k
        elif kind == "recall":
            out[name] = sum(top) / len(relevant)
        elif kind == "mrr":
            out[name] = next((1.0 / (i + 1) for i, h in enumerate(top) if h), 0.0)
        elif kind == "map":
            found, total = 0, 0.0
            for i, h in enumerate(top):
                if h:
                    found += 1
                    total += found / (i + 1)
            out[name] = total / len(relevant)
        else:  # ndcg
            gains = [max(judged.get(d, 0), 0) for d in order[:k]]
            ideal = sorted((rel for rel in judged.values() if rel > 0), reverse=True)[:k]
            out[name] = _dcg(gains) / _dcg(ideal)
    return out


def _dcg(gains: list[float]) -> float:
    return sum(g / math.log2(i + 2) for i, g in enumerate(gains) if g > 0)


def evaluate_run(run: Run, qrels: Qrels, measures: Iterable[str] = DEFAULT_MEASURES) -> tuple[dict[str, float],
                                                                                             dict[str, dict[str, float]]]:
    """(mean of each measure over the qrels' queries, each query's measures)."""
    measures = tuple(measures)
    for name in measures:
        parse_measure(name)
    per_query = {q: query_measures(run.get(q, {}), judged, measures) for q, judged in qrels.items()}
    count = max(len(per_query), 1)
    means = {m: sum(v[m] for v in per_query.values()) / count for m in measures}
    return means, per_query
