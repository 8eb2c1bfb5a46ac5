"""Sequence classification / regression data: GLUE TSV, CSV and JSONL readers, labels, truncation.

TSV files are split on tabs with no quote handling, as GLUE's own readers do (its texts
contain unbalanced quotes). Columns are found by name (common GLUE headers are recognised)
or chosen by name or 0-based index. Every row must have the header's number of fields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from .io import csv_rows, jsonl_records, read_text

TEXT_COLUMNS = ("sentence", "sentence1", "#1 String", "question1", "question", "text", "premise")
PAIR_COLUMNS = ("sentence2", "#2 String", "question2", "text_pair", "hypothesis")
LABEL_COLUMNS = ("label", "Quality", "score", "gold_label")


@dataclass
class Example:
    text: str
    pair: str | None
    label: str | float | None
    line: int


@dataclass
class Columns:
    """Which columns hold the text, the optional pair and the label: names or 0-based indices."""

    text: str | None = None
    pair: str | None = None
    label: str | None = None


def _pick(header: list[str], wanted: str | None, defaults: tuple[str, ...], what: str, path: Path,
          required: bool) -> int | None:
    if wanted is not None:
        if wanted.isdigit() and int(wanted) < len(header):
            return int(wanted)
        if wanted in header:
            return header.index(wanted)
        raise InputError(f"{path}: no {what} column '{wanted}' (columns: {', '.join(header)})")
    for name in defaults:
        if name in header:
            return header.index(name)
    if required:
        raise InputError(f"{path}: cannot find the {what} column (columns: {', '.join(header)}); "
                         f"name it with --{what}-column")
    return None


def read_examples(path: str | Path, columns: Columns | None = None, labelled: bool = True) -> list[Example]:
    """Examples of a .tsv, .csv or .jsonl file (by extension)."""
    path = Path(path)
    columns = columns or Columns()
    if path.suffix in (".jsonl", ".json"):
        examples = _read_jsonl(path, columns, labelled)
    else:
        text = read_text(path)
        if path.suffix == ".csv":
            numbered = [(n, r if r else [""]) for n, r in csv_rows(path, text)]
        else:
            numbered = list(enumerate((line.split("\t") for line in text.split("\n")), 1))
            if numbered and numbered[-1][1] == [""]:
                numbered.pop()
        rows = [r for _, r in numbered]
        if len(rows) < 2:
            raise InputError(f"{path}: empty (no rows after the header)")
        header = [h.strip() for h in rows[0]]
        t = _pick(header, columns.text, TEXT_COLUMNS, "text", path, True)
        p = _pick(header, columns.pair, PAIR_COLUMNS, "pair", path, False)
        y = _pick(header, columns.label, LABEL_COLUMNS, "label", path, labelled)
        examples = []
        for number, row in numbered[1:]:
            if row == [""]:
                continue
            if len(row) != len(header):
                raise InputError(f"{path}:{number}: {len(row)} fields where the header has {len(header)}")
            if labelled and y is not None and not row[y].strip():
                raise InputError(f"{path}:{number}: the label field '{header[y]}' is empty; give every row a label "
                                 "(or remove the row)")
            examples.append(Example(row[t], row[p] if p is not None else None,
                                    row[y].strip() if y is not None else None, number))
    if not examples:
        raise InputError(f"{path}: no examples")
    return examples


def _read_jsonl(path: Path, columns: Columns, labelled: bool) -> list[Example]:
    text_key, pair_key, label_key = columns.text or "text", columns.pair or "text_pair", columns.label or "label"
    examples = []
    for number, record in jsonl_records(path, enumerate(read_text(path).splitlines(), 1), text_key):
        if labelled and label_key not in record:
            raise InputError(f"{path}:{number}: no field '{label_key}'")
        label = record.get(label_key)
        if labelled and (label is None or (isinstance(label, str) and not label.strip())):
            raise InputError(f"{path}:{number}: the label field '{label_key}' is {'null' if label is None else 'empty'}; "
                             "give every record a label (or remove the record)")
        examples.append(Example(record[text_key], record.get(pair_key),
                                None if label is None else (label if isinstance(label, float) else str(label)), number))
    return examples


def label_set(examples: list[Example]) -> list[str]:
    """Sorted labels: numerically when they all look like integers, else as strings."""
    labels = {str(e.label) for e in examples}
    if all(label.lstrip("-").isdigit() for label in labels):
        return sorted(labels, key=int)
    return sorted(labels)


def check_labels(examples: list[Example], label2id: dict[str, int], path: str | Path) -> None:
    for e in examples:
        if str(e.label) not in label2id:
            raise InputError(f"{path}:{e.line}: label '{e.label}' is not among the training labels "
                             f"({', '.join(label2id)})")


def regression_targets(examples: list[Example], path: str | Path) -> list[float]:
    out = []
    for e in examples:
        try:
            value = float(e.label)
        except (TypeError, ValueError):
            raise InputError(f"{path}:{e.line}: regression label '{e.label}' is not a number") from None
        if not math.isfinite(value):  # float() reads 'nan' and 'inf', which no loss or correlation can use
            raise InputError(f"{path}:{e.line}: regression label '{e.label}' is not a finite number")
        out.append(value)
    return out


def truncate_ids(ids: list[int], budget: int, strategy: str) -> list[int]:
    """Keep `budget` WordPieces of a long text: its head, its tail, or head+tail (a quarter head,
    three quarters tail, after Sun et al. 2019, who found head+tail best on IMDb)."""
    if len(ids) <= budget:
        return ids
    if strategy == "head":
        return ids[:budget]
    if strategy == "tail":
        return ids[-budget:]
    if strategy == "head+tail":
        head = budget // 4
        return ids[:head] + ids[len(ids) - (budget - head):]
    raise InputError(f"unknown truncation {strategy!r} (head, tail or head+tail)")
