"""SQuAD scoring against a second, independent statement of each official rule set, on generated data.

The reference below is written from the two official scripts' rules, question by question, and
shares no code with `bertforge.metrics`. hypothesis generates datasets whose answers are built
from the awkward cases: articles, punctuation, case, repeated words, answers that normalise to
nothing, questions with no answer. The two must agree on every input.
"""

from __future__ import annotations

import re
import string
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertforge.errors import InputError
from bertforge.metrics import squad_metrics


# ----------------------------------------------------------------------------- the reference
def _norm(text: str) -> list[str]:
    """The official normalisation, written as one pass per rule: lower, punctuation, articles, spaces."""
    lowered = text.lower()
    no_punct = "".join(c for c in lowered if c not in string.punctuation)
    no_articles = re.sub(r"\b(a|an|the)\b", " ", no_punct)
    return no_articles.split()


def _em(pred: str, gold: str) -> float:
    return 1.0 if _norm(pred) == _norm(gold) else 0.0


def _f1_v11(pred: str, gold: str) -> float:
    shared = sum((Counter(_norm(pred)) & Counter(_norm(gold))).values())
    if shared == 0:
        return 0.0
    p, r = shared / len(_norm(pred)), shared / len(_norm(gold))
    return 2 * p * r / (p + r)


def _f1_v20(pred: str, gold: str) -> float:
    if not _norm(pred) or not _norm(gold):
        return 1.0 if _norm(pred) == _norm(gold) else 0.0
    return _f1_v11(pred, gold)


def reference_v11(questions: list[dict], preds: dict[str, str]) -> dict[str, float]:
    em = f1 = 0.0
    for q in questions:
        if q["id"] in preds:
            golds = [a["text"] for a in q["answers"]]
            em += max(_em(preds[q["id"]], g) for g in golds)
            f1 += max(_f1_v11(preds[q["id"]], g) for g in golds)
    return {"exact_match": 100 * em / len(questions), "f1": 100 * f1 / len(questions)}


def reference_v20(questions: list[dict], preds: dict[str, str], probs: dict[str, float] | None,
                  threshold: float) -> dict[str, float]:
    rows = []
    for q in questions:
        golds = [a["text"] for a in q["answers"] if _norm(a["text"])] or [""]
        pred = preds[q["id"]]
        em, f1 = max(_em(pred, g) for g in golds), max(_f1_v20(pred, g) for g in golds)
        has = len(q["answers"]) > 0
        if probs is not None and probs[q["id"]] > threshold:
            em = f1 = 0.0 if has else 1.0
        rows.append((has, em, f1))
    out = {"exact_match": 100 * sum(r[1] for r in rows) / len(rows), "f1": 100 * sum(r[2] for r in rows) / len(rows)}
    for name, want in (("HasAns", True), ("NoAns", False)):
        part = [r for r in rows if r[0] == want]
        if part:
            out[f"{name}_exact"] = 100 * sum(r[1] for r in part) / len(part)
            out[f"{name}_f1"] = 100 * sum(r[2] for r in part) / len(part)
    return out


# ----------------------------------------------------------------------------- generated data
WORDS = ["the", "a", "an", "The", "cat", "Cat's", "sat", "mat", "mat.", "!", "...", "1", "1,000", "an apple",
         "A", "  ", "Ünïcode", "cat", "-", "the the"]
answer_text = st.lists(st.sampled_from(WORDS), min_size=0, max_size=4).map(" ".join)


@st.composite
def squad_data(draw, version: str):
    n = draw(st.integers(1, 6))
    questions = []
    for i in range(n):
        answers = draw(st.lists(answer_text, min_size=1 if version == "1.1" else 0, max_size=3))
        questions.append({"id": f"q{i}", "answers": [{"text": t, "answer_start": 0} for t in answers]})
    return questions


def as_articles(questions: list[dict]) -> list[dict]:
    return [{"title": "t", "paragraphs": [{"context": "c", "qas": questions}]}]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(data=st.data())
def test_v11_matches_the_official_rules(data):
    questions = data.draw(squad_data("1.1"))
    preds = {q["id"]: data.draw(answer_text) for q in questions if data.draw(st.booleans()) or q is questions[0]}
    got = squad_metrics(as_articles(questions), preds, version="1.1")
    want = reference_v11(questions, preds)
    for key, value in want.items():
        assert got[key] == pytest.approx(value), (key, questions, preds)
    assert got["unanswered"] == len(questions) - len(preds)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(data=st.data(), with_probs=st.booleans(), threshold=st.sampled_from([0.0, 0.3, 0.5, 1.0]))
def test_v20_matches_the_official_rules(data, with_probs, threshold):
    questions = data.draw(squad_data("2.0"))
    preds = {q["id"]: data.draw(answer_text) for q in questions}
    probs = {q["id"]: data.draw(st.sampled_from([0.0, 0.2, 0.4, 0.6, 0.9])) for q in questions} if with_probs else None
    got = squad_metrics(as_articles(questions), preds, probs, threshold, version="2.0")
    want = reference_v20(questions, preds, probs, threshold)
    for key, value in want.items():
        assert got[key] == pytest.approx(value), (key, questions, preds, probs)
    splits = {k for k in got if k.startswith(("HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1"))}
    assert splits == {k for k in want if k.startswith(("HasAns", "NoAns"))}


def test_the_versions_differ_where_the_scripts_do():
    """A gold answer that normalises to nothing: v1.1 keeps it (EM 1, F1 0 for an empty prediction);
    v2.0 drops it, and an empty prediction then matches the empty answer fully."""
    questions = [{"id": "q", "answers": [{"text": "The"}]}]
    v11 = squad_metrics(as_articles(questions), {"q": "a"}, version="1.1")
    v20 = squad_metrics(as_articles(questions), {"q": "a"}, version="2.0")
    assert (v11["exact_match"], v11["f1"]) == (100.0, 0.0)
    assert (v20["exact_match"], v20["f1"]) == (100.0, 100.0)
    assert v20["HasAns_total"] == 1  # it has an answer list, so it is not a NoAns question


def test_what_the_official_scripts_cannot_score_is_refused():
    with pytest.raises(InputError, match="no gold answer"):
        squad_metrics(as_articles([{"id": "q", "answers": []}]), {"q": "x"}, version="1.1")
    with pytest.raises(InputError, match="no prediction"):
        squad_metrics(as_articles([{"id": "q", "answers": []}, {"id": "r", "answers": []}]), {"q": ""})
    with pytest.raises(InputError, match="twice"):
        squad_metrics(as_articles([{"id": "q", "answers": [{"text": "x"}]}] * 2), {"q": "x"})
    with pytest.raises(InputError, match="v2.0"):
        squad_metrics(as_articles([{"id": "q", "answers": [{"text": "x"}]}]), {"q": "x"}, {"q": 0.1})
