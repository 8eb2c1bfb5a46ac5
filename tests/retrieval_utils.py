"""Retrieval checks more than one test file makes: exact IR measures of a score matrix against a BEIR folder's qrels."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def exact_measures(scores: np.ndarray, beir: Path, k: int) -> dict[str, float]:
    """trec_eval's measures of the run that keeps each query's `k` best documents by `scores` [Q, N] (query q{i},
    document d{j}), on the folder's test qrels."""
    from bertforge.retrieval.beir import read_beir
    from bertforge.retrieval.metrics import evaluate_run

    run = {f"q{i}": {f"d{j}": float(scores[i, j]) for j in np.argsort(-scores[i], kind="stable")[:k]}
           for i in range(len(scores))}
    return evaluate_run(run, read_beir(beir, "test").qrels)[0]
