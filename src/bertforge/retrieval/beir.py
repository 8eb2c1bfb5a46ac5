"""Retrieval data on disk: the BEIR layout, plain query/passage pair files, and TREC run files.

The BEIR layout (what BEIR, MTEB and sentence-transformers' evaluators read) is a folder with
`corpus.jsonl` ({"_id", "title", "text"} per line), `queries.jsonl` ({"_id", "text"}) and
`qrels/<split>.tsv` (a `query-id corpus-id score` header, then one judgement per line). Every
problem is refused by file:line: a duplicate id, a judgement naming a query or document the files
lack, a score that is not an integer.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..data.io import jsonl_records, read_text
from ..errors import InputError
from ..safefiles import write_text
from .metrics import Run, ranked


@dataclass
class RetrievalSet:
    """A corpus, its queries and their judgements (`qrels`: query id -> {document id: relevance})."""

    corpus: dict[str, str]  # document id -> the text that is embedded (title and text, as BEIR joins them)
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]] = field(default_factory=dict)
    source: str = ""

    def judged_queries(self) -> dict[str, str]:
        """The queries that have judgements, in the queries file's order: the ones evaluated."""
        return {q: text for q, text in self.queries.items() if q in self.qrels}


def document_text(record: dict) -> str:
    """BEIR's document text: the title, a space and the text, stripped (the text alone without a title)."""
    title = record.get("title")
    return (f"{title} {record['text']}" if isinstance(title, str) else record["text"]).strip()


def _texts(path: Path, text_of, key: str = "_id") -> dict[str, str]:
    """id -> text (`text_of(record)`) of a BEIR JSONL file; a missing, empty or duplicate id, and a text that is
    empty or only whitespace, are refused by line: the rule `data.retrieval` applies to every training row, so a
    text that could teach or retrieve nothing is refused the same way whichever file it comes from."""
    out: dict[str, str] = {}
    for number, record in jsonl_records(path, enumerate(read_text(path).splitlines(), 1), "text"):
        rid = record.get(key)
        if isinstance(rid, bool) or not isinstance(rid, (str, int)) or str(rid) == "":
            raise InputError(f"{path}:{number}: no '{key}' (a string or integer id)")
        if str(rid) in out:
            raise InputError(f"{path}:{number}: duplicate {key} {rid!r}")
        text = text_of(record)
        if not text.strip():
            raise InputError(f"{path}:{number}: {key} {rid!r} has an empty text")
        out[str(rid)] = text
    if not out:
        raise InputError(f"{path}: no records")
    return out


def read_qrels(path: Path, queries: dict | None = None, corpus: dict | None = None) -> dict[str, dict[str, int]]:
    """query id -> {document id: relevance} from a BEIR qrels TSV (header `query-id corpus-id score`) or a
    TREC qrels file (`query-id 0 corpus-id score`, whitespace-separated, no header)."""
    text = read_text(path)
    lines = text.splitlines()
    trec = bool(lines) and len(lines[0].split()) == 4 and not lines[0].lower().startswith("query")
    rows = ((n, line.split()) for n, line in enumerate(lines, 1)) if trec \
        else enumerate(csv.reader(io.StringIO(text), delimiter="\t"), 1)
    qrels: dict[str, dict[str, int]] = {}
    for number, row in rows:
        if not row or (number == 1 and not trec):
            if number == 1 and not trec and [c.strip().lower() for c in row][:2] != ["query-id", "corpus-id"]:
                raise InputError(f"{path}:1: expected the header 'query-id<TAB>corpus-id<TAB>score'")
            continue
        if trec:
            row = [row[0], row[2], row[3]] if len(row) == 4 else row
        if len(row) != 3:
            raise InputError(f"{path}:{number}: expected 3 columns (query-id, corpus-id, score), found {len(row)}")
        qid, did, score = (c.strip() for c in row)
        try:
            rel = int(score)
        except ValueError:
            raise InputError(f"{path}:{number}: score {score!r} is not an integer") from None
        if queries is not None and qid not in queries:
            raise InputError(f"{path}:{number}: query-id {qid!r} is not in the queries file")
        if corpus is not None and did not in corpus:
            raise InputError(f"{path}:{number}: corpus-id {did!r} is not in the corpus")
        if did in qrels.setdefault(qid, {}):
            raise InputError(f"{path}:{number}: query {qid!r} judges {did!r} twice")
        qrels[qid][did] = rel
    if not qrels:
        raise InputError(f"{path}: no judgements")
    return qrels


def read_beir(folder: str | Path, split: str = "test") -> RetrievalSet:
    """A BEIR folder's corpus, queries and `qrels/<split>.tsv`."""
    folder = Path(folder)
    for name in ("corpus.jsonl", "queries.jsonl"):
        if not (folder / name).is_file():
            raise InputError(f"{folder}: no {name}; a BEIR folder holds corpus.jsonl, queries.jsonl and qrels/")
    qrels_file = folder / "qrels" / f"{split}.tsv"
    if not qrels_file.is_file():
        have = sorted(p.stem for p in (folder / "qrels").glob("*.tsv")) if (folder / "qrels").is_dir() else []
        raise InputError(f"{qrels_file}: missing (splits here: {', '.join(have) or 'none'}); choose one with --split")
    corpus = _texts(folder / "corpus.jsonl", document_text)
    queries = _texts(folder / "queries.jsonl", lambda r: r["text"])
    return RetrievalSet(corpus, queries, read_qrels(qrels_file, queries, corpus), str(folder))


def positives(data: RetrievalSet, where: str) -> dict[str, list[str]]:
    """Each judged query's relevant documents, for training and mining: a query with none is refused
    (it can teach nothing, and a miner cannot tell its negatives from its positives)."""
    out = {}
    for qid, judged in data.qrels.items():
        good = [d for d, rel in judged.items() if rel >= 1]
        if not good:
            raise InputError(f"{where}: query {qid!r} has no relevant document (no score of 1 or more)")
        out[qid] = good
    return out


def from_pairs(pairs: list[tuple[str, str]], source: str) -> RetrievalSet:
    """A retrieval set from (query, passage) pairs: the corpus is the distinct passages, and each distinct query's
    relevant documents are the passages it was paired with."""
    corpus: dict[str, str] = {}
    queries: dict[str, str] = {}
    doc_ids: dict[str, str] = {}
    query_ids: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    for query, passage in pairs:
        did = doc_ids.setdefault(passage, f"d{len(doc_ids)}")
        corpus[did] = passage
        qid = query_ids.setdefault(query, f"q{len(query_ids)}")
        queries[qid] = query
        qrels.setdefault(qid, {})[did] = 1
    return RetrievalSet(corpus, queries, qrels, source)


def write_run(run: Run, path: str | Path, name: str = "bertforge") -> None:
    """A TREC run file: `query-id Q0 doc-id rank score name`, each query's documents in trec_eval's order."""
    lines = []
    for qid, scores in run.items():
        for rank, did in enumerate(ranked(scores), 1):
            score = float(scores[did])
            if not math.isfinite(score):
                raise ValueError(f"query {qid!r}: document {did!r} has score {score}")
            lines.append(f"{qid} Q0 {did} {rank} {score!r} {name}\n")
    write_text(path, "".join(lines))


def read_run(path: str | Path) -> dict[str, dict[str, float]]:
    """A TREC run file (`query-id Q0 doc-id rank score name`) as query id -> {document id: score}."""
    run: dict[str, dict[str, float]] = {}
    for number, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        cols = line.split()
        if len(cols) != 6:
            raise InputError(f"{path}:{number}: expected 6 columns (query-id Q0 doc-id rank score name), found "
                             f"{len(cols)}")
        try:
            score = float(cols[4])
        except ValueError:
            score = math.nan
        if not math.isfinite(score):  # a NaN would rank by NaN comparisons, which order nothing
            raise InputError(f"{path}:{number}: score {cols[4]!r} is not a finite number")
        if cols[2] in run.setdefault(cols[0], {}):
            raise InputError(f"{path}:{number}: query {cols[0]!r} retrieves {cols[2]!r} twice")
        run[cols[0]][cols[2]] = score
    return run


def candidates_for(data: RetrievalSet, path: str | Path) -> dict[str, dict[str, float]]:
    """A first stage's run file (`read_run`) for reranking `data`'s judged queries: a run that ranks none of them
    (another split's or set's, or an empty file) is refused, since every measure would be 0 for no reason the
    figures show; one that misses some is said in a warning, as those queries score 0."""
    run = read_run(path)
    judged = data.judged_queries()
    covered = [q for q in judged if run.get(q)]
    if not covered:
        named = ", ".join(repr(q) for q in list(run)[:3]) or "none"
        raise InputError(f"{path}: ranks none of the {len(judged):,} judged queries of {data.source} (it ranks "
                         f"{len(run):,} queries: {named}{', ...' if len(run) > 3 else ''}); give the run of these "
                         "queries, e.g. from bertforge evaluate retrieval --run on the same set and split")
    if len(covered) < len(judged):
        import logging

        missing = next(q for q in judged if not run.get(q))
        logging.getLogger("bertforge").warning(
            "%s ranks %d of the %d judged queries (not %r, ...): the others have no candidates and score 0",
            path, len(covered), len(judged), missing)
    return run

