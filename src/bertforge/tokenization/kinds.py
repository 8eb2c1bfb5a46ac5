"""The three tokenizer kinds of the BERT family, and which one a directory's files hold."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from ..errors import TokenizerError
from .sentence import AlbertTokenizer, ByteLevelBPETokenizer, UnigramTokenizer
from .tokenizer import Tokenizer

KINDS: dict[str, type[Tokenizer]] = {"wordpiece": Tokenizer, "bpe": ByteLevelBPETokenizer, "unigram": UnigramTokenizer}
# tokenizer.json's model type -> kind
_MODEL_TYPES = {"WordPiece": "wordpiece", "BPE": "bpe", "Unigram": "unigram"}


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer a directory's files hold (or a vocab.txt given by itself), of whichever kind."""
    if Path(path).is_file():
        return Tokenizer.from_pretrained(path)
    kind = kind_of_files(path)
    if kind == "unigram" and _is_albert(Path(path)):
        return AlbertTokenizer.from_pretrained(path)
    return KINDS[kind].from_pretrained(path)


def _is_albert(path: Path) -> bool:
    """A SentencePiece Unigram directory is ALBERT's (not XLM-R's) when tokenizer_config.json's tokenizer_class says
    so or, naming none, when config.json's model_type is albert, or else when its SentencePiece file has ALBERT's
    name (spiece.model): the two pipelines differ only in their settings."""
    for name, key, albert in (("tokenizer_config.json", "tokenizer_class", AlbertTokenizer.classes),
                              ("config.json", "model_type", {"albert"})):
        file = path / name
        if file.is_file():
            try:
                value = json.loads(file.read_text(encoding="utf-8")).get(key)
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
                continue  # the tokenizer's own reader names a malformed file
            if value is not None:
                return value in albert
    return (path / "spiece.model").is_file() and not (path / "sentencepiece.bpe.model").is_file()


def kind_of_files(path: str | Path) -> str:
    """The kind of tokenizer a directory holds, from its files alone (no config.json needed):
    tokenizer.json's model type, else vocab.txt (WordPiece), vocab.json + merges.txt (BPE), or a
    SentencePiece model file (Unigram)."""
    path = Path(path)
    json_file = path / "tokenizer.json"
    if json_file.is_file():
        try:
            model_type = (json.loads(json_file.read_text(encoding="utf-8")).get("model") or {}).get("type")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
            raise TokenizerError(f"{json_file}: not a tokenizer.json ({exc})") from None
        if model_type not in _MODEL_TYPES:
            raise TokenizerError(f"{json_file}: model type {model_type!r} is not one bertforge reads "
                                 f"({', '.join(_MODEL_TYPES)})")
        return _MODEL_TYPES[model_type]
    if (path / "vocab.txt").is_file():
        return "wordpiece"
    if (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
        return "bpe"
    if (path / "spiece.model").is_file() or (path / "sentencepiece.bpe.model").is_file():
        return "unigram"
    if (path / "spm.model").is_file():
        raise TokenizerError(f"{path}: holds spm.model (DeBERTa's SentencePiece vocabulary), which bertforge does not "
                             "read yet")
    raise TokenizerError(f"{path}: no tokenizer.json, vocab.txt, vocab.json with merges.txt, or SentencePiece model "
                         "(spiece.model, sentencepiece.bpe.model)")


def train_tokenizer(kind: str, tokenizer_class: str, *, files: Iterable[str | Path] | None = None,
                    texts: Callable[[], Iterator[str]] | None = None, vocab_size: int, min_frequency: int = 2,
                    lowercase: bool = True, show_progress: bool = False) -> Tokenizer:
    """A new vocabulary of `kind` (wordpiece, bpe, unigram), assembled as transformers' `tokenizer_class`
    (BertTokenizer or DistilBertTokenizer; RobertaTokenizer; XLMRobertaTokenizer or AlbertTokenizer).
    texts: a function giving a fresh stream of strings (WordPiece reads it twice). `min_frequency` and
    `lowercase` are WordPiece's (and min_frequency BPE's); a Unigram vocabulary keeps case and has no such cut."""
    if kind == "wordpiece":
        tokenizer = Tokenizer.train(files, vocab_size=vocab_size, lowercase=lowercase, min_frequency=min_frequency,
                                    texts=texts, show_progress=show_progress)
        tokenizer.tokenizer_class = tokenizer_class  # DistilBERT's sends no token_type_ids to its model
        return tokenizer
    stream = texts() if texts is not None else None
    if kind == "bpe":
        return ByteLevelBPETokenizer.train(files, vocab_size=vocab_size, min_frequency=min_frequency, texts=stream,
                                           show_progress=show_progress)
    cls = AlbertTokenizer if tokenizer_class in AlbertTokenizer.classes else UnigramTokenizer
    return cls.train(files, vocab_size=vocab_size, texts=stream, show_progress=show_progress)
