"""The retrieval benchmarks' shared parts: SQuAD-retrieval training pairs and qrels samples, a hard-negative mining
step, an encoder without its head, BM25, and the verdict the ladders print."""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

from ..common import bertforge_json as bertforge


def pairs_file(squad_set: Path, out: Path, count: int) -> Path:
    from bertforge.data.retrieval import read_tuples

    rows = read_tuples(str(squad_set), "train").rows[:count]
    out.write_text("".join(json.dumps({"query": q, "positive": p}) + "\n" for q, p in rows), encoding="utf-8")
    return out


def qrels_sample(squad_set: Path, split: str, name: str, count: int, seed: int = 0) -> str:
    """Write qrels/`name`.tsv: a seeded sample of `count` judged queries of `split` (all when count is 0)."""
    lines = (squad_set / "qrels" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()
    header, body = lines[0], lines[1:]
    queries = sorted({line.split("\t")[0] for line in body})
    keep = set(random.Random(seed).sample(queries, count)) if 0 < count < len(queries) else set(queries)
    (squad_set / "qrels" / f"{name}.tsv").write_text(
        "\n".join([header] + [line for line in body if line.split("\t")[0] in keep]) + "\n", encoding="utf-8")
    return name


def mine_step(model: Path, squad_set: Path, train: Path, out: Path) -> dict:
    """Step 3's mining (see the docstring) of the training pairs' queries into `out`; returns mine's summary with
    its wall seconds. The same inputs give the same file (seeded draws), so other benchmarks train on these rows."""
    queries = {json.loads(line)["query"] for line in train.read_text(encoding="utf-8").splitlines()}
    started = time.time()
    stats = bertforge("mine", "--model", str(model), "--data",
                      str(train_only_set(squad_set, out.parent / "train-set", queries)), "--split", "train",
                      "--out", str(out), "--num-negatives", "3", "--range-max", "30", "--relative-margin", "0.05",
                      "--sampling", "random", "--seed", "0")
    stats["seconds"] = time.time() - started
    return stats


def encoder_only(model: Path, out: Path) -> Path:
    """The checkpoint's Hugging Face files without its sentence-transformers modules: a cross-encoder's start."""
    out.mkdir()
    for f in model.iterdir():
        if f.is_file() and f.name not in ("modules.json", "sentence_bert_config.json",
                                          "config_sentence_transformers.json", "README.md"):
            shutil.copy(f, out / f.name)
    return out


def verdict(before: dict, after: dict) -> str:
    gap = after["mean"] - before["mean"]
    bound = max(before["std"], after["std"])
    return "gain" if gap > bound else "loss" if gap < -bound else "the same"


def bm25(squad_set: Path) -> dict:
    """BM25 (bm25s) on the test split, scored by bertforge's trec_eval measures."""
    import bm25s

    from bertforge.retrieval.beir import read_beir
    from bertforge.retrieval.metrics import evaluate_run

    data = read_beir(squad_set, "test")
    doc_ids = list(data.corpus)
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize([data.corpus[d] for d in doc_ids], stopwords="en", show_progress=False),
                    show_progress=False)
    queries = data.judged_queries()
    found, scores = retriever.retrieve(bm25s.tokenize(list(queries.values()), stopwords="en", show_progress=False),
                                       k=100, show_progress=False)
    run = {q: {doc_ids[int(i)]: float(s) for i, s in zip(row, row_scores)}
           for q, row, row_scores in zip(queries, found, scores)}
    return evaluate_run(run, data.qrels)[0]


def train_only_set(squad_set: Path, out: Path, queries: set[str]) -> Path:
    """A BEIR folder of the train split alone: the given queries, and only passages relevant to train queries."""
    from bertforge.retrieval.beir import read_beir

    train = read_beir(squad_set, "train")
    passages = {d for judged in train.qrels.values() for d in judged}
    (out / "qrels").mkdir(parents=True)
    (out / "corpus.jsonl").write_text("".join(
        json.dumps({"_id": d, "title": "", "text": train.corpus[d]}) + "\n" for d in sorted(passages)), encoding="utf-8")
    kept = {q: t for q, t in train.queries.items() if t in queries and q in train.qrels}
    (out / "queries.jsonl").write_text("".join(
        json.dumps({"_id": q, "text": t}) + "\n" for q, t in kept.items()), encoding="utf-8")
    (out / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t{s}\n" for q in kept for d, s in train.qrels[q].items()), encoding="utf-8")
    return out
