"""`bertforge mine`: the negatives sentence-transformers' vectors would choose, by rank range and margin, never a
positive, written as n-tuples that `finetune embed` reads; a cross-encoder's scores decide when given."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bertforge.cli import main
from bertforge.data.retrieval import read_tuples

SUBJECTS = ["the river", "a violin", "the old castle", "quantum physics", "the stock market", "a red bicycle",
            "the moon landing", "green tea", "the football final", "medieval poetry"]


@pytest.fixture(scope="module")
def beir(tmp_path_factory):
    """Ten queries, each with one relevant passage (two for the first), among 30 passages about the same subjects."""
    root = tmp_path_factory.mktemp("mine")
    corpus = []
    for i, subject in enumerate(SUBJECTS):
        corpus.append({"_id": f"p{i}", "text": f"This passage is about {subject} and what people know of it."})
        corpus.append({"_id": f"n{i}", "text": f"Some say {subject} is overrated; others disagree strongly."})
        corpus.append({"_id": f"x{i}", "text": f"An unrelated note number {i} on tax forms and filing dates."})
    queries = [{"_id": f"q{i}", "text": f"what do people know about {s}?"} for i, s in enumerate(SUBJECTS)]
    qrels = ["query-id\tcorpus-id\tscore"] + [f"q{i}\tp{i}\t1" for i in range(10)] + ["q0\tn0\t1", "q1\tn1\t0"]
    (root / "qrels").mkdir()
    (root / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    (root / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in queries))
    (root / "qrels" / "train.tsv").write_text("\n".join(qrels) + "\n")
    return root, corpus, queries


def _mine(minilm_dir, beir_dir, out, *flags):
    return main(["mine", "--model", str(minilm_dir), "--data", str(beir_dir), "--out", str(out), "--json", *flags])


def test_negatives_are_sentence_transformers_nearest_non_positives(tmp_path, minilm_dir, st_model, beir, capsys):
    root, corpus, queries = beir
    out = tmp_path / "negatives.jsonl"
    assert _mine(minilm_dir, root, out, "--num-negatives", "3", "--range-min", "1", "--range-max", "8",
                 "--relative-margin", "0.05") == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # The reference: sentence-transformers' vectors, cosine, positives dropped, ranks 1..7 kept, margin applied.
    docs = st_model.encode([d["text"] for d in corpus], normalize_embeddings=True)
    qs = st_model.encode([q["text"] for q in queries], normalize_embeddings=True)
    positives = {f"q{i}": [f"p{i}"] for i in range(10)}
    positives["q0"].append("n0")
    expected = []
    for n, q in enumerate(queries):
        scores = docs @ qs[n]
        order = [corpus[i]["_id"] for i in np.argsort(-scores, kind="stable") if corpus[i]["_id"] not in positives[q["_id"]]]
        window = order[1:8]
        score_of = {d["_id"]: float(s) for d, s in zip(corpus, scores)}
        for pid in positives[q["_id"]]:
            keep = [d for d in window if score_of[d] <= score_of[pid] * 0.95]
            if len(keep) >= 3:
                expected.append((q["text"], pid, keep[:3]))
    text_of = {d["_id"]: d["text"] for d in corpus}
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len(expected) == summary["rows"] and summary["skipped"] == 11 - len(expected)
    for row, (query, pid, negatives) in zip(rows, expected):
        assert list(row) == ["query", "positive", "negative_1", "negative_2", "negative_3"]
        assert row["query"] == query and row["positive"] == text_of[pid]
        assert [row[f"negative_{k}"] for k in (1, 2, 3)] == [text_of[d] for d in negatives]
    # A judged non-relevant document (q1's n1) may be a negative; a relevant one (q0's n0) never is.
    assert all(text_of["n0"] not in list(r.values())[2:] for r in rows if r["query"] == queries[0]["text"])
    data = read_tuples(str(out))
    assert data.shape == "5-tuples" and len(data.rows) == len(rows)


def test_a_cross_encoder_rescores_and_random_sampling_is_seeded(tmp_path, minilm_dir, cross_encoder, beir, capsys):
    root, _, _ = beir
    runs = []
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        out = tmp_path / f"{name}.jsonl"
        assert _mine(minilm_dir, root, out, "--cross-encoder", str(cross_encoder), "--sampling", "random",
                     "--num-negatives", "2", "--range-max", "20", "--seed", str(seed)) == 0
        assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["scored_by"] == "cross-encoder"
        runs.append(out.read_text())
    assert runs[0] == runs[1] and runs[0] != runs[2]
    # --scores: the cross-encoder's scores as a teacher's label (positive first), which finetune embed distils.
    out = tmp_path / "scored.jsonl"
    assert _mine(minilm_dir, root, out, "--cross-encoder", str(cross_encoder), "--num-negatives", "2", "--scores") == 0
    capsys.readouterr()
    from bertforge.tasks.embedding import loss_name

    data = read_tuples(str(out))
    assert data.shape == "scored 4-tuples" and loss_name(None, data) == "MarginMSELoss"
    row = json.loads(out.read_text().splitlines()[0])
    assert len(row["label"]) == 3 and row["label"][1] >= row["label"][2]  # negatives closest first, by the scorer


@pytest.mark.parametrize("flags, message", [
    (("--num-negatives", "5", "--range-min", "2", "--range-max", "6"), "holds fewer candidates than --num-negatives 5"),
    (("--relative-margin", "1.5",), r"--relative-margin must lie in \[0, 1\)"),
    (("--max-score", "-2",), "no \\(query, positive\\) pair kept 3 negatives"),
])
def test_bad_settings_are_refused_in_one_line(tmp_path, minilm_dir, beir, capsys, flags, message):
    import re

    assert _mine(minilm_dir, beir[0], tmp_path / "out.jsonl", *flags) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("predict:")]
    assert len(err) == 1 and re.search(message, err[0]), err  # one line (after the progress bar, if it ran)
    assert not (tmp_path / "out.jsonl").exists()


def test_an_existing_file_is_kept(tmp_path, minilm_dir, beir, capsys):
    out = tmp_path / "out.jsonl"
    out.write_text("mine\n")
    assert _mine(minilm_dir, beir[0], out) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err and out.read_text() == "mine\n"
