"""Prepared data: a corpus split into sentences and tokenised once, into shards of token ids on disk.

Layout of a prepared directory (`bertforge prepare CORPUS... --out DIR`):

    meta.json          format, tokenizer fingerprint, token dtype, totals, shard list
    vocab.txt, tokenizer.json, ...   the tokenizer the ids belong to
    shard-00000/
      tokens.bin       every token id, sentence after sentence (uint16 if the vocab fits, else uint32)
      sentences.bin    int64: end offset of each sentence in tokens.bin
      documents.bin    int64: end index of each document in sentences.bin

The files are raw little-endian numpy arrays read back with `np.memmap`: sentence i and
document d are slices found by one index lookup, so access is O(1) and nothing is loaded
up front. A document never spans two shards. Tokenisation runs in worker processes with a
bounded number of chunks in flight, so `prepare`'s memory stays flat however large the corpus.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import shutil
import time
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..tokenization.kinds import load_tokenizer
from ..tokenization.base import Tokenizer
from .corpus import CorpusOptions, iter_documents, split_sentences

FORMAT = "bertforge-shards-v1"
DOCS_PER_CHUNK = 256


def tokenizer_fingerprint(tokenizer: Tokenizer) -> str:
    return hashlib.sha256(tokenizer.backend.to_str().encode("utf-8")).hexdigest()[:16]


# ----------------------------------------------------------------------------- workers
_worker_tokenizer: Tokenizer | None = None


def _init_worker(tokenizer_json: str) -> None:
    global _worker_tokenizer
    from tokenizers import Tokenizer as Backend

    _worker_tokenizer = Tokenizer(Backend.from_str(tokenizer_json))


def tokenize_documents(docs: list[str], tokenizer: Tokenizer | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Documents -> (flat token ids int32, tokens per sentence int64, sentences per document int64).

    Sentences that tokenise to nothing and documents left with no sentence are dropped.
    """
    tok = tokenizer or _worker_tokenizer
    sentences: list[str] = []
    per_doc: list[int] = []
    for doc in docs:
        s = split_sentences(doc)
        sentences.extend(s)
        per_doc.append(len(s))
    encoded = tok.backend.encode_batch(sentences, add_special_tokens=False) if sentences else []
    lengths = np.fromiter((len(e.ids) for e in encoded), dtype=np.int64, count=len(encoded))
    flat = (np.concatenate([np.asarray(e.ids, dtype=np.int32) for e in encoded]) if encoded
            else np.zeros(0, dtype=np.int32))
    # Recount sentences per document after dropping empty ones.
    keep = lengths > 0
    bounds = np.concatenate([[0], np.cumsum(per_doc)]).astype(np.int64)
    doc_counts = np.array([int(keep[a:b].sum()) for a, b in zip(bounds[:-1], bounds[1:])], dtype=np.int64)
    return flat, lengths[keep], doc_counts[doc_counts > 0]


# ----------------------------------------------------------------------------- writing
class ShardWriter:
    """Appends documents to shard files, starting a new shard past `shard_tokens` tokens."""

    def __init__(self, out: Path, dtype: np.dtype, shard_tokens: int) -> None:
        self.out, self.dtype, self.shard_tokens = out, dtype, shard_tokens
        self.shards: list[dict] = []
        self._files = None

    def _open(self) -> None:
        self._close()
        d = self.out / f"shard-{len(self.shards):05d}"
        d.mkdir(parents=True)
        self._files = [open(d / n, "wb") for n in ("tokens.bin", "sentences.bin", "documents.bin")]
        self.shards.append({"name": d.name, "tokens": 0, "sentences": 0, "documents": 0})

    def _close(self) -> None:
        if self._files:
            for f in self._files:
                f.close()
        self._files = None

    def write(self, flat: np.ndarray, lengths: np.ndarray, doc_counts: np.ndarray) -> None:
        """One tokenised chunk, as `tokenize_documents` returns it."""
        sent_bounds = np.concatenate([[0], np.cumsum(doc_counts)])
        tok_bounds = np.concatenate([[0], np.cumsum(lengths)])
        start = 0
        while start < len(doc_counts):
            if self._files is None or self.shards[-1]["tokens"] >= self.shard_tokens:
                self._open()
            cur = self.shards[-1]
            # As many whole documents as fit before the shard is full (at least one).
            room = self.shard_tokens - cur["tokens"]
            end = start + 1
            while end < len(doc_counts) and tok_bounds[sent_bounds[end + 1]] - tok_bounds[sent_bounds[start]] <= room:
                end += 1
            s0, s1 = sent_bounds[start], sent_bounds[end]
            t0, t1 = tok_bounds[s0], tok_bounds[s1]
            tokens_file, sentences_file, documents_file = self._files
            tokens_file.write(flat[t0:t1].astype(self.dtype).tobytes())
            sentences_file.write((cur["tokens"] + np.cumsum(lengths[s0:s1])).astype("<i8").tobytes())
            documents_file.write((cur["sentences"] + np.cumsum(doc_counts[start:end])).astype("<i8").tobytes())
            cur["tokens"] += int(t1 - t0)
            cur["sentences"] += int(s1 - s0)
            cur["documents"] += end - start
            start = end

    def close(self) -> list[dict]:
        self._close()
        return self.shards


def _chunks(docs: Iterable[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for doc in docs:
        chunk.append(doc)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def check_workers(workers: int | None) -> None:
    """Refuse a process count below 1 (it used to become 1 without a word)."""
    if workers is not None and workers < 1:
        raise InputError(f"--workers {workers}: give at least 1 tokenising process (or leave it out for all cores)")


def prepare(sources: list[str], out: str | Path, tokenizer: Tokenizer, options: CorpusOptions | None = None,
            workers: int | None = None, shard_tokens: int = 100_000_000, progress: bool = False) -> dict:
    """Tokenise the corpus `sources` into shards under `out` (which must not exist). Returns the meta dict."""
    return prepare_documents(iter_documents(sources, options), [str(s) for s in sources], out, tokenizer,
                             workers, shard_tokens, progress)


def prepare_documents(docs: Iterable[str], sources: list[str], out: str | Path, tokenizer: Tokenizer,
                      workers: int | None = None, shard_tokens: int = 100_000_000, progress: bool = False) -> dict:
    """Tokenise a stream of documents into shards under `out`; `sources` names them in meta.json."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise InputError(f"{out}: already exists and is not empty; choose a new --out")
    check_workers(workers)
    workers = workers if workers is not None else (os.cpu_count() or 1)
    dtype = np.dtype("<u2") if len(tokenizer) <= 65536 else np.dtype("<u4")
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)  # our own leftover from an interrupted prepare
    tmp.mkdir(parents=True)
    writer = ShardWriter(tmp, dtype, shard_tokens)
    started = time.perf_counter()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(unit=" docs", desc="prepare", dynamic_ncols=True)
    try:
        if workers == 1:
            for chunk in _chunks(docs, DOCS_PER_CHUNK):
                writer.write(*tokenize_documents(chunk, tokenizer))
                if bar is not None:
                    bar.update(len(chunk))
        else:
            # Bounded in flight: Pool.imap would read the whole corpus ahead of the workers.
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            ctx = mp.get_context("spawn")
            with ctx.Pool(workers, initializer=_init_worker, initargs=(tokenizer.backend.to_str(),)) as pool:
                pending: deque = deque()
                for chunk in _chunks(docs, DOCS_PER_CHUNK):
                    pending.append((len(chunk), pool.apply_async(tokenize_documents, (chunk,))))
                    while len(pending) >= 2 * workers:
                        n, result = pending.popleft()
                        writer.write(*result.get())
                        if bar is not None:
                            bar.update(n)
                while pending:
                    n, result = pending.popleft()
                    writer.write(*result.get())
                    if bar is not None:
                        bar.update(n)
    except BaseException:
        writer.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if bar is not None:
            bar.close()
    shards = writer.close()
    totals = {k: sum(s[k] for s in shards) for k in ("tokens", "sentences", "documents")}
    if totals["documents"] == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise InputError(f"{', '.join(sources)}: the corpus is empty (no text after reading and splitting)")
    meta = {"format": FORMAT, "dtype": dtype.str, "tokenizer": tokenizer_fingerprint(tokenizer),
            "vocab_size": len(tokenizer), "sources": list(sources), "shards": shards,
            **totals, "seconds": round(time.perf_counter() - started, 2)}
    tokenizer.save(tmp)
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, out)  # appears whole or not at all
    return meta


# ----------------------------------------------------------------------------- reading
class TokenShards:
    """Read-only view of a prepared directory, with O(1) access to any sentence or document."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        meta_file = self.path / "meta.json"
        if not meta_file.is_file():
            raise InputError(f"{self.path}: not a prepared data directory (no meta.json); run `bertforge prepare`")
        self.meta = json.loads(meta_file.read_text(encoding="utf-8"))
        if self.meta.get("format") != FORMAT:
            raise InputError(f"{meta_file}: unknown format {self.meta.get('format')!r}")
        dtype = np.dtype(self.meta["dtype"])
        self._tokens, self._sentences, self._documents = [], [], []
        for shard in self.meta["shards"]:
            d = self.path / shard["name"]
            self._tokens.append(np.memmap(d / "tokens.bin", dtype=dtype, mode="r", shape=(shard["tokens"],)))
            self._sentences.append(np.memmap(d / "sentences.bin", dtype="<i8", mode="r", shape=(shard["sentences"],)))
            self._documents.append(np.memmap(d / "documents.bin", dtype="<i8", mode="r", shape=(shard["documents"],)))
        self.doc_start = np.concatenate([[0], np.cumsum([s["documents"] for s in self.meta["shards"]])])
        self.sent_start = np.concatenate([[0], np.cumsum([s["sentences"] for s in self.meta["shards"]])])

    @property
    def num_documents(self) -> int:
        return int(self.doc_start[-1])

    @property
    def num_tokens(self) -> int:
        return int(self.meta["tokens"])

    def _locate_doc(self, doc: int) -> tuple[int, int]:
        shard = int(np.searchsorted(self.doc_start, doc, side="right") - 1)
        return shard, doc - int(self.doc_start[shard])

    def document_sentences(self, doc: int) -> tuple[int, int]:
        """Global sentence index range [start, end) of document `doc`."""
        shard, local = self._locate_doc(doc)
        ends = self._documents[shard]
        start = int(ends[local - 1]) if local else 0
        base = int(self.sent_start[shard])
        return base + start, base + int(ends[local])

    def sentence_lengths(self) -> np.ndarray:
        """Tokens per sentence, for every sentence (int64 [num_sentences])."""
        parts = [np.diff(np.concatenate([[0], s])) for s in self._sentences]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def document_boundaries(self) -> np.ndarray:
        """Global sentence end index of every document (int64 [num_documents])."""
        return np.concatenate([np.asarray(d) + int(self.sent_start[i]) for i, d in enumerate(self._documents)])

    def sentence_tokens(self, first: int, last: int) -> np.ndarray:
        """Token ids of sentences [first, last), which must lie in one document (int64 [n])."""
        shard = int(np.searchsorted(self.sent_start, first, side="right") - 1)
        ends = self._sentences[shard]
        lo, hi = first - int(self.sent_start[shard]), last - int(self.sent_start[shard])
        t0 = int(ends[lo - 1]) if lo else 0
        t1 = int(ends[hi - 1]) if hi else 0
        return self._tokens[shard][t0:t1].astype(np.int64)


def load_tokenizer_for(shards: TokenShards) -> Tokenizer:
    tok = load_tokenizer(shards.path)
    if tokenizer_fingerprint(tok) != shards.meta["tokenizer"]:
        raise InputError(f"{shards.path}: tokenizer files do not match the prepared ids")
    return tok
