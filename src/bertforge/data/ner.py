"""Token classification data: CoNLL column files and JSONL, tag schemes, and sub-token label alignment.

CoNLL: one token per line (`token ... tag`, the tag in the last column), blank lines end
sentences, `-DOCSTART-` lines are skipped. JSONL: `{"tokens": [...], "tags": [...]}`.
IOB1 (I- may start an entity), IOB2 (B- starts every entity) and BIOES are all read and
converted to IOB2, the scheme the model is trained on and seqeval scores.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from .io import read_text


@dataclass
class Sentence:
    tokens: list[str]
    tags: list[str]
    line: int  # where it starts in its file, for messages


def read_conll(path: str | Path) -> list[Sentence]:
    """Sentences of a CoNLL column file; every token line must have the same number of columns (>= 2)."""
    path = Path(path)
    sentences: list[Sentence] = []
    tokens: list[str] = []
    tags: list[str] = []
    columns = None
    start = 1
    for number, line in enumerate(read_text(path).splitlines(), 1):
        parts = line.split()
        if not parts or parts[0] == "-DOCSTART-":
            if tokens:
                sentences.append(Sentence(tokens, tags, start))
            tokens, tags = [], []
            continue
        if columns is None:
            columns = len(parts)
            if columns < 2:
                raise InputError(f"{path}:{number}: expected 'token ... tag' columns, got one column")
        if len(parts) != columns:
            raise InputError(f"{path}:{number}: {len(parts)} columns where the file has {columns}")
        if not tokens:
            start = number
        tokens.append(parts[0])
        tags.append(parts[-1])
    if tokens:
        sentences.append(Sentence(tokens, tags, start))
    if not sentences:
        raise InputError(f"{path}: no sentences")
    return sentences


def read_jsonl(path: str | Path) -> list[Sentence]:
    path = Path(path)
    sentences = []
    for number, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            tokens, tags = record["tokens"], record["tags"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise InputError(f"{path}:{number}: expected a JSON object with 'tokens' and 'tags'") from None
        if len(tokens) != len(tags):
            raise InputError(f"{path}:{number}: {len(tokens)} tokens but {len(tags)} tags")
        sentences.append(Sentence([str(t) for t in tokens], [str(t) for t in tags], number))
    if not sentences:
        raise InputError(f"{path}: no sentences")
    return sentences


def read_sentences(path: str | Path) -> list[Sentence]:
    """CoNLL or JSONL, by extension; tags converted to IOB2."""
    path = Path(path)
    sentences = read_jsonl(path) if path.suffix in (".jsonl", ".json") else read_conll(path)
    for s in sentences:
        s.tags = to_iob2(s.tags)
    return sentences


def to_iob2(tags: list[str]) -> list[str]:
    """IOB1, IOB2 or BIOES tags of one sentence -> IOB2 (B- opens every entity)."""
    out = []
    previous = "O"
    for tag in tags:
        if tag == "O":
            out.append("O")
            previous = tag
            continue
        prefix, _, kind = tag.partition("-")
        if not kind:
            raise InputError(f"tag {tag!r} is not O or PREFIX-TYPE")
        if prefix in ("B", "S"):
            new = f"B-{kind}"
        elif prefix in ("I", "E"):
            prev_kind = previous.partition("-")[2]
            continuing = previous != "O" and prev_kind == kind and previous.partition("-")[0] in ("B", "I")
            new = f"I-{kind}" if continuing else f"B-{kind}"
        else:
            raise InputError(f"tag {tag!r} has unknown prefix {prefix!r} (expected B, I, E or S)")
        out.append(new)
        # After an E- or S- tag the entity is closed, so a following I- starts a new one.
        previous = "O" if prefix in ("E", "S") else new
    return out


def align_labels(word_ids: list[int | None], word_labels: list[int], ignore: int = -100) -> list[int]:
    """Per-token labels: a word's label on its first sub-token, `ignore` on the rest and on special tokens."""
    out, previous = [], None
    for w in word_ids:
        out.append(ignore if w is None or w == previous else word_labels[w])
        previous = w
    return out
