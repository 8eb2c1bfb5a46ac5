"""The three tokenizer kinds of the BERT family, and which one a directory's files hold."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import TokenizerError
from .sentence import ByteLevelBPETokenizer, UnigramTokenizer
from .tokenizer import Tokenizer

KINDS: dict[str, type[Tokenizer]] = {"wordpiece": Tokenizer, "bpe": ByteLevelBPETokenizer, "unigram": UnigramTokenizer}
# tokenizer.json's model type -> kind
_MODEL_TYPES = {"WordPiece": "wordpiece", "BPE": "bpe", "Unigram": "unigram"}


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer a directory's files hold (or a vocab.txt given by itself), of whichever kind."""
    if Path(path).is_file():
        return Tokenizer.from_pretrained(path)
    return KINDS[kind_of_files(path)].from_pretrained(path)


def kind_of_files(path: str | Path) -> str:
    """The kind of tokenizer a directory holds, from its files alone (no config.json needed):
    tokenizer.json's model type, else vocab.txt (WordPiece) or vocab.json + merges.txt (BPE)."""
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
    for name in ("spiece.model", "sentencepiece.bpe.model", "spm.model"):
        if (path / name).is_file():
            raise TokenizerError(f"{path}: holds {name} but no tokenizer.json; bertforge reads SentencePiece "
                                 "tokenizers from the tokenizer.json transformers writes (save_pretrained)")
    raise TokenizerError(f"{path}: no tokenizer.json, vocab.txt, or vocab.json with merges.txt")
