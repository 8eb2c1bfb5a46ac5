"""A passage-retrieval set built from SQuAD: each question retrieves the paragraph it was asked about.

SQuAD v1.1 dev has 48 Wikipedia articles, 2,067 paragraphs and 10,570 questions, each written by a
reader of one paragraph: exactly one relevant passage per question, judged by construction. The
articles are dealt into train / dev / test by a seeded shuffle, so no paragraph (and no article)
is a positive in two splits; the corpus is every paragraph, so a test question searches all 2,067,
training paragraphs included, as a BEIR set's splits share one corpus. Nothing is copied into the
repository: the folder is written from the user's own SQuAD file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..data.io import read_text
from ..errors import InputError

SPLITS = (("train", 32), ("dev", 4), ("test", 12))  # articles per split; 48 in SQuAD v1.1 dev


def squad_retrieval(squad_file: str | Path, out: str | Path, seed: int = 0) -> dict[str, dict[str, int]]:
    """Write a BEIR folder (corpus.jsonl, queries.jsonl, qrels/{train,dev,test}.tsv) to `out` from a SQuAD
    JSON file; returns each split's counts of articles, passages and queries."""
    try:
        articles = json.loads(read_text(squad_file))["data"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise InputError(f"{squad_file}: not a SQuAD JSON file (an object with a 'data' list of articles)") from None
    needed = sum(n for _, n in SPLITS)
    if len(articles) < needed:
        raise InputError(f"{squad_file}: {len(articles)} articles; the train/dev/test split needs {needed} "
                         "(SQuAD v1.1 dev has 48)")
    order = np.random.default_rng(seed).permutation(len(articles))
    split_of, start = {}, 0
    for name, count in SPLITS:
        for a in order[start:start + count]:
            split_of[int(a)] = name
        start += count
    for a in order[start:]:  # a larger file's remaining articles train
        split_of[int(a)] = "train"
    out = Path(out)
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    corpus, queries = [], []
    qrels: dict[str, list[str]] = {name: [] for name, _ in SPLITS}
    counts = {name: {"articles": 0, "passages": 0, "queries": 0} for name, _ in SPLITS}
    for a, article in enumerate(articles):
        split = split_of[a]
        counts[split]["articles"] += 1
        for p, paragraph in enumerate(article["paragraphs"]):
            doc = f"{a}-{p}"
            corpus.append({"_id": doc, "title": "", "text": paragraph["context"]})
            counts[split]["passages"] += 1
            for qa in paragraph["qas"]:
                queries.append({"_id": qa["id"], "text": qa["question"].strip()})
                qrels[split].append(f"{qa['id']}\t{doc}\t1\n")
                counts[split]["queries"] += 1
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in corpus)
    with open(out / "queries.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in queries)
    for name, rows in qrels.items():
        (out / "qrels" / f"{name}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(rows), encoding="utf-8")
    return counts
