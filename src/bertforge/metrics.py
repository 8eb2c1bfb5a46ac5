"""Task metrics, defined as the official scripts and the usual libraries define them.

- classification: accuracy, macro-F1, F1 of the positive class (binary), Matthews correlation;
- regression: Pearson and Spearman correlation (scipy);
- NER: entity-level precision / recall / F1, overall and per type (seqeval, whose default mode
  counts entities as conlleval does);
- SQuAD: exact match and token F1 after the official answer normalisation, max over the gold
  answers, as percentages; for v2 also the HasAns / NoAns splits and the best null threshold.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Sequence

import numpy as np

from .errors import InputError


# ----------------------------------------------------------------------------- classification
def classification_metrics(gold: Sequence, pred: Sequence, labels: Sequence | None = None,
                           positive=None) -> dict[str, float]:
    """accuracy, macro_f1, mcc, and f1 (of `positive`, default the second label) when there are two labels."""
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold labels but {len(pred)} predictions")
    if not gold:
        raise ValueError("no labels to score")
    labels = list(labels) if labels is not None else sorted(set(gold) | set(pred), key=str)
    index = {label: i for i, label in enumerate(labels)}
    k = len(labels)
    confusion = np.zeros((k, k), dtype=np.int64)  # rows: gold, columns: predicted
    for g, p in zip(gold, pred):
        confusion[index[g], index[p]] += 1
    tp = np.diag(confusion).astype(float)
    per_class_f1 = np.divide(2 * tp, confusion.sum(0) + confusion.sum(1), out=np.zeros(k), where=(confusion.sum(0) + confusion.sum(1)) > 0)
    present = (confusion.sum(1) + confusion.sum(0)) > 0
    result = {"accuracy": float(tp.sum() / confusion.sum()), "macro_f1": float(per_class_f1[present].mean()),
              "mcc": _mcc(confusion)}
    if k == 2:
        pos = index[positive] if positive is not None else 1
        result["f1"] = float(per_class_f1[pos])
    return result


def _mcc(c: np.ndarray) -> float:
    """Multi-class Matthews correlation (Gorodkin's R_K), equal to the binary formula for two classes."""
    t, p = c.sum(1).astype(float), c.sum(0).astype(float)
    n, correct = float(c.sum()), float(np.trace(c))
    denominator = np.sqrt((n * n - (p * p).sum()) * (n * n - (t * t).sum()))
    return float((correct * n - (t * p).sum()) / denominator) if denominator > 0 else 0.0


# ----------------------------------------------------------------------------- regression
def regression_metrics(gold: Sequence[float], pred: Sequence[float]) -> dict[str, float]:
    from scipy.stats import pearsonr, spearmanr

    g, p = np.asarray(gold, dtype=float), np.asarray(pred, dtype=float)
    return {"pearson": float(pearsonr(g, p)[0]), "spearman": float(spearmanr(g, p)[0]),
            "mse": float(((g - p) ** 2).mean())}


# ----------------------------------------------------------------------------- NER
def entity_metrics(gold: list[list[str]], pred: list[list[str]]) -> dict:
    """Entity-level P/R/F1 over sentences of IOB tags, overall and per type (seqeval, conlleval mode)."""
    from seqeval.metrics import classification_report

    if len(gold) != len(pred) or any(len(g) != len(p) for g, p in zip(gold, pred)):
        raise ValueError("gold and predicted tag sequences are not aligned")
    report = classification_report(gold, pred, output_dict=True, zero_division=0)
    per_type = {name: {"precision": v["precision"], "recall": v["recall"], "f1": v["f1-score"], "support": int(v["support"])}
                for name, v in report.items() if not name.endswith("avg")}
    micro = report["micro avg"]
    return {"precision": micro["precision"], "recall": micro["recall"], "f1": micro["f1-score"], "per_type": per_type}


# ----------------------------------------------------------------------------- SQuAD
def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace (the official order)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str, version: str = "2.0") -> float:
    """Token-overlap F1 of the normalised answers.

    The two official scripts differ on empty answers: v2.0 scores 1 when both normalise to
    nothing and 0 when only one does; v1.1 scores 0 whenever no token is shared, so two
    empty answers score 0 there.
    """
    pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if version != "1.1" and (not pred_tokens or not gold_tokens):
        return float(pred_tokens == gold_tokens)
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_version(dataset: list[dict], declared: str | None = None) -> str:
    """"1.1" or "2.0": the file's own `version` when it says, else 2.0 when any question is marked
    `is_impossible` or has no answers (the v2.0 script's notion of a no-answer question)."""
    if declared is not None:
        text = str(declared).lstrip("v")
        if text.startswith("1."):
            return "1.1"
        if text.startswith("2."):
            return "2.0"
        raise InputError(f"unknown SQuAD version {declared!r}; expected 1.1 or v2.0")
    questions = (qa for article in dataset for paragraph in article["paragraphs"] for qa in paragraph["qas"])
    return "2.0" if any("is_impossible" in qa or not qa.get("answers") for qa in questions) else "1.1"


def squad_metrics(dataset: list[dict], predictions: dict[str, str], no_answer_probs: dict[str, float] | None = None,
                  threshold: float = 1.0, version: str | None = None) -> dict[str, float]:
    """Score predictions (question id -> answer text, "" for no answer) on SQuAD `data` articles,
    by the rules of the official script of the data's version (see `squad_version`).

    v1.1 (evaluate-v1.1.py): every question counts, an unanswered one scores 0; gold answers
    are taken as they are. Returns {"exact_match", "f1", "total", "unanswered"}.
    v2.0 (evaluate-v2.0.py): gold answers that normalise to nothing are dropped ("" when none
    is left); a question has an answer when its answer list is non-empty; with
    `no_answer_probs`, a probability above `threshold` means "no answer". Adds the HasAns /
    NoAns splits and, with `no_answer_probs`, the best threshold and its scores.

    Where the official script would crash or silently shrink the total, this refuses with an
    `InputError` instead: a duplicated question id, a v1.1 question with no gold answer, a v2.0
    question with no prediction (or no probability), or probabilities given for v1.1 data.
    """
    version = squad_version(dataset, version)
    questions: dict[str, dict] = {}
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                if qa["id"] in questions:
                    raise InputError(f"question id {qa['id']!r} appears twice in the data")
                questions[qa["id"]] = qa
    if not questions:
        raise InputError("the dataset holds no questions")

    if version == "1.1":
        if no_answer_probs is not None:
            raise InputError("no-answer probabilities apply to SQuAD v2.0 data; this is v1.1")
        exact = f1 = 0.0
        for qid, qa in questions.items():
            golds = [a["text"] for a in qa.get("answers", [])]
            if not golds:
                raise InputError(f"question {qid!r} has no gold answer, which SQuAD v1.1 does not allow")
            if qid in predictions:
                exact += max(exact_match(predictions[qid], g) for g in golds)
                f1 += max(token_f1(predictions[qid], g, "1.1") for g in golds)
        total = len(questions)
        return {"exact_match": 100.0 * exact / total, "f1": 100.0 * f1 / total, "total": total,
                "unanswered": sum(q not in predictions for q in questions)}

    missing = [q for q in questions if q not in predictions]
    if missing:
        raise InputError(f"{len(missing)} of {len(questions)} questions have no prediction (first: {missing[0]!r}); "
                         "SQuAD v2.0 scoring needs one for each, \"\" meaning no answer")
    probs = no_answer_probs if no_answer_probs is not None else {q: 0.0 for q in predictions}
    if no_answer_probs is not None:
        lacking = [q for q in questions if q not in no_answer_probs]
        if lacking:
            raise InputError(f"{len(lacking)} questions have no no-answer probability (first: {lacking[0]!r})")
    has_answer = {q: bool(qa.get("answers")) for q, qa in questions.items()}
    raw_exact, raw_f1 = {}, {}
    for qid, qa in questions.items():
        golds = [a["text"] for a in qa.get("answers", []) if normalize_answer(a["text"])] or [""]
        raw_exact[qid] = max(exact_match(predictions[qid], g) for g in golds)
        raw_f1[qid] = max(token_f1(predictions[qid], g) for g in golds)
    exact, f1 = {}, {}
    for qid in questions:
        says_none = probs[qid] > threshold
        exact[qid] = float(not has_answer[qid]) if says_none else raw_exact[qid]
        f1[qid] = float(not has_answer[qid]) if says_none else raw_f1[qid]
    total = len(questions)
    result = {"exact_match": 100.0 * sum(exact.values()) / total, "f1": 100.0 * sum(f1.values()) / total,
              "total": total, "unanswered": 0}
    for name, keep in (("HasAns", True), ("NoAns", False)):
        ids = [q for q, h in has_answer.items() if h == keep]
        if ids:
            result[f"{name}_exact"] = 100.0 * sum(exact[q] for q in ids) / len(ids)
            result[f"{name}_f1"] = 100.0 * sum(f1[q] for q in ids) / len(ids)
            result[f"{name}_total"] = len(ids)
    if no_answer_probs is not None:
        result.update(best_null_threshold(predictions, no_answer_probs, has_answer, raw_exact, raw_f1))
    return result


def best_null_threshold(predictions: dict[str, str], no_answer_probs: dict[str, float], has_answer: dict[str, bool],
                        raw_exact: dict[str, float], raw_f1: dict[str, float]) -> dict[str, float]:
    """The no-answer threshold that maximises EM and F1 (as the official v2 script's find_best_thresh):
    walk the questions from the least to the most likely to have no answer, moving the cut past each."""
    out = {}
    for name, scores in (("exact", raw_exact), ("f1", raw_f1)):
        # Start from "answer nothing": full credit on NoAns questions only.
        current = best = float(sum(not h for h in has_answer.values()))
        best_threshold = 0.0
        for qid in sorted(no_answer_probs, key=no_answer_probs.get):
            if qid not in scores:
                continue
            if has_answer[qid]:
                current += scores[qid]
            elif predictions.get(qid):
                current -= 1
            if current > best:
                best, best_threshold = current, no_answer_probs[qid]
        out[f"best_{name}"] = 100.0 * best / len(scores)
        out[f"best_{name}_thresh"] = best_threshold
    return out
