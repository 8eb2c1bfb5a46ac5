"""Training data for embedders, read by column shape as sentence-transformers reads a dataset.

A file's text columns are, in order, the anchor (the query), the positive, then any negatives:
two columns are pairs, three are triplets, more are n-tuples. A column named `label` or `score`
holds numbers instead: with two texts, the pair's score (text1, text2, score); with negatives, a
teacher's margins for distillation (one per negative, positive minus negative) or its scores (the
positive's, then each negative's). The formats:

- JSONL: one object per line, every line with the first line's keys, in any order.
- TSV (tab-separated, no quoting) and CSV: a header row naming the columns.
- A BEIR folder (`corpus.jsonl`, `queries.jsonl`, `qrels/<split>.tsv`): one (query, passage) pair per
  relevant judgement.
- `hf:NAME[:CONFIG]:SPLIT`: a Hugging Face dataset, its columns in their order.

Every refusal names the file and line (or column): one text column, an empty text, a score that is
not a number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError
from .io import csv_rows, jsonl_records, read_text

SCORE_COLUMNS = ("label", "score")


@dataclass
class TupleData:
    """Rows of texts (anchor, positive, negatives...) and, for scored pairs, one score per row."""

    columns: list[str]  # the text columns' names, in order
    rows: list[tuple[str, ...]]
    scores: list[float] | list[float | list[float]] | None  # per row: a pair's score, or a tuple's teacher margins
    lines: list[int]  # each row's line in its file (1-based; the judgement's line for a BEIR folder)
    source: str

    @property
    def shape(self) -> str:
        name = {2: "pairs", 3: "triplets"}.get(len(self.columns), f"{len(self.columns)}-tuples")
        return f"scored {name}" if self.scores is not None else name


def read_tuples(path: str, split: str = "train") -> TupleData:
    """The rows of a JSONL / TSV / CSV file, a BEIR folder (its `split` judgements) or an `hf:` dataset."""
    if path.startswith("hf:"):
        return _from_records(_hf_records(path), path)
    p = Path(path)
    if p.is_dir():
        return _from_beir(p, split)
    if not p.is_file():
        raise InputError(f"{path}: no such file or folder")
    text = read_text(p)
    if p.suffix in (".jsonl", ".json"):
        records = list(jsonl_records(path, enumerate(text.splitlines(), 1), None))
        return _from_records(records, path)
    rows = csv_rows(path, text) if p.suffix == ".csv" else [(n, line.split("\t"))
                                                            for n, line in enumerate(text.splitlines(), 1)]
    numbered = [(n, r) for n, r in rows if r and any(c.strip() for c in r)]
    if len(numbered) < 2:
        raise InputError(f"{path}: no rows after the header")
    header = [h.strip() for h in numbered[0][1]]
    records = []
    for number, row in numbered[1:]:
        if len(row) != len(header):
            raise InputError(f"{path}:{number}: {len(row)} fields where the header has {len(header)}")
        records.append((number, dict(zip(header, row))))
    return _from_records(records, path)


def _from_records(records: list[tuple[int, dict]], source: str) -> TupleData:
    if not records:
        raise InputError(f"{source}: no rows")
    keys = list(records[0][1])
    score_keys = [k for k in keys if k in SCORE_COLUMNS]
    texts = [k for k in keys if k not in SCORE_COLUMNS]
    if len(score_keys) > 1:
        raise InputError(f"{source}: both 'label' and 'score' columns; keep the one that holds the score")
    if len(texts) < 2:
        raise InputError(f"{source}: {len(texts)} text column{'' if len(texts) == 1 else 's'} ({', '.join(texts) or 'none'}); "
                         "training needs (anchor, positive[, negatives...]) or (text1, text2, score)")
    rows, scores, lines = [], [] if score_keys else None, []
    for number, record in records:
        if set(record) != set(keys):
            raise InputError(f"{source}:{number}: columns {', '.join(record)} differ from the first row's "
                             f"({', '.join(keys)})")
        row = []
        for key in texts:
            value = record[key]
            if not isinstance(value, str):
                raise InputError(f"{source}:{number}: column '{key}' is {type(value).__name__}, not text")
            if not value.strip():
                raise InputError(f"{source}:{number}: column '{key}' is empty")
            row.append(value)
        if scores is not None:
            scores.append(_score(record[score_keys[0]], len(texts), f"{source}:{number}: column '{score_keys[0]}'"))
        rows.append(tuple(row))
        lines.append(number)
        if scores and np.shape(scores[-1]) != np.shape(scores[0]):
            raise InputError(f"{source}:{number}: column '{score_keys[0]}' holds {scores[-1]!r}, unlike the first "
                             f"row's {scores[0]!r}; give every row the same kind of score")
    return TupleData(texts, rows, scores, lines, source)


def _number(value, where: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number):
        raise InputError(f"{where} is {value!r}, not a number")
    return number


def _score(value, texts: int, where: str) -> float | list[float]:
    """A row's score: one number for a pair (its similarity) or a triplet (the teacher's margin); for n-tuples a
    list of the teacher's margins (one per negative) or of its scores (the positive's, then each negative's)."""
    if texts == 2 or not isinstance(value, list):
        if texts > 3:
            raise InputError(f"{where} is {value!r}; with {texts - 2} negatives give a list of {texts - 2} margins or "
                             f"{texts - 1} scores")
        return _number(value, where)
    if len(value) not in (texts - 2, texts - 1):
        raise InputError(f"{where} holds {len(value)} numbers; with {texts - 2} negatives give {texts - 2} margins "
                         f"(positive minus each negative) or {texts - 1} scores (the positive's, then the negatives')")
    return [_number(v, where) for v in value]


def _from_beir(folder: Path, split: str) -> TupleData:
    from ..retrieval.beir import positives, read_beir

    data = read_beir(folder, split)
    where = str(folder / "qrels" / f"{split}.tsv")
    rows, lines = [], []
    for number, (qid, docs) in enumerate(positives(data, where).items(), 1):
        for did in docs:
            rows.append((data.queries[qid], data.corpus[did]))
            lines.append(number)
    return TupleData(["query", "passage"], rows, None, lines, where)


def _hf_records(spec: str) -> list[tuple[int, dict]]:
    from ..errors import require

    parts = spec[3:].split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise InputError(f"{spec}: expected hf:NAME:SPLIT or hf:NAME:CONFIG:SPLIT")
    require("datasets", "datasets", what="reading a Hugging Face dataset")
    import datasets

    name, config, split = (parts[0], None, parts[1]) if len(parts) == 2 else parts
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as exc:  # the library's errors for a missing dataset, config or split vary by version
        raise InputError(f"{spec}: cannot load ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") \
            from None
    return [(i + 1, dict(row)) for i, row in enumerate(ds)]
