"""Classification and entity metrics against independent implementations, on generated input.

- accuracy, macro-F1, binary F1 and MCC against scikit-learn;
- entity precision/recall/F1 against a second statement of conlleval's chunk rules (written here
  from the rules of the conlleval script: where a chunk starts and ends, given the previous tag),
  on tag sequences with every irregularity CoNLL files have: I- after O, a type change inside a
  chunk, B- after B-.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertforge.metrics import classification_metrics, entity_metrics

sklearn_metrics = pytest.importorskip("sklearn.metrics")

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True)


@SETTINGS
@given(pairs=st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from("abc")), min_size=1, max_size=40))
def test_classification_metrics_equal_scikit_learn(pairs):
    gold, pred = [g for g, _ in pairs], [p for _, p in pairs]
    got = classification_metrics(gold, pred)
    labels = sorted(set(gold) | set(pred))
    assert got["accuracy"] == pytest.approx(sklearn_metrics.accuracy_score(gold, pred))
    assert got["macro_f1"] == pytest.approx(sklearn_metrics.f1_score(gold, pred, labels=labels, average="macro",
                                                                     zero_division=0))
    assert got["mcc"] == pytest.approx(sklearn_metrics.matthews_corrcoef(gold, pred), abs=1e-12)
    if len(labels) == 2:
        assert got["f1"] == pytest.approx(sklearn_metrics.f1_score(gold, pred, pos_label=labels[1], average="binary",
                                                                   zero_division=0))


# ----------------------------------------------------------------------------- conlleval's chunk rules
def _split(tag: str) -> tuple[str, str]:
    return ("O", "") if tag == "O" else (tag[0], tag[2:])


def _ends(prev: str, prev_type: str, tag: str, kind: str) -> bool:
    """Does a chunk end between the previous token and this one (conlleval's endOfChunk)?"""
    return ((prev == "B" and tag in "BO") or (prev == "I" and tag in "BO")
            or (prev != "O" and prev_type != kind))


def _starts(prev: str, prev_type: str, tag: str, kind: str) -> bool:
    """Does a chunk start at this token (conlleval's startOfChunk)?"""
    return tag == "B" or (prev == "O" and tag == "I") or (tag != "O" and prev_type != kind)


def _chunks(tags: list[str]) -> set[tuple[int, int, str]]:
    found, start, prev, prev_type = set(), None, "O", ""
    for i, tag in enumerate(tags + ["O"]):  # a sentence ends every chunk
        now, kind = _split(tag)
        if start is not None and _ends(prev, prev_type, now, kind):
            found.add((start, i, prev_type))
            start = None
        if _starts(prev, prev_type, now, kind):
            start = i
        prev, prev_type = now, kind
    return found


def conlleval(gold: list[list[str]], pred: list[list[str]]) -> tuple[float, float, float]:
    correct = found_gold = found_pred = 0
    for n, (g, p) in enumerate(zip(gold, pred)):
        gc, pc = _chunks(g), _chunks(p)
        correct += len(gc & pc)
        found_gold += len(gc)
        found_pred += len(pc)
    precision = correct / found_pred if found_pred else 0.0
    recall = correct / found_gold if found_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


TAGS = st.sampled_from(["O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-ORG"])


@SETTINGS
@given(data=st.data())
def test_entity_metrics_follow_conlleval(data):
    lengths = data.draw(st.lists(st.integers(1, 8), min_size=1, max_size=4))
    gold = [data.draw(st.lists(TAGS, min_size=n, max_size=n)) for n in lengths]
    pred = [data.draw(st.lists(TAGS, min_size=n, max_size=n)) for n in lengths]
    got = entity_metrics(gold, pred)
    want = conlleval(gold, pred)
    assert (got["precision"], got["recall"], got["f1"]) == pytest.approx(want), (gold, pred)
