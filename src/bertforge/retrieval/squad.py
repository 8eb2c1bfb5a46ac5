"""A passage-retrieval set built from SQuAD: each question retrieves the paragraph it was asked about.

SQuAD v1.1 dev has 48 Wikipedia articles, 2,067 paragraphs and 10,570 questions, each written by a
reader of one paragraph: exactly one relevant passage per question, judged by construction. The
articles are dealt into train / dev / test by a seeded shuffle, so no paragraph (and no article)
is a positive in two splits; the corpus is every paragraph, so a test question searches all 2,067,
training paragraphs included, as a BEIR set's splits share one corpus. Nothing is copied into the
repository: the folder is written from the user's own SQuAD file.

The whole file is checked before anything is written (every article, paragraph and question, with
the place of the first fault: `data[3].paragraphs[0].qas[2]`), so that the folder is one that
`read_beir` reads back; its five files are then written together (`safefiles.write_texts`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..data.io import read_text
from ..errors import InputError
from ..safefiles import check_output_file, write_texts

SPLITS = (("train", 32), ("dev", 4), ("test", 12))  # articles per split; 48 in SQuAD v1.1 dev
FILES = ("corpus.jsonl", "queries.jsonl", *(f"qrels/{name}.tsv" for name, _ in SPLITS))


def _text(value: Any, where: str, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: {what} is {'empty' if isinstance(value, str) else 'missing or not text'}")
    return value


def _list(container: Any, key: str, where: str) -> list:
    value = container.get(key) if isinstance(container, dict) else None
    if not isinstance(value, list):
        raise InputError(f"{where}: no '{key}' list")
    return value


def squad_retrieval(squad_file: str | Path, out: str | Path, seed: int = 0,
                    overwrite: bool = False) -> dict[str, dict[str, int]]:
    """Write a BEIR folder (corpus.jsonl, queries.jsonl, qrels/{train,dev,test}.tsv) to `out` from a SQuAD
    JSON file; returns each split's counts of articles, passages and queries. An `out` that holds a set is
    replaced only with `overwrite`."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: is a file; name the folder to write the set in")
    if out.is_dir():  # each file of the set, checked as any output file is (its folder, the input, --overwrite)
        for name in FILES:
            if (out / name).exists() and not overwrite:
                raise InputError(f"{out}: holds a retrieval set ({name}); pass --overwrite to replace it")
            if (out / name).parent.is_dir():
                check_output_file(out / name, "--out", True, {"SQUAD": str(squad_file)})
    try:
        document = json.loads(read_text(squad_file))
    except json.JSONDecodeError as exc:
        raise InputError(f"{squad_file}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    articles = _list(document, "data", f"{squad_file}: not a SQuAD JSON file (an object with a 'data' list); it")
    needed = sum(n for _, n in SPLITS)
    if len(articles) < needed:
        raise InputError(f"{squad_file}: {len(articles)} articles; the train/dev/test split needs {needed} "
                         "(SQuAD v1.1 dev has 48)")
    order = np.random.default_rng(seed).permutation(len(articles))
    split_of, start = {}, 0
    for name, count in SPLITS:
        for a in order[start:start + count]:
            split_of[int(a)] = name
        start += count
    for a in order[start:]:  # a larger file's remaining articles train
        split_of[int(a)] = "train"
    corpus, queries = [], []
    asked_at: dict[str, str] = {}  # question id -> where it was first seen
    qrels: dict[str, list[str]] = {name: [] for name, _ in SPLITS}
    counts = {name: {"articles": 0, "passages": 0, "queries": 0} for name, _ in SPLITS}
    for a, article in enumerate(articles):
        split = split_of[a]
        counts[split]["articles"] += 1
        for p, paragraph in enumerate(_list(article, "paragraphs", f"{squad_file}: data[{a}]")):
            where = f"{squad_file}: data[{a}].paragraphs[{p}]"
            doc = f"{a}-{p}"
            context = _text(paragraph.get("context") if isinstance(paragraph, dict) else None, where, "'context'")
            corpus.append({"_id": doc, "title": "", "text": context})
            counts[split]["passages"] += 1
            for q, qa in enumerate(_list(paragraph, "qas", where)):
                place = f"{where}.qas[{q}]"
                qid = qa.get("id") if isinstance(qa, dict) else None
                if not isinstance(qid, str) or not qid:
                    raise InputError(f"{place}: no 'id' (a string)")
                if qid in asked_at:
                    raise InputError(f"{place}: question id {qid!r} is also {asked_at[qid]}; every question needs "
                                     "its own id (a BEIR queries file holds each id once)")
                asked_at[qid] = place.split(": ", 1)[1]
                queries.append({"_id": qid, "text": _text(qa.get("question"), place, "'question'").strip()})
                qrels[split].append(f"{qid}\t{doc}\t1\n")
                counts[split]["queries"] += 1
    created = [d for d in (out, out / "qrels") if not d.exists()]
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    files = {out / "corpus.jsonl": "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in corpus),
             out / "queries.jsonl": "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in queries)}
    for name, rows in qrels.items():
        files[out / "qrels" / f"{name}.tsv"] = "query-id\tcorpus-id\tscore\n" + "".join(rows)
    try:
        write_texts(files)
    except BaseException:
        for folder in reversed(created):  # a refused write leaves no empty folder it made
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise
    return counts
