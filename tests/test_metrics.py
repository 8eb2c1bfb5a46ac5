"""Metric functions against hand-worked examples, the scoring CLI, and the CoNLL reader."""

from __future__ import annotations

import json

import pytest

from bertforge.data.ner import align_labels, read_conll, read_sentences, to_iob2
from bertforge.errors import InputError
from bertforge.metrics import (classification_metrics, entity_metrics, normalize_answer, regression_metrics,
                               squad_metrics, token_f1)

from conftest import shared
from cli_utils import cli


def test_classification_by_hand():
    # gold 1 1 0 0 1 / pred 1 0 0 1 1: TP=2 FN=1 TN=1 FP=1
    m = classification_metrics([1, 1, 0, 0, 1], [1, 0, 0, 1, 1])
    assert m["accuracy"] == pytest.approx(0.6)
    assert m["f1"] == pytest.approx(2 / 3)  # 2TP / (2TP + FP + FN) = 4/6
    assert m["macro_f1"] == pytest.approx((2 / 3 + 0.5) / 2)
    assert m["mcc"] == pytest.approx((2 * 1 - 1 * 1) / (3 * 3 * 2 * 2) ** 0.5)
    three = classification_metrics(["a", "b", "c", "a"], ["a", "b", "b", "a"])
    assert three["accuracy"] == 0.75 and "f1" not in three
    assert three["macro_f1"] == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert classification_metrics(["x", "y"], ["x", "y"])["mcc"] == pytest.approx(1.0)


def test_regression_by_hand():
    m = regression_metrics([1, 2, 3, 4], [2, 4, 6, 8.5])
    assert m["spearman"] == pytest.approx(1.0)
    assert 0.99 < m["pearson"] < 1.0
    assert regression_metrics([1, 2, 3], [3, 2, 1])["pearson"] == pytest.approx(-1.0)


def test_squad_normalisation_and_f1():
    assert normalize_answer("The  Cat's hat!") == "cats hat"
    assert normalize_answer("an apple, a pear and THE plum") == "apple pear and plum"
    assert token_f1("the cat sat", "a cat sat down") == pytest.approx(0.8)  # P = 1, R = 2/3
    assert token_f1("dog", "cat") == 0.0


def test_squad_v1_and_v2_by_hand():
    data = [{"paragraphs": [{"context": "...", "qas": [
        {"id": "q1", "answers": [{"text": "Denver Broncos"}, {"text": "the Broncos"}]},
        {"id": "q2", "answers": [{"text": "Santa Clara, California"}]},
    ]}]}]
    m = squad_metrics(data, {"q1": "Broncos", "q2": "Santa Clara"})
    assert m["exact_match"] == pytest.approx(50.0)  # q1 matches "the Broncos" after normalisation
    assert m["f1"] == pytest.approx(100 * (1.0 + 0.8) / 2)  # q2: P = 1, R = 2/3
    v2 = [{"paragraphs": [{"context": "...", "qas": [
        {"id": "a", "answers": [{"text": "yes"}]}, {"id": "b", "answers": [], "is_impossible": True}]}]}]
    m = squad_metrics(v2, {"a": "yes", "b": "something"})
    assert (m["HasAns_exact"], m["NoAns_exact"], m["exact_match"]) == (100.0, 0.0, 50.0)
    m = squad_metrics(v2, {"a": "yes", "b": "something"}, {"a": 0.2, "b": 0.9}, threshold=0.5)
    assert m["exact_match"] == 100.0 and m["best_exact"] == 100.0 and m["best_exact_thresh"] == 0.2


def test_entity_metrics_by_hand():
    m = entity_metrics([["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "I-PER", "O", "B-ORG"]])
    assert (m["precision"], m["recall"], m["f1"]) == (0.5, 0.5, 0.5)
    assert m["per_type"]["PER"]["f1"] == 1.0 and m["per_type"]["LOC"]["recall"] == 0.0


def test_tag_schemes_to_iob2():
    assert to_iob2(["I-PER", "I-PER", "O", "I-LOC", "B-LOC"]) == ["B-PER", "I-PER", "O", "B-LOC", "B-LOC"]  # IOB1
    assert to_iob2(["B-ORG", "I-ORG", "E-ORG", "S-PER", "O"]) == ["B-ORG", "I-ORG", "I-ORG", "B-PER", "O"]  # BIOES
    assert to_iob2(["S-PER", "S-PER"]) == ["B-PER", "B-PER"]
    with pytest.raises(InputError, match="unknown prefix"):
        to_iob2(["X-PER"])


def test_align_labels_first_subtoken():
    # [CLS] Wash ##ing ##ton went [SEP]: word 0 has three pieces
    assert align_labels([None, 0, 0, 0, 1, None], [3, 0]) == [-100, 3, -100, -100, 0, -100]


def test_conll_reader_on_real_file_and_bad_rows(tmp_path):
    sentences = read_conll(shared("conll2003", "test.txt"))
    assert len(sentences) == 3453 and sum(len(s.tokens) for s in sentences) == 46435
    bad = tmp_path / "bad.txt"
    bad.write_text("EU NNP B-NP B-ORG\nrejects VBZ B-VP\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"bad.txt:2: 3 columns where the file has 4"):
        read_conll(bad)
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text(json.dumps({"tokens": ["a", "b"], "tags": ["O"]}) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="a.jsonl:1: 2 tokens but 1 tags"):
        read_sentences(jsonl)


def score(*args: str):
    return cli("score", *args, "--json")


def test_score_cli(tmp_path):
    gold = tmp_path / "gold.txt"
    gold.write_text("EU B-ORG\nrejects O\nGerman B-MISC\n\nPeter B-PER\nBlackburn I-PER\n", encoding="utf-8")
    pred = tmp_path / "pred.txt"
    pred.write_text("EU B-ORG\nrejects O\nGerman O\n\nPeter B-PER\nBlackburn I-PER\n", encoding="utf-8")
    result = score("ner", str(gold), str(pred))
    assert result.returncode == 0, result.stderr
    m = json.loads(result.stdout)
    assert m["precision"] == 1.0 and m["recall"] == pytest.approx(2 / 3)
    (tmp_path / "g.txt").write_text("pos\nneg\npos\n")
    (tmp_path / "p.txt").write_text("pos\npos\npos\n")
    m = json.loads(score("classification", str(tmp_path / "g.txt"), str(tmp_path / "p.txt")).stdout)
    assert m["accuracy"] == pytest.approx(2 / 3)
    short = tmp_path / "short.txt"
    short.write_text("pos\n")
    bad = score("classification", str(tmp_path / "g.txt"), str(short))
    assert bad.returncode == 2 and "1 labels, but" in bad.stderr and "Traceback" not in bad.stderr


def test_score_squad_cli_on_real_dev(tmp_path):
    """Gold answers as predictions score 100/100; an empty prediction set scores 0."""
    dev = shared("squad", "dev-v1.1.json")
    data = json.loads(dev.read_text(encoding="utf-8"))["data"]
    gold = {qa["id"]: qa["answers"][0]["text"] for a in data for p in a["paragraphs"] for qa in p["qas"]}
    (tmp_path / "pred.json").write_text(json.dumps(gold))
    result = score("squad", str(dev), str(tmp_path / "pred.json"))
    assert json.loads(result.stdout) == {"exact_match": 100.0, "f1": 100.0, "total": 10570, "unanswered": 0}
    (tmp_path / "none.json").write_text("{}")
    assert json.loads(score("squad", str(dev), str(tmp_path / "none.json")).stdout)["f1"] == 0.0
