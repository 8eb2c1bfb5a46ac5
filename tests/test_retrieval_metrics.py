"""Ranking metrics equal trec_eval's (through pytrec_eval, its Python binding) to 1e-6, and retrieval files
are read and refused by file:line."""

import json
import random
from pathlib import Path

import numpy as np
import pytest

from bertforge.errors import InputError
from bertforge.retrieval.beir import from_pairs, read_beir, read_run, write_run
from bertforge.retrieval.metrics import evaluate_run, parse_measure, ranked
from bertforge.retrieval.search import as_run, dense_top_k

pytrec_eval = pytest.importorskip("pytrec_eval")

# bertforge's name -> trec_eval's (MRR@k is recip_rank over the run cut to its first k documents).
TREC = {"ndcg@10": "ndcg_cut_10", "ndcg@3": "ndcg_cut_3", "map@100": "map_cut_100", "map@5": "map_cut_5",
        "recall@1": "recall_1", "recall@10": "recall_10", "recall@100": "recall_100", "precision@10": "P_10",
        "precision@3": "P_3"}


def reference(run: dict, qrels: dict) -> dict[str, dict[str, float]]:
    """Each query's measures by trec_eval (pytrec_eval), under bertforge's names."""
    per_query = pytrec_eval.RelevanceEvaluator(qrels, set(TREC.values())).evaluate(run)
    cut = {q: {d: run[q][d] for d in ranked(run[q])[:10]} for q in run}
    rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(cut)
    return {q: {**{ours: values[theirs] for ours, theirs in TREC.items()}, "mrr@10": rr[q]["recip_rank"]}
            for q, values in per_query.items()}


def assert_same(run: dict, qrels: dict) -> None:
    means, ours = evaluate_run(run, qrels, [*TREC, "mrr@10"])
    theirs = reference(run, qrels)
    assert set(theirs) == set(qrels)  # every judged query is in the run, so both average over the same queries
    for q in qrels:
        for name, value in theirs[q].items():
            assert ours[q][name] == pytest.approx(value, abs=1e-6), (q, name, run[q], qrels[q])
    for name in means:
        assert means[name] == pytest.approx(np.mean([theirs[q][name] for q in qrels]), abs=1e-6)


def test_hand_made_runs_with_ties_grades_and_no_relevant_document():
    qrels = {"q1": {"a": 2, "b": 1, "c": 0},  # graded
             "q2": {"x": 0, "y": 0},  # judged, none relevant: scores 0 everywhere and counts in the mean
             "q3": {"m": 1, "n": 3, "o": -1}}  # a negative grade: judged non-relevant
    run = {"q1": {"c": 3.0, "b": 3.0, "a": 1.0, "z": 3.0},  # a three-way tie: z, c, b in that order (id descending)
           "q2": {"x": 1.0, "y": 0.5},
           "q3": {"o": 2.0, "m": 2.0, "n": 0.1}}
    assert ranked(run["q1"]) == ["z", "c", "b", "a"]
    assert_same(run, qrels)
    means, per_query = evaluate_run(run, qrels, ["ndcg@10", "recall@1"])
    assert per_query["q2"] == {"ndcg@10": 0.0, "recall@1": 0.0}
    # q1: b (gain 1) at rank 3 and a (gain 2) at rank 4, against the ideal a, b.
    dcg, ideal = 1 / np.log2(4) + 2 / np.log2(5), 2 + 1 / np.log2(3)
    assert per_query["q1"]["ndcg@10"] == pytest.approx(dcg / ideal, abs=1e-12)


def test_random_runs_match_trec_eval():
    rng = random.Random(7)
    for _ in range(200):
        qrels, run = {}, {}
        for q in range(6):
            docs = [f"d{rng.randint(0, 40)}" for _ in range(rng.randint(1, 30))]
            qrels[f"q{q}"] = {d: rng.choice([-1, 0, 0, 1, 1, 2, 3]) for d in docs[:rng.randint(1, len(docs))]}
            run[f"q{q}"] = {d: float(rng.randint(0, 6)) / 3 for d in docs}  # many ties
        assert_same(run, qrels)


def test_a_real_dense_run_matches_trec_eval():
    """Scores from an exact search (float32 similarities as Python floats) rank and score as trec_eval ranks them."""
    rng = np.random.default_rng(0)
    docs, queries = rng.standard_normal((300, 16)).astype(np.float32), rng.standard_normal((40, 16)).astype(np.float32)
    doc_ids, query_ids = [f"doc{i}" for i in range(300)], [f"query{i}" for i in range(40)]
    run = as_run(query_ids, doc_ids, *dense_top_k(queries, docs, 100))
    qrels = {q: {doc_ids[int(i)]: int(rng.integers(0, 3)) for i in rng.choice(300, 8, replace=False)} for q in query_ids}
    assert_same(run, qrels)
    scores = queries @ docs.T / np.linalg.norm(queries, axis=1)[:, None] / np.linalg.norm(docs, axis=1)[None, :]
    best = np.argsort(-scores, axis=1)[:, :100]
    assert all(set(run[q]) == {doc_ids[i] for i in best[n]} for n, q in enumerate(query_ids))


def test_a_judged_query_missing_from_the_run_scores_zero():
    means, per_query = evaluate_run({"q1": {"a": 1.0}}, {"q1": {"a": 1}, "q2": {"b": 1}}, ["ndcg@10"])
    assert per_query["q2"]["ndcg@10"] == 0.0 and means["ndcg@10"] == 0.5


def test_measure_names_are_checked():
    assert parse_measure("NDCG@10") == ("ndcg", 10)
    for bad in ("ndcg", "ndcg@0", "bleu@4", "map@-1"):
        with pytest.raises(ValueError, match="unknown measure"):
            parse_measure(bad)


def test_run_files_round_trip_in_trec_order(tmp_path):
    run = {"q1": {"a": 0.5, "b": 0.75, "c": 0.5}, "q2": {"x": 1e-9}}
    write_run(run, tmp_path / "run.trec", name="test")
    lines = (tmp_path / "run.trec").read_text().splitlines()
    assert lines[:3] == ["q1 Q0 b 1 0.75 test", "q1 Q0 c 2 0.5 test", "q1 Q0 a 3 0.5 test"]
    assert read_run(tmp_path / "run.trec") == run


def _beir(folder: Path, corpus=None, queries=None, qrels="query-id\tcorpus-id\tscore\nq1\td1\t1\n") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    corpus = corpus if corpus is not None else [{"_id": "d1", "title": "T", "text": "first"}, {"_id": "d2", "text": "x"}]
    queries = queries if queries is not None else [{"_id": "q1", "text": "which?"}]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    (folder / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in queries))
    (folder / "qrels").mkdir(exist_ok=True)
    (folder / "qrels" / "test.tsv").write_text(qrels)
    return folder


def test_beir_folders_read_and_refused_by_file_and_line(tmp_path):
    data = read_beir(_beir(tmp_path / "ok"))
    assert data.corpus == {"d1": "T first", "d2": "x"} and data.qrels == {"q1": {"d1": 1}}
    cases = {
        "corpus id": (dict(qrels="query-id\tcorpus-id\tscore\nq1\td9\t1\n"), r"test.tsv:2: corpus-id 'd9' is not in"),
        "query id": (dict(qrels="query-id\tcorpus-id\tscore\nq7\td1\t1\n"), r"test.tsv:2: query-id 'q7' is not in"),
        "score": (dict(qrels="query-id\tcorpus-id\tscore\nq1\td1\thigh\n"), r"test.tsv:2: score 'high' is not an int"),
        "columns": (dict(qrels="query-id\tcorpus-id\tscore\nq1\td1\n"), r"test.tsv:2: expected 3 columns"),
        "header": (dict(qrels="q1\td1\t1\n"), r"test.tsv:1: expected the header"),
        "twice": (dict(qrels="query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td1\t0\n"), r"test.tsv:3: query 'q1' judges"),
        "duplicate doc": (dict(corpus=[{"_id": "d1", "text": "a"}, {"_id": "d1", "text": "b"}]),
                          r"corpus.jsonl:2: duplicate _id 'd1'"),
        "no id": (dict(queries=[{"text": "a"}]), r"queries.jsonl:1: no '_id'"),
    }
    for name, (kwargs, message) in cases.items():
        with pytest.raises(InputError, match=message):
            read_beir(_beir(tmp_path / name.replace(" ", "_"), **kwargs))
    with pytest.raises(InputError, match=r"qrels/dev.tsv: missing \(splits here: test\)"):
        read_beir(tmp_path / "ok", "dev")


def test_pairs_become_a_retrieval_set():
    data = from_pairs([("q a", "p1"), ("q b", "p1"), ("q a", "p2")], "pairs")
    assert data.corpus == {"d0": "p1", "d1": "p2"}
    assert data.qrels == {"q0": {"d0": 1, "d1": 1}, "q1": {"d0": 1}}
