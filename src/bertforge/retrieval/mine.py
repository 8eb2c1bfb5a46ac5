"""`bertforge mine`: hard negatives for each (query, positive) pair, written as the n-tuples `finetune embed` reads.

An embedder retrieves each judged query's nearest documents (exact search); its relevant documents are dropped;
the candidates kept are those in a rank range, below the positive's score by an absolute or a relative margin
(the guard against unjudged positives: a "negative" scored as high as the positive is probably relevant), and
under a maximum score. An optional cross-encoder rescores the candidates and the positive first, and its scores
then decide. The settings and their defaults follow sentence-transformers' `mine_hard_negatives`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from .beir import positives
from .evaluate import encode_set, read_retrieval_set


@dataclass
class MineSettings:
    num_negatives: int = 3
    range_min: int = 0  # skip this many of the closest non-positive candidates
    range_max: int = 100  # consider candidates up to this rank (non-positives only)
    absolute_margin: float | None = None  # keep a candidate scored at most positive - margin
    relative_margin: float | None = None  # keep a candidate scored at most positive x (1 - margin)
    max_score: float | None = None  # keep a candidate scored at most this
    sampling: str = "top"  # top: the closest that pass; random: a seeded sample of those that pass

    def check(self) -> None:
        if self.num_negatives < 1:
            raise InputError("--num-negatives must be at least 1")
        if not 0 <= self.range_min < self.range_max:
            raise InputError("--range-min must be at least 0 and below --range-max")
        if self.range_max - self.range_min < self.num_negatives:
            raise InputError(f"--range-min {self.range_min} to --range-max {self.range_max} holds fewer candidates "
                             f"than --num-negatives {self.num_negatives}")
        if self.relative_margin is not None and not 0 <= self.relative_margin < 1:
            raise InputError("--relative-margin must lie in [0, 1)")
        if self.absolute_margin is not None and self.absolute_margin < 0:
            raise InputError("--absolute-margin must be 0 or more")
        if self.sampling not in ("top", "random"):
            raise InputError("--sampling must be top or random")


def choose(candidates: list[tuple[str, float]], positive_score: float, s: MineSettings,
           rng: np.random.Generator) -> list[str] | None:
    """`s.num_negatives` document ids from `candidates` ((id, score), closest first, positives already removed and
    the rank range applied) that pass the margins, or None when too few pass."""
    passing = [d for d, score in candidates
               if (s.absolute_margin is None or score <= positive_score - s.absolute_margin)
               and (s.relative_margin is None or score <= positive_score * (1 - s.relative_margin))
               and (s.max_score is None or score <= s.max_score)]
    if len(passing) < s.num_negatives:
        return None
    if s.sampling == "top":
        return passing[:s.num_negatives]
    picked = sorted(rng.choice(len(passing), s.num_negatives, replace=False))  # kept in rank order
    return [passing[i] for i in picked]


def run_mine(model_dir: str, data_path: str, out: str, settings: MineSettings, split: str = "train",
             cross_encoder: str | None = None, batch_size: int = 64, seed: int = 0,
             query_prompt: str | None = None, document_prompt: str | None = None,
             with_scores: bool = False) -> dict[str, Any]:
    """Mine `data_path`'s `split` with `model_dir`; write one JSONL row (query, positive, negative_1..n) per
    (query, positive) with enough negatives to `out` (with `with_scores`, a `label` list too: the positive's score, then
    each negative's, by the cross-encoder when given: MarginMSE's teacher); returns counts and mean scores."""
    settings.check()
    data = read_retrieval_set(data_path, split)
    where = str(Path(data_path) / "qrels" / f"{split}.tsv") if Path(data_path).is_dir() else data_path
    relevant = positives(data, where)
    enc = encode_set(model_dir, data, batch_size, None, query_prompt, document_prompt)
    most = max(len(docs) for docs in relevant.values())
    scores, indices, _ = enc.search(settings.range_max + most)
    by_id = {d: i for i, d in enumerate(enc.doc_ids)}
    rows, skipped, positive_scores, negative_scores = [], 0, [], []
    candidates_of: dict[str, list[tuple[str, float]]] = {}
    positive_of: dict[tuple[str, str], float] = {}
    for n, qid in enumerate(enc.query_ids):
        good = set(relevant[qid])
        ranked = [(enc.doc_ids[int(i)], float(s)) for s, i in zip(scores[n], indices[n])
                  if enc.doc_ids[int(i)] not in good]
        candidates_of[qid] = ranked[settings.range_min:settings.range_max]
        for d, value in zip(relevant[qid], enc.scores(n, [by_id[d] for d in relevant[qid]])):
            positive_of[(qid, d)] = value
    if cross_encoder:
        candidates_of, positive_of = _rescore(cross_encoder, data, candidates_of, positive_of, batch_size)
    rng = np.random.default_rng(seed)
    for qid in enc.query_ids:
        for pid in relevant[qid]:
            chosen = choose(candidates_of[qid], positive_of[(qid, pid)], settings, rng)
            if chosen is None:
                skipped += 1
                continue
            row = {"query": data.queries[qid], "positive": data.corpus[pid]}
            row.update({f"negative_{k + 1}": data.corpus[d] for k, d in enumerate(chosen)})
            chosen_scores = dict(candidates_of[qid])
            if with_scores:
                row["label"] = [positive_of[(qid, pid)]] + [chosen_scores[d] for d in chosen]
            rows.append(json.dumps(row, ensure_ascii=False) + "\n")
            positive_scores.append(positive_of[(qid, pid)])
            negative_scores += [chosen_scores[d] for d in chosen]
    if not rows:
        raise InputError(f"no (query, positive) pair kept {settings.num_negatives} negatives; widen --range-max or "
                         "loosen the margins")
    from ..safefiles import atomic_write

    atomic_write(out, lambda tmp: Path(tmp).write_text("".join(rows), encoding="utf-8"))
    return {"rows": len(rows), "skipped": skipped, "queries": len(enc.query_ids), "documents": len(enc.doc_ids),
            "negatives_per_row": settings.num_negatives, "scored_by": "cross-encoder" if cross_encoder else "embedder",
            "mean_positive_score": float(np.mean(positive_scores)), "mean_negative_score": float(np.mean(negative_scores)),
            "out": out}


def _rescore(model_dir: str, data, candidates_of: dict, positive_of: dict, batch_size: int) -> tuple[dict, dict]:
    """The candidates and positives scored by a cross-encoder (its sigmoid score), candidates re-sorted by it."""
    from ..inference.pipelines import relevance
    from ..interop.hf import head_of
    from ..tokenization.kinds import load_tokenizer

    head = head_of(model_dir)
    if head.kind != "sequence-classification":
        raise InputError(f"--cross-encoder {model_dir}: a {head.cls.hf_architecture}, not a cross-encoder (a "
                         "sequence-classification model scoring (query, passage) pairs)")
    model = head.cls.from_pretrained(model_dir).eval()
    tokenizer = load_tokenizer(model_dir)
    pairs = [(qid, d) for qid, ranked in candidates_of.items() for d, _ in ranked] + list(positive_of)
    scored = relevance(model, tokenizer, [(data.queries[q], data.corpus[d]) for q, d in pairs], batch_size=batch_size)
    score = {pair: s for pair, (s, _) in zip(pairs, scored)}
    candidates = {qid: sorted(((d, score[(qid, d)]) for d, _ in ranked), key=lambda x: -x[1])
                  for qid, ranked in candidates_of.items()}
    return candidates, {pair: score[pair] for pair in positive_of}
