"""Corpus input: raw text in, a stream of documents out, then documents into sentences.

Accepted sources (any mix, in the order given):
- plain text: a document per blank-line-separated block, or a document per file;
- JSONL with a `text` field (or another field);
- gzip'd versions of both (`.gz`);
- directories (read recursively, sorted) and glob patterns;
- Hugging Face `datasets`: a directory written by `save_to_disk`, or `hf:NAME[:CONFIG]`
  for a hub dataset, streamed with a shuffle buffer (needs network and the optional extra).

Everything is read as a stream, so memory does not grow with corpus size. Sentence
splitting uses `blingfire` (a maintained, offline, compiled splitter).
"""

from __future__ import annotations

import glob
import gzip
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, require
from .io import corrupt, jsonl_records

_BINARY_SNIFF = 8192


@dataclass
class CorpusOptions:
    """How to read a corpus."""

    doc_per_file: bool = False  # a whole file is one document (else blank lines separate documents)
    text_field: str = "text"  # the JSONL / datasets field holding the text
    encoding_errors: str = "strict"  # "strict": stop at invalid UTF-8; "replace": use U+FFFD and go on
    hf_split: str = "train"
    shuffle_buffer: int = 10_000  # for streamed hub datasets
    seed: int = 0


def expand_sources(sources: list[str]) -> list[str]:
    """Files from paths, directories and globs, in a stable order. `hf:` names and dataset dirs pass through."""
    out: list[str] = []
    for source in sources:
        if source.startswith("hf:"):
            out.append(source)
            continue
        path = Path(source)
        if path.is_dir():
            if (path / "dataset_info.json").is_file() or (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
                out.append(source)  # a datasets directory written by save_to_disk
                continue
            files = sorted(p for p in path.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.parts))
            if not files:
                raise InputError(f"{source}: directory holds no files")
            out.extend(map(str, files))
        elif path.is_file():
            out.append(source)
        else:
            matches = sorted(glob.glob(source, recursive=True))
            if not matches:
                raise InputError(f"{source}: no such file, directory or matching glob")
            out.extend(m for m in matches if Path(m).is_file())
    return out


def _open_binary(path: Path):
    raw = open(path, "rb")
    if path.suffix == ".gz":
        return gzip.GzipFile(fileobj=raw)
    return raw


def _check_not_binary(path: Path) -> None:
    with _open_binary(path) as handle:
        try:
            head = handle.read(_BINARY_SNIFF)
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(corrupt(path, 0, exc)) from None
    if b"\x00" in head:
        raise InputError(f"{path}: looks like a binary file (NUL bytes), not text; remove it from the corpus")


def _lines(path: Path, errors: str) -> Iterator[tuple[int, str]]:
    """(line number, decoded line) pairs; invalid UTF-8 is reported by file and byte offset."""
    _check_not_binary(path)
    offset = number = 0
    with _open_binary(path) as handle:
        try:
            for number, raw in enumerate(handle, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    if errors != "replace":
                        raise InputError(f"{path}: invalid UTF-8 at byte {offset + exc.start} (line {number}); "
                                         "fix the file or pass --encoding-errors replace") from None
                    line = raw.decode("utf-8", errors="replace")
                offset += len(raw)
                yield number, line
        except (EOFError, OSError, zlib.error) as exc:  # a truncated .gz ends in EOFError, a damaged one in zlib's
            raise InputError(corrupt(path, number, exc)) from None


def _is_jsonl(path: Path) -> bool:
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    return name.endswith(".jsonl") or name.endswith(".json")


def _text_documents(path: Path, options: CorpusOptions) -> Iterator[str]:
    block: list[str] = []
    for _, line in _lines(path, options.encoding_errors):
        if options.doc_per_file or line.strip():
            block.append(line.rstrip("\r\n"))
        elif block:
            yield "\n".join(block)
            block = []
    if block:
        yield "\n".join(block)


def _jsonl_documents(path: Path, options: CorpusOptions) -> Iterator[str]:
    for _, record in jsonl_records(path, _lines(path, options.encoding_errors), options.text_field):
        yield record[options.text_field]


def _hf_documents(source: str, options: CorpusOptions) -> Iterator[str]:
    require("datasets", "datasets", what=f"{source}: reading a Hugging Face dataset")
    import datasets
    if source.startswith("hf:"):
        name, _, config = source[3:].partition(":")
        try:
            stream = datasets.load_dataset(name, config or None, split=options.hf_split, streaming=True)
            stream = stream.shuffle(seed=options.seed, buffer_size=options.shuffle_buffer)
            iterator = iter(stream)
            first = next(iterator, None)
        except Exception as exc:  # datasets raises many types for "offline" and "not found"
            raise InputError(f"{source}: cannot stream the hub dataset '{name}' ({type(exc).__name__}); "
                             "this needs network access to the Hugging Face hub; use a local file or a "
                             "save_to_disk directory instead") from None
        rows = _chain(first, iterator) if first is not None else iter(())
    else:
        loaded = datasets.load_from_disk(source)
        if isinstance(loaded, datasets.DatasetDict):
            if options.hf_split not in loaded:
                raise InputError(f"{source}: no split '{options.hf_split}' (has {', '.join(loaded)})")
            loaded = loaded[options.hf_split]
        rows = iter(loaded)
    for i, row in enumerate(rows):
        text = row.get(options.text_field)
        if not isinstance(text, str):
            raise InputError(f"{source}: row {i} has no string field '{options.text_field}'")
        yield text


def _chain(first, rest):
    yield first
    yield from rest


def iter_documents(sources: list[str], options: CorpusOptions | None = None) -> Iterator[str]:
    """Every non-empty document of every source, streamed."""
    options = options or CorpusOptions()
    for source in expand_sources(sources):
        path = Path(source)
        if source.startswith("hf:") or path.is_dir():
            docs = _hf_documents(source, options)
        elif _is_jsonl(path):
            docs = _jsonl_documents(path, options)
        else:
            docs = _text_documents(path, options)
        for doc in docs:
            if doc.strip():
                yield doc


def split_sentences(document: str) -> list[str]:
    """Sentences of a document: each line is a paragraph, split by blingfire; empty ones dropped."""
    import blingfire

    out: list[str] = []
    for paragraph in document.split("\n"):
        paragraph = paragraph.strip()
        if paragraph:
            out.extend(s for s in blingfire.text_to_sentences(paragraph).split("\n") if s.strip())
    return out
