"""`bertforge score`: score prediction files users already have, with the official metrics."""

from __future__ import annotations

import json
from pathlib import Path

from .data.classification import LABEL_COLUMNS
from .data.io import csv_rows, read_text
from .data.ner import read_conll, read_sentences, to_iob2
from .data.qa import check_squad
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
    check_squad(data, data_file)
    predictions = _json(Path(predictions_file))
    if not isinstance(predictions, dict) or not all(isinstance(v, str) for v in predictions.values()):
        raise InputError(f"{predictions_file}: expected a JSON object of question id -> answer text")
    na_probs = _json(Path(na_probs_file)) if na_probs_file else None
    if na_probs is not None and (not isinstance(na_probs, dict)
                                 or not all(isinstance(v, (int, float)) for v in na_probs.values())):
        raise InputError(f"{na_probs_file}: expected a JSON object of question id -> no-answer probability")
    try:
        return squad_metrics(data["data"], predictions, na_probs, threshold, version=data.get("version"))
    except InputError as exc:
        raise InputError(f"{data_file}: {exc}") from None


def _predicted_tags(path: Path, gold: list) -> list[list[str]]:
    """Tags per sentence from JSON lines with a "tags" list (what `bertforge evaluate ner --predictions`
    writes), each aligned with the gold sentence of the same index."""
    rows = []
    for number, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            tags = json.loads(line)["tags"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise InputError(f"{path}:{number}: expected a JSON object with a 'tags' list") from None
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise InputError(f"{path}:{number}: 'tags' must be a list of strings")
        if len(rows) < len(gold) and len(tags) != len(gold[len(rows)].tokens):
            raise InputError(f"{path}:{number}: {len(tags)} tags, but sentence {len(rows) + 1} of the gold file "
                             f"has {len(gold[len(rows)].tokens)} tokens")
        rows.append(tags)
    return rows


def score_ner(gold_file: str | Path, pred_file: str | Path) -> dict:
    """Gold sentences (CoNLL, or JSONL with tokens and tags) and predictions (a CoNLL file with the same
    tokens, or JSON lines of {"tags": [...]}) -> entity P/R/F1."""
    gold = read_sentences(gold_file)
    pred_path = Path(pred_file)
    if read_text(pred_path).lstrip().startswith("{"):
        pred_tags = _predicted_tags(pred_path, gold)
    else:
        pred = read_conll(pred_file)
        if len(pred) == len(gold):
            for g, p in zip(gold, pred):
                if g.tokens != p.tokens:
                    raise InputError(f"{pred_file}:{p.line}: tokens differ from {gold_file}:{g.line}")
        pred_tags = [p.tags for p in pred]
    if len(gold) != len(pred_tags):
        raise InputError(f"{pred_file}: {len(pred_tags)} sentences, but {gold_file} has {len(gold)}")
    return entity_metrics([s.tags for s in gold], [to_iob2(t) for t in pred_tags])


def _labels(path: Path) -> list[str]:
    """The labels of a file, one per example, in any of the forms bertforge and GLUE write them:

    - JSON lines with a "label" field (what `bertforge evaluate --predictions` and `predict classify` write);
    - a TSV or CSV with a header that names a label column (a GLUE dev file);
    - one bare label per line.
    Anything else is refused: guessing a column could score the wrong one without a word.
    """
    lines = [(n, line) for n, line in enumerate(read_text(path).splitlines(), 1) if line.strip()]
    if not lines:
        raise InputError(f"{path}: no labels")
    if lines[0][1].lstrip().startswith("{"):
        labels = []
        for number, line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            label = record.get("label") if isinstance(record, dict) else None
            if isinstance(label, bool) or not isinstance(label, (str, int)):
                raise InputError(f"{path}:{number}: expected an object with a string or integer 'label'")
            labels.append(str(label))
        return labels
    if path.suffix == ".csv":
        lines = [(n, row) for n, row in csv_rows(path, read_text(path)) if any(c.strip() for c in row)]
        rows = [row for _, row in lines]
    elif "\t" in lines[0][1]:
        rows = [line.split("\t") for _, line in lines]
    else:
        return [line.strip() for _, line in lines]
    header = [h.strip() for h in rows[0]]
    column = next((header.index(c) for c in LABEL_COLUMNS if c in header), None)
    if column is None:
        raise InputError(f"{path}: cannot tell which column holds the label (header: {', '.join(header)}); "
                         f"give a file with a '{LABEL_COLUMNS[0]}' column, JSON lines, or one label per line")
    for (number, _), row in zip(lines[1:], rows[1:]):
        if len(row) != len(header):
            raise InputError(f"{path}:{number}: {len(row)} fields where the header has {len(header)}")
    return [row[column].strip() for row in rows[1:]]


def score_classification(gold_file: str | Path, pred_file: str | Path) -> dict:
    """Two files of labels (JSON lines, a TSV/CSV with a label column, or one per line) -> accuracy, F1s, MCC."""
    gold, pred = _labels(Path(gold_file)), _labels(Path(pred_file))
    if len(gold) != len(pred):
        raise InputError(f"{pred_file}: {len(pred)} labels, but {gold_file} has {len(gold)}")
    if not set(gold) & set(pred):
        raise InputError(f"{pred_file}: none of its labels ({', '.join(sorted(set(pred))[:5])}) occurs in "
                         f"{gold_file} ({', '.join(sorted(set(gold))[:5])}); are they named differently?")
    return classification_metrics(gold, pred)
