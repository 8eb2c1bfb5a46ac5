"""The three tokenizer kinds of the BERT family, and which one a directory's files hold."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from ..errors import TokenizerError
from .base import Tokenizer
from .bpe import ByteLevelBPETokenizer
from .unigram import AlbertTokenizer, CamembertTokenizer, DebertaV2Tokenizer, UnigramTokenizer
from .verbatim import VerbatimTokenizer
from .wordpiece import MPNetTokenizer, WordPieceTokenizer

KINDS: dict[str, type[Tokenizer]] = {"wordpiece": WordPieceTokenizer, "bpe": ByteLevelBPETokenizer, "unigram": UnigramTokenizer}
# tokenizer.json's model type -> kind
_MODEL_TYPES = {"WordPiece": "wordpiece", "BPE": "bpe", "Unigram": "unigram"}


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer a directory's files hold (or a vocab.txt given by itself), of whichever kind."""
    if Path(path).is_file():
        return WordPieceTokenizer.from_pretrained(path)
    kind = kind_of_files(path)
    if kind == "unigram":
        return _unigram_pipeline(Path(path)).from_pretrained(path)
    if kind == "bpe" and _names_class(Path(path), VerbatimTokenizer.classes):
        return VerbatimTokenizer.from_pretrained(path)
    if kind == "wordpiece" and _names_class(Path(path), MPNetTokenizer.classes):
        return MPNetTokenizer.from_pretrained(path)
    return KINDS[kind].from_pretrained(path)


def _names_class(path: Path, classes: set[str]) -> bool:
    """Whether tokenizer_config.json's tokenizer_class is one of `classes` (ModernBERT's PreTrainedTokenizerFast:
    tokenizer.json used as it is, not RoBERTa's pipeline rebuilt around its vocabulary; MPNet's WordPiece)."""
    file = path / "tokenizer_config.json"
    try:
        return file.is_file() and json.loads(file.read_text(encoding="utf-8")).get("tokenizer_class") in classes
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False  # the tokenizer's own reader names a malformed file


# The SentencePiece Unigram pipelines, by the tokenizer_class or model_type that names each, and its model file.
_UNIGRAM_PIPELINES = ((AlbertTokenizer, {"albert"}), (DebertaV2Tokenizer, {"deberta-v2"}),
                      (CamembertTokenizer, {"camembert"}), (UnigramTokenizer, {"xlm-roberta"}))


def _unigram_pipeline(path: Path) -> type[UnigramTokenizer]:
    """Which Unigram pipeline a directory holds (XLM-R's, ALBERT's, DeBERTa's or CamemBERT's): tokenizer_config.json's
    tokenizer_class or, naming none, config.json's model_type, or else the name of its SentencePiece file
    (sentencepiece.bpe.model, spiece.model, spm.model): the pipelines differ only in their settings."""
    for name, key in (("tokenizer_config.json", "tokenizer_class"), ("config.json", "model_type")):
        file = path / name
        if file.is_file():
            try:
                value = json.loads(file.read_text(encoding="utf-8")).get(key)
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
                continue  # the tokenizer's own reader names a malformed file
            for cls, model_types in _UNIGRAM_PIPELINES:
                if value in (cls.classes if key == "tokenizer_class" else model_types):
                    return cls
            if value is not None:
                return UnigramTokenizer  # whose reader refuses a tokenizer_class it is not, by name
    for cls in (UnigramTokenizer, AlbertTokenizer, DebertaV2Tokenizer):  # XLM-R's file first, as before
        if (path / cls.spm_file).is_file():
            return cls
    return UnigramTokenizer


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
    if any((path / name).is_file() for name in ("spiece.model", "sentencepiece.bpe.model", "spm.model")):
        return "unigram"
    raise TokenizerError(f"{path}: no tokenizer.json, vocab.txt, vocab.json with merges.txt, or SentencePiece model "
                         "(spiece.model, sentencepiece.bpe.model, spm.model)")


def train_tokenizer(kind: str, tokenizer_class: str, *, files: Iterable[str | Path] | None = None,
                    texts: Callable[[], Iterator[str]] | None = None, vocab_size: int, min_frequency: int = 2,
                    lowercase: bool = True, show_progress: bool = False) -> Tokenizer:
    """A new vocabulary of `kind` (wordpiece, bpe, unigram), assembled as transformers' `tokenizer_class`
    (BertTokenizer, DistilBertTokenizer or MPNetTokenizer; RobertaTokenizer; XLMRobertaTokenizer or AlbertTokenizer).
    texts: a function giving a fresh stream of strings (WordPiece reads it twice). `min_frequency` and
    `lowercase` are WordPiece's (and min_frequency BPE's); a Unigram vocabulary keeps case and has no such cut."""
    if kind == "wordpiece":
        pipeline = MPNetTokenizer if tokenizer_class in MPNetTokenizer.classes else WordPieceTokenizer
        tokenizer = pipeline.train(files, vocab_size=vocab_size, lowercase=lowercase, min_frequency=min_frequency,
                                    texts=texts, show_progress=show_progress)
        tokenizer.tokenizer_class = tokenizer_class  # DistilBERT's sends no token_type_ids to its model
        return tokenizer
    stream = texts() if texts is not None else None
    if kind == "bpe" and tokenizer_class in VerbatimTokenizer.classes:
        return VerbatimTokenizer.train(files, vocab_size=vocab_size, min_frequency=min_frequency, texts=stream,
                                       show_progress=show_progress)
    if kind == "bpe":
        return ByteLevelBPETokenizer.train(files, vocab_size=vocab_size, min_frequency=min_frequency, texts=stream,
                                           show_progress=show_progress)
    cls = next((c for c, _ in _UNIGRAM_PIPELINES if tokenizer_class in c.classes), UnigramTokenizer)
    return cls.train(files, vocab_size=vocab_size, texts=stream, show_progress=show_progress)
