"""BERT's WordPiece tokenizer, built on the Hugging Face `tokenizers` library.

The pipeline is BERT's: the basic tokenizer (clean control characters, split CJK
characters, lower-case and strip accents for uncased models, split on whitespace
and punctuation), then greedy longest-match WordPiece with `##` continuations,
then the `[CLS] A [SEP] B [SEP]` template with segment ids. The `tokenizers`
library does all of it in Rust; this module only assembles it, reads and writes
the files transformers uses, and offers transformers' call signature.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from .errors import TokenizerError

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # a trained vocab puts them at ids 0..4
MAX_CHARS_PER_WORD = 100  # longer words become [UNK], as in BERT


def read_vocab(file: str | Path) -> dict[str, int]:
    """vocab.txt: one token per line, id = line number. Refuses bytes that are not UTF-8, naming the offset."""
    file = Path(file)
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise TokenizerError(f"{file}: cannot read vocabulary ({exc.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise TokenizerError(f"{file}: not UTF-8 at byte {exc.start} (line {line}); a vocab.txt must be UTF-8 text") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the file
    vocab: dict[str, int] = {}
    for i, token in enumerate(lines):
        vocab[token.rstrip("\r")] = i  # a repeated token keeps its last id, as transformers does
    if not vocab:
        raise TokenizerError(f"{file}: empty vocabulary")
    return vocab


def bert_normalizer(lowercase: bool, strip_accents: bool | None = None, chinese_chars: bool = True):
    # strip_accents=None means "follow lowercase", which is what uncased BERT does.
    return normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=chinese_chars,
                                      strip_accents=strip_accents, lowercase=lowercase)


def _finish_backend(backend: Backend) -> Backend:
    """Add the [CLS]/[SEP] template and the WordPiece decoder to a backend that has a vocabulary."""
    ids = {t: backend.token_to_id(t) for t in ("[CLS]", "[SEP]")}
    missing = [t for t, i in ids.items() if i is None]
    if missing:
        raise TokenizerError(f"vocabulary lacks the special token(s) {', '.join(missing)}")
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    backend.decoder = decoders.WordPiece(prefix="##")
    # Special tokens typed in the text ("[MASK]") are matched whole, before normalisation.
    backend.add_special_tokens([t for t in SPECIAL_TOKENS if backend.token_to_id(t) is not None])
    return backend


class Encoding(dict):
    """The dict `Tokenizer.__call__` returns (input_ids, token_type_ids, attention_mask, ...),
    with transformers' `word_ids(i)` and `sequence_ids(i)` for the i-th row."""

    def __init__(self, data: dict[str, Any], encodings: list) -> None:
        super().__init__(data)
        self.encodings = encodings

    def word_ids(self, index: int = 0) -> list[int | None]:
        return self.encodings[index].word_ids

    def sequence_ids(self, index: int = 0) -> list[int | None]:
        return self.encodings[index].sequence_ids


class Tokenizer:
    """WordPiece tokenizer with BERT's conventions and transformers' call signature."""

    def __init__(self, backend: Backend, lowercase: bool = True, strip_accents: bool | None = None,
                 model_max_length: int = 512) -> None:
        self.backend = backend
        self.lowercase = lowercase
        self.strip_accents = strip_accents
        self.model_max_length = model_max_length
        self.backend.no_truncation()
        self.backend.no_padding()

    # ----------------------------------------------------------------- loading
    @classmethod
    def from_vocab(cls, vocab_file: str | Path, lowercase: bool = True, strip_accents: bool | None = None,
                   chinese_chars: bool = True, model_max_length: int = 512) -> "Tokenizer":
        backend = Backend(models.WordPiece(read_vocab(vocab_file), unk_token="[UNK]",
                                           max_input_chars_per_word=MAX_CHARS_PER_WORD))
        backend.normalizer = bert_normalizer(lowercase, strip_accents, chinese_chars)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        try:
            _finish_backend(backend)
        except TokenizerError as exc:
            raise TokenizerError(f"{vocab_file}: {exc}") from None
        return cls(backend, lowercase, strip_accents, model_max_length)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "Tokenizer":
        """Load from a directory holding tokenizer.json or vocab.txt (or from a vocab.txt file itself).

        `tokenizer_config.json`, when present, decides lower-casing and accent stripping,
        as it does for transformers.
        """
        path = Path(path)
        if path.is_file():
            return cls.from_vocab(path)
        if not path.is_dir():
            raise TokenizerError(f"{path}: no such tokenizer directory or vocab file")
        settings: dict[str, Any] = {}
        config_file = path / "tokenizer_config.json"
        if config_file.is_file():
            try:
                settings = json.loads(config_file.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise TokenizerError(f"{config_file}: not valid JSON ({exc})") from None
        lowercase = settings.get("do_lower_case")
        strip_accents = settings.get("strip_accents")
        chinese = settings.get("tokenize_chinese_chars", True)
        max_len = settings.get("model_max_length", 512)
        if not isinstance(max_len, int) or max_len > 1_000_000:  # transformers writes a huge sentinel for "unset"
            max_len = 512

        if (path / "tokenizer.json").is_file():
            try:
                backend = Backend.from_file(str(path / "tokenizer.json"))
            except Exception as exc:  # the Rust side raises a plain Exception
                raise TokenizerError(f"{path / 'tokenizer.json'}: cannot read ({exc})") from None
            norm = json.loads(backend.to_str()).get("normalizer") or {}
            if lowercase is None:
                lowercase = bool(norm.get("lowercase", True))
            elif norm.get("type") == "BertNormalizer" and (
                    norm.get("lowercase") != lowercase or norm.get("strip_accents") != strip_accents):
                backend.normalizer = bert_normalizer(lowercase, strip_accents, chinese)
            return cls(backend, lowercase, strip_accents, max_len)
        if (path / "vocab.txt").is_file():
            return cls.from_vocab(path / "vocab.txt", True if lowercase is None else lowercase,
                                  strip_accents, chinese, max_len)
        raise TokenizerError(f"{path}: no tokenizer.json or vocab.txt")

    @classmethod
    def train(cls, files: Iterable[str | Path] | None = None, vocab_size: int = 30522, lowercase: bool = True,
              min_frequency: int = 2, texts: Iterable[str] | None = None, limit_alphabet: int = 1000,
              show_progress: bool = False) -> "Tokenizer":
        """Train a new WordPiece vocabulary on text files and/or an iterable of strings.

        The special tokens come first: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4.
        Files are read as UTF-8 and an invalid byte is reported with its file and offset.
        """
        backend = Backend(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=MAX_CHARS_PER_WORD))
        backend.normalizer = bert_normalizer(lowercase)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                            special_tokens=SPECIAL_TOKENS, limit_alphabet=limit_alphabet,
                                            continuing_subword_prefix="##", show_progress=show_progress)

        def stream() -> Iterator[str]:
            for file in files or []:
                yield from _read_lines(Path(file))
            yield from texts or []

        backend.train_from_iterator(stream(), trainer=trainer)
        if backend.get_vocab_size() <= len(SPECIAL_TOKENS):
            raise TokenizerError("tokenizer training found no text: the corpus is empty")
        return cls(_finish_backend(backend), lowercase)

    def save(self, path: str | Path) -> None:
        """Write vocab.txt, tokenizer.json, tokenizer_config.json and special_tokens_map.json."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        vocab = sorted(self.backend.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
        (path / "vocab.txt").write_text("".join(t + "\n" for t, _ in vocab), encoding="utf-8")
        self.backend.save(str(path / "tokenizer.json"))
        specials = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                    "cls_token": "[CLS]", "mask_token": "[MASK]"}
        config = {"tokenizer_class": "BertTokenizer", "do_lower_case": self.lowercase,
                  "strip_accents": self.strip_accents, "tokenize_chinese_chars": True,
                  "model_max_length": self.model_max_length, **specials}
        (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        (path / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n", encoding="utf-8")

    # ----------------------------------------------------------------- vocabulary
    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    def get_vocab(self) -> dict[str, int]:
        return self.backend.get_vocab(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, index: int) -> str | None:
        return self.backend.id_to_token(index)

    def convert_tokens_to_ids(self, tokens: list[str]) -> list[int]:
        unk = self.unk_token_id
        return [self.backend.token_to_id(t) if self.backend.token_to_id(t) is not None else unk for t in tokens]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.backend.id_to_token(int(i)) for i in ids]

    pad_token_id = property(lambda self: self.backend.token_to_id("[PAD]"))
    unk_token_id = property(lambda self: self.backend.token_to_id("[UNK]"))
    cls_token_id = property(lambda self: self.backend.token_to_id("[CLS]"))
    sep_token_id = property(lambda self: self.backend.token_to_id("[SEP]"))
    mask_token_id = property(lambda self: self.backend.token_to_id("[MASK]"))

    @property
    def special_ids(self) -> set[int]:
        return {i for i in (self.pad_token_id, self.unk_token_id, self.cls_token_id, self.sep_token_id,
                            self.mask_token_id) if i is not None}

    # ----------------------------------------------------------------- encoding
    def tokenize(self, text: str) -> list[str]:
        """WordPieces of `text`, without special tokens."""
        return self.backend.encode(text, add_special_tokens=False).tokens

    def encode(self, text: str, text_pair: str | None = None, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, text_pair, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def __call__(self, text: str | list[str], text_pair: str | list[str] | None = None, *,
                 text_pairs: list[str] | None = None, max_length: int | None = None,
                 truncation: bool | str = False, padding: bool | str = False, stride: int = 0,
                 return_tensors: str | None = None, return_offsets_mapping: bool = False,
                 return_word_ids: bool = False, return_overflowing_tokens: bool = False,
                 return_special_tokens_mask: bool = False, add_special_tokens: bool = True,
                 pad_to_multiple_of: int | None = None, is_split_into_words: bool = False) -> Encoding:
        """Encode one text or a batch, as transformers' tokenizers do.

        truncation: False, True / "longest_first", "only_first" or "only_second".
        padding: False, True / "longest" (to the longest row) or "max_length".
        return_tensors: None (lists), "pt" (torch) or "np" (numpy): ids become [B, T].
        return_overflowing_tokens with `stride`: long inputs become several windows that
        overlap by `stride` tokens; `overflow_to_sample_mapping` says which input each came from.
        is_split_into_words: each text is a list of words (e.g. NER tokens); word ids index them.
        """
        pair = text_pair if text_pair is not None else text_pairs
        unit = list if is_split_into_words else str
        single = isinstance(text, str) or (is_split_into_words and text and isinstance(text[0], str))
        texts = [text] if single else list(text)
        pairs = None if pair is None else ([pair] if isinstance(pair, unit) and single else list(pair))
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError(f"got {len(texts)} texts but {len(pairs)} text pairs")
        for t in texts + (pairs or []):
            if not isinstance(t, unit):
                raise TypeError(f"texts must be {'lists of words' if is_split_into_words else 'strings'}, "
                                f"got {type(t).__name__}")

        strategy = {True: "longest_first", "longest_first": "longest_first", "only_first": "only_first",
                    "only_second": "only_second"}.get(truncation)
        if truncation and strategy is None:
            raise ValueError(f"unknown truncation {truncation!r}")
        if max_length is None and (strategy or padding == "max_length"):
            max_length = self.model_max_length
        if strategy:
            self.backend.enable_truncation(max_length, stride=stride, strategy=strategy)
        else:
            self.backend.no_truncation()
        inputs = texts if pairs is None else list(zip(texts, pairs))
        encodings = self.backend.encode_batch(inputs, is_pretokenized=is_split_into_words,
                                              add_special_tokens=add_special_tokens)
        self.backend.no_truncation()

        sample_map = list(range(len(encodings)))
        if return_overflowing_tokens:
            flat, sample_map = [], []
            for i, enc in enumerate(encodings):
                for piece in [enc, *enc.overflowing]:
                    flat.append(piece)
                    sample_map.append(i)
            encodings = flat

        if padding:
            target = max(len(e.ids) for e in encodings) if padding in (True, "longest") else max_length
            if pad_to_multiple_of:
                target = -(-target // pad_to_multiple_of) * pad_to_multiple_of
            for enc in encodings:
                if len(enc.ids) < target:
                    enc.pad(target, pad_id=self.pad_token_id, pad_type_id=0, pad_token="[PAD]")

        data: dict[str, Any] = {
            "input_ids": [e.ids for e in encodings],
            "token_type_ids": [e.type_ids for e in encodings],
            "attention_mask": [e.attention_mask for e in encodings],
        }
        if return_offsets_mapping:
            data["offset_mapping"] = [e.offsets for e in encodings]
        if return_special_tokens_mask:
            data["special_tokens_mask"] = [e.special_tokens_mask for e in encodings]
        if return_word_ids:
            data["word_ids"] = [e.word_ids for e in encodings]
        if return_overflowing_tokens:
            data["overflow_to_sample_mapping"] = sample_map

        if return_tensors is not None:
            data = {k: _as_tensor(k, v, return_tensors) for k, v in data.items()}
        elif single and not return_overflowing_tokens:
            data = {k: v[0] for k, v in data.items()}
        return Encoding(data, encodings)


def _as_tensor(key: str, rows: list, kind: str):
    if key == "word_ids":
        return rows  # holds None for special tokens: no tensor form
    lengths = {len(r) for r in rows} if rows and isinstance(rows[0], list) else {0}
    if len(lengths) > 1:
        raise ValueError("rows differ in length: pass padding=True to build a tensor")
    import numpy as np

    array = np.asarray(rows, dtype=np.int64)
    if kind == "np":
        return array
    if kind == "pt":
        import torch

        return torch.from_numpy(array)
    raise ValueError(f"return_tensors must be 'pt' or 'np', got {kind!r}")


def _read_lines(file: Path) -> Iterator[str]:
    """Lines of a UTF-8 text file (gzip'd when it ends in .gz); a bad byte is reported by file and offset."""
    import gzip

    opener = gzip.open if file.suffix == ".gz" else open
    offset = 0
    try:
        with opener(file, "rb") as handle:
            for raw in handle:
                try:
                    yield raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise TokenizerError(f"{file}: not UTF-8 at byte {offset + exc.start}") from None
                offset += len(raw)
    except OSError as exc:
        raise TokenizerError(f"{file}: cannot read ({exc.strerror or exc})") from None
