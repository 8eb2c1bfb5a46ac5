"""`bertforge score`: score prediction files users already have, with the official metrics."""

from __future__ import annotations

import json
from pathlib import Path

from .data.io import read_text
from .data.ner import read_conll, to_iob2
from .errors import InputError
from .metrics import classification_metrics, entity_metrics, squad_metrics


def _json(path: Path):
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None


def score_squad(data_file: str | Path, predictions_file: str | Path, na_probs_file: str | Path | None = None,
                threshold: float = 1.0) -> dict:
    """SQuAD v1.1 / v2.0 data JSON + {question id: answer} JSON -> EM and F1 (percent)."""
    data = _json(Path(data_file))
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise InputError(f"{data_file}: not a SQuAD file (no 'data' list)")
    predictions = _json(Path(predictions_file))
    if not isinstance(predictions, dict) or not all(isinstance(v, str) for v in predictions.values()):
        raise InputError(f"{predictions_file}: expected a JSON object of question id -> answer text")
    na_probs = _json(Path(na_probs_file)) if na_probs_file else None
    return squad_metrics(data["data"], predictions, na_probs, threshold)


def score_ner(gold_file: str | Path, pred_file: str | Path) -> dict:
    """Two CoNLL files with aligned tokens (tag in the last column) -> entity P/R/F1."""
    gold, pred = read_conll(gold_file), read_conll(pred_file)
    if len(gold) != len(pred):
        raise InputError(f"{pred_file}: {len(pred)} sentences, but {gold_file} has {len(gold)}")
    for g, p in zip(gold, pred):
        if g.tokens != p.tokens:
            raise InputError(f"{pred_file}:{p.line}: tokens differ from {gold_file}:{g.line}")
    return entity_metrics([to_iob2(s.tags) for s in gold], [to_iob2(s.tags) for s in pred])


def _labels(path: Path) -> list[str]:
    lines = read_text(path).splitlines()
    labels = [line.split("\t")[-1].strip() for line in lines if line.strip()]
    if labels and labels[0] == "label":  # a header
        labels = labels[1:]
    if not labels:
        raise InputError(f"{path}: no labels")
    return labels


def score_classification(gold_file: str | Path, pred_file: str | Path) -> dict:
    """Two files of labels (one per line, or the last tab-separated column) -> accuracy, F1s, MCC."""
    gold, pred = _labels(Path(gold_file)), _labels(Path(pred_file))
    if len(gold) != len(pred):
        raise InputError(f"{pred_file}: {len(pred)} labels, but {gold_file} has {len(gold)}")
    return classification_metrics(gold, pred)
