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
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from ..errors import TokenizerError
from ..jsonfile import read_json_object
from ..safefiles import atomic_write, write_text

log = logging.getLogger("bertforge")

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # a trained vocab puts them at ids 0..4
# The role of each special token, as tokenizer_config.json names it; a checkpoint may rename any of them.
SPECIAL_ROLES = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")
DEFAULT_SPECIALS = dict(zip(SPECIAL_ROLES, SPECIAL_TOKENS))
MAX_CHARS_PER_WORD = 100  # longer words become [UNK], as in BERT
# transformers writes a huge sentinel (int(1e30)) for "no maximum length": any value from here up is read as it.
UNSET_MAX_LENGTH = 1_000_000

# tokenizer_config.json / special_tokens_map.json keys that describe files, loading or the Python class
# rather than how text becomes ids: they change no output, in transformers or here.
_NO_EFFECT_KEYS = {"name_or_path", "special_tokens_map_file", "tokenizer_file", "vocab_file", "added_tokens_decoder",
                   "model_input_names", "auto_map", "processor_class", "use_fast", "backend", "is_local",
                   "init_inputs", "add_prefix_space", "local_files_only", "extra_special_tokens", "additional_special_tokens",
                   "model_specific_special_tokens", "bos_token", "eos_token",
                   # BERT's WordPiece decoder joins "##" pieces and cleans spaces before punctuation whatever this
                   # says; transformers' own extra clean-up pass makes the same replacements again.
                   "clean_up_tokenization_spaces"}
# Tokenizer classes that are BERT's WordPiece pipeline under another name.
# WordPiece classes: DistilBERT's sends no token_type_ids; ELECTRA's is BERT's under another name (in transformers 5
# an alias of BertTokenizer).
_BERT_CLASSES = {"BertTokenizer", "BertTokenizerFast", "DistilBertTokenizer", "DistilBertTokenizerFast",
                 "ElectraTokenizer", "ElectraTokenizerFast"}


def _token_text(value: Any, key: str, source: Path) -> str:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken dict with 'content'."""
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    if isinstance(value, str) and value:
        return value
    raise TokenizerError(f"{source}: key '{key}' must be a token string, got {value!r}")


def read_special_tokens(path: Path, defaults: dict[str, str]) -> tuple[Path, dict, dict, dict[str, str]]:
    """tokenizer_config.json, special_tokens_map.json and the special token of each role in `defaults`,
    where the two files may name them (refused when they disagree). Returns (config file, config, map, specials)."""
    config_file, map_file = path / "tokenizer_config.json", path / "special_tokens_map.json"
    config = read_json_object(config_file, TokenizerError) if config_file.is_file() else {}
    token_map = read_json_object(map_file, TokenizerError) if map_file.is_file() else {}
    specials = dict(defaults)
    for role in defaults:
        found = {src: _token_text(d[role], role, src) for src, d in ((map_file, token_map), (config_file, config))
                 if d.get(role) is not None}
        if len(set(found.values())) > 1:
            raise TokenizerError(f"{path}: '{role}' is {' in '.join(map(repr, found.values()))} in the two files "
                                 f"{' and '.join(f.name for f in found)}; make them agree")
        if found:
            specials[role] = next(iter(found.values()))
    return config_file, config, token_map, specials


def read_max_length(config: dict[str, Any], config_file: Path) -> int:
    """`model_max_length` (or the older `max_len`); none, or transformers' "no maximum" sentinel, is that sentinel
    (VERY_LARGE_INTEGER), as transformers reads it: no length limit from the tokenizer. (The model's positions still
    bound every bertforge pipeline; a plain `tok(text, truncation=True)` then cuts nothing, as in transformers.)"""
    max_len = config.get("model_max_length", config.get("max_len"))
    if max_len is None or (isinstance(max_len, (int, float)) and max_len >= UNSET_MAX_LENGTH):
        return VERY_LARGE_INTEGER
    if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len <= 0:
        raise TokenizerError(f"{config_file}: key 'model_max_length' must be a positive integer, got {max_len!r}")
    return max_len


def read_settings(path: Path) -> dict[str, Any]:
    """The tokenizer settings of a checkpoint directory, read as transformers' BertTokenizer reads them.

    Every key of tokenizer_config.json (and special_tokens_map.json) is either honoured,
    known to change no output, or refused with a `TokenizerError` naming it. Defaults are
    transformers': lower-casing on, accents stripped when lower-casing, CJK characters split.
    Returns {lowercase, strip_accents, chinese_chars, model_max_length, specials, extra_specials}.
    """
    config_file, config, token_map, specials = read_special_tokens(path, DEFAULT_SPECIALS)

    def flag(key: str, default: Any, allowed: tuple) -> Any:
        value = config.get(key, default)
        if value not in allowed or (value is not None and not isinstance(value, bool)):
            raise TokenizerError(f"{config_file}: key '{key}' must be {' or '.join(map(json.dumps, allowed))}, "
                                 f"got {value!r}")
        return value

    def refuse_unless(key: str, ok: Callable[[Any], bool], why: str) -> None:
        if key in config and not ok(config[key]):
            raise TokenizerError(f"{config_file}: key '{key}' = {config[key]!r} is not supported: {why}")

    settings = {
        "lowercase": flag("do_lower_case", True, (True, False)),
        "strip_accents": flag("strip_accents", None, (True, False, None)),
        "chinese_chars": flag("tokenize_chinese_chars", True, (True, False)),
        "specials": specials,
    }
    settings["model_max_length"] = read_max_length(config, config_file)
    refuse_unless("never_split", lambda v: not v, "transformers' fast BertTokenizer ignores it while the slow one "
                  "honours it, so its meaning depends on the class; remove it or list the words as added tokens")
    refuse_unless("do_basic_tokenize", lambda v: v is True, "only BERT's basic tokenizer (punctuation and "
                  "whitespace splitting) is implemented")
    refuse_unless("tokenizer_class", lambda v: v in _BERT_CLASSES, "bertforge reads BERT WordPiece tokenizers only")
    refuse_unless("padding_side", lambda v: v == "right", "BERT pads on the right")
    refuse_unless("truncation_side", lambda v: v == "right", "bertforge truncates on the right")
    refuse_unless("split_special_tokens", lambda v: v is False, "special tokens typed in the text are kept whole")
    refuse_unless("pad_token_type_id", lambda v: v == 0, "padding uses segment id 0")
    extra = []
    for key in ("additional_special_tokens", "extra_special_tokens"):
        value = config.get(key, token_map.get(key)) or []
        if isinstance(value, dict):  # transformers 5 writes {name: token}
            value = list(value.values())
        if not isinstance(value, list):
            raise TokenizerError(f"{config_file}: key '{key}' must be a list of tokens, got {value!r}")
        extra += [_token_text(v, key, config_file) for v in value]
    settings["extra_specials"] = extra
    settings["tokenizer_class"] = config.get("tokenizer_class", "BertTokenizer")
    known = {"do_lower_case", "strip_accents", "tokenize_chinese_chars", "model_max_length", "max_len", "never_split",
             "do_basic_tokenize", "tokenizer_class", "padding_side", "truncation_side", "split_special_tokens",
             "pad_token_type_id", *SPECIAL_ROLES, *_NO_EFFECT_KEYS}
    unknown = sorted(k for k in config if k not in known)
    if unknown:
        log.warning("%s: keys %s are not BertTokenizer settings; transformers ignores them and so does bertforge",
                    config_file, ", ".join(unknown))
    return settings


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


def _finish_backend(backend: Backend, specials: dict[str, str] | None = None, extra_specials: list[str] = ()) -> Backend:
    """Add the [CLS]/[SEP] template, the special tokens and the WordPiece decoder to a backend with a vocabulary."""
    specials = specials or DEFAULT_SPECIALS
    # Encoding needs these four; a vocabulary without a mask token still classifies, tags and embeds
    # (fill-mask then says there is no mask token), as in transformers.
    needed = ("pad_token", "unk_token", "cls_token", "sep_token")
    missing = [f"{specials[r]!r} ({r})" for r in needed if backend.token_to_id(specials[r]) is None]
    missing += [f"{t!r} (additional special token)" for t in extra_specials if backend.token_to_id(t) is None]
    if missing:
        raise TokenizerError(f"vocabulary lacks the special token(s) {', '.join(missing)}")
    cls, sep = specials["cls_token"], specials["sep_token"]
    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, backend.token_to_id(cls)), (sep, backend.token_to_id(sep))],
    )
    backend.decoder = decoders.WordPiece(prefix="##")
    backend.model.unk_token = specials["unk_token"]
    # Special tokens typed in the text ("[MASK]") are matched whole, before normalisation.
    present = [specials[r] for r in SPECIAL_ROLES if backend.token_to_id(specials[r]) is not None]
    backend.add_special_tokens(present + list(extra_specials))
    return backend


def _normalizer_behaviour(spec: dict | None) -> Any:
    """What a serialised normalizer does, with BertNormalizer's `strip_accents: null` resolved (it follows lowercase)."""
    if not spec or spec.get("type") != "BertNormalizer":
        return spec
    strip = spec.get("strip_accents")
    return (spec.get("clean_text"), spec.get("handle_chinese_chars"), spec.get("lowercase") if strip is None else strip,
            spec.get("lowercase"))


class Encoding(dict):
    """What `Tokenizer.__call__` returns, as transformers' BatchEncoding is: a dict (input_ids, token_type_ids,
    attention_mask, ...) whose keys are also attributes (`enc.input_ids`), `to(device)` for tensors, and the
    per-row maps `word_ids(i)`, `sequence_ids(i)`, `tokens(i)`, `char_to_token`, `token_to_chars`."""

    def __init__(self, data: dict[str, Any], encodings: list) -> None:
        super().__init__(data)
        self.encodings = encodings

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to(self, device: Any) -> "Encoding":
        """Every tensor moved to `device` (in place, as transformers' does); returns self."""
        for key, value in self.items():
            if hasattr(value, "to"):
                self[key] = value.to(device)
        return self

    def word_ids(self, index: int = 0) -> list[int | None]:
        return self.encodings[index].word_ids

    def sequence_ids(self, index: int = 0) -> list[int | None]:
        return self.encodings[index].sequence_ids

    def tokens(self, index: int = 0) -> list[str]:
        return self.encodings[index].tokens

    def char_to_token(self, batch_or_char_index: int, char_index: int | None = None,
                      sequence_index: int = 0) -> int | None:
        """The token holding character `char_index` of row `batch_or_char_index` (or of row 0 when one index is
        given), None for a character no token covers (a space)."""
        row, char = (0, batch_or_char_index) if char_index is None else (batch_or_char_index, char_index)
        return self.encodings[row].char_to_token(char, sequence_index)

    def token_to_chars(self, batch_or_token_index: int, token_index: int | None = None) -> tuple[int, int] | None:
        row, token = (0, batch_or_token_index) if token_index is None else (batch_or_token_index, token_index)
        return self.encodings[row].token_to_chars(token)


BatchEncoding = Encoding  # transformers' name
# transformers' decode clean-up (`clean_up_tokenization_spaces`): spaces before these are dropped.
CLEAN_UP = (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"), \
    (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")
# transformers' "no maximum length" (tokenization_utils_base.VERY_LARGE_INTEGER): what a tokenizer saved without a
# model_max_length has there.
VERY_LARGE_INTEGER = int(1e30)
# transformers' order of the special-token attributes (`all_special_tokens` follows it).
SPECIAL_ATTRIBUTES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class Tokenizer:
    """WordPiece tokenizer with BERT's conventions and transformers' call signature."""

    # The transformers class this tokenizer is (tokenizer_config.json's `tokenizer_class`), written back on saving.
    tokenizer_class = "BertTokenizer"

    @property
    def model_input_names(self) -> tuple[str, ...]:
        """What `__call__` returns by default, as transformers' tokenizer class names it: DistilBERT's
        tokenizer, the same WordPiece as BERT's, sends no token_type_ids."""
        if self.tokenizer_class.startswith("DistilBert"):
            return ("input_ids", "attention_mask")
        return ("input_ids", "token_type_ids", "attention_mask")

    def __init__(self, backend: Backend, lowercase: bool = True, strip_accents: bool | None = None,
                 model_max_length: int = 512, chinese_chars: bool = True,
                 specials: dict[str, str] | None = None, extra_specials: list[str] = ()) -> None:
        self.backend = backend
        self.lowercase = lowercase
        self.strip_accents = strip_accents
        self.chinese_chars = chinese_chars
        self.model_max_length = model_max_length
        self.specials = dict(specials or DEFAULT_SPECIALS)
        self.extra_specials = list(extra_specials)
        self.backend.no_truncation()
        self.backend.no_padding()
        # transformers' attributes: which end `__call__` pads and cuts (right, BERT's, unless set)
        self.padding_side = "right"
        self.truncation_side = "right"

    # ----------------------------------------------------------------- loading
    @classmethod
    def from_vocab(cls, vocab_file: str | Path, lowercase: bool = True, strip_accents: bool | None = None,
                   chinese_chars: bool = True, model_max_length: int = 512) -> "Tokenizer":
        return cls._assemble(Backend(models.WordPiece(read_vocab(vocab_file), unk_token="[UNK]",
                                                      max_input_chars_per_word=MAX_CHARS_PER_WORD)),
                             Path(vocab_file), {"lowercase": lowercase, "strip_accents": strip_accents,
                                                "chinese_chars": chinese_chars, "model_max_length": model_max_length})

    @classmethod
    def _assemble(cls, backend: Backend, source: Path, settings: dict[str, Any]) -> "Tokenizer":
        """BERT's pipeline around a WordPiece vocabulary, configured by `settings` (see `read_settings`)."""
        settings = {"strip_accents": None, "chinese_chars": True, "model_max_length": 512,
                    "specials": DEFAULT_SPECIALS, "extra_specials": [], **settings}
        backend.normalizer = bert_normalizer(settings["lowercase"], settings["strip_accents"], settings["chinese_chars"])
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        try:
            _finish_backend(backend, settings["specials"], settings["extra_specials"])
        except TokenizerError as exc:
            raise TokenizerError(f"{source}: {exc}") from None
        tokenizer = cls(backend, settings["lowercase"], settings["strip_accents"], settings["model_max_length"],
                        settings["chinese_chars"], settings["specials"], settings["extra_specials"])
        tokenizer.tokenizer_class = settings.get("tokenizer_class", "BertTokenizer")
        return tokenizer

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "Tokenizer":
        """Load from a directory holding tokenizer.json or vocab.txt (or from a vocab.txt file itself).

        The vocabulary comes from tokenizer.json (or vocab.txt). The rest of the pipeline is
        built from tokenizer_config.json exactly as transformers' BertTokenizer builds it:
        `do_lower_case`, `strip_accents`, `tokenize_chinese_chars`, the special tokens and
        `model_max_length`, with transformers' defaults for the keys that are absent. Like
        transformers, this replaces whatever normaliser tokenizer.json carries; a warning
        says so when the two disagree. Keys that cannot be honoured are refused.
        """
        path = Path(path)
        if path.is_file():
            return cls.from_vocab(path)
        if not path.is_dir():
            raise TokenizerError(f"{path}: no such tokenizer directory or vocab file")
        settings = read_settings(path)
        json_file = path / "tokenizer.json"
        if json_file.is_file():
            try:
                backend = Backend.from_file(str(json_file))
            except Exception as exc:  # the Rust side raises a plain Exception
                raise TokenizerError(f"{json_file}: cannot read ({exc})") from None
            spec = json.loads(backend.to_str())
            if (spec.get("model") or {}).get("type") != "WordPiece":
                raise TokenizerError(f"{json_file}: model type {(spec.get('model') or {}).get('type')!r} is not "
                                     "WordPiece; bertforge reads BERT tokenizers only")
            if _normalizer_behaviour(spec.get("normalizer")) != _normalizer_behaviour(
                    {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": settings["chinese_chars"],
                     "strip_accents": settings["strip_accents"], "lowercase": settings["lowercase"]}):
                log.warning("%s: its normalizer %s is replaced by the one tokenizer_config.json describes "
                            "(lowercase=%s, strip_accents=%s, tokenize_chinese_chars=%s), as transformers does",
                            json_file, json.dumps(spec.get("normalizer")), settings["lowercase"],
                            settings["strip_accents"], settings["chinese_chars"])
            return cls._assemble(backend, json_file, settings)
        if (path / "vocab.txt").is_file():
            vocab = read_vocab(path / "vocab.txt")
            unk = settings["specials"]["unk_token"]
            return cls._assemble(Backend(models.WordPiece(vocab, unk_token=unk, max_input_chars_per_word=MAX_CHARS_PER_WORD)),
                                 path / "vocab.txt", settings)
        raise TokenizerError(f"{path}: no tokenizer.json or vocab.txt")

    @classmethod
    def train(cls, files: Iterable[str | Path] | None = None, vocab_size: int = 30522, lowercase: bool = True,
              min_frequency: int = 2, texts: Iterable[str] | Callable[[], Iterable[str]] | None = None,
              limit_alphabet: int = 1000, show_progress: bool = False) -> "Tokenizer":
        """Train a new WordPiece vocabulary on text files and/or an iterable of strings.

        The special tokens come first: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4.
        Files are read as UTF-8 and an invalid byte is reported with its file and offset.

        The same text and settings always give the same vocabulary, byte for byte. The
        `tokenizers` trainer alone does not (huggingface/tokenizers#1794): it numbers the
        `##c` continuation pieces in hash-map order, and those numbers break ties between
        equally frequent merges. So training runs twice. The first pass, which stops before
        any merge, finds which `##c` pieces the corpus has; the second lists them, sorted,
        right after the special tokens, so each has a fixed number before merging starts.
        `texts` may be a function that returns a fresh iterable of strings, so that a large
        corpus is streamed twice; a one-shot iterator is kept in memory for the second pass.
        """
        if texts is None:
            texts = []
        elif not callable(texts) and iter(texts) is texts:  # a generator: it can be read only once
            texts = list(texts)
        files = [Path(f) for f in files or []]

        def stream() -> Iterator[str]:
            for file in files:
                yield from _read_lines(file)
            yield from texts() if callable(texts) else texts

        def run(size: int, specials: list[str], progress: bool) -> Backend:
            backend = Backend(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=MAX_CHARS_PER_WORD))
            backend.normalizer = bert_normalizer(lowercase)
            backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
            trainer = trainers.WordPieceTrainer(vocab_size=size, min_frequency=min_frequency, special_tokens=specials,
                                                limit_alphabet=limit_alphabet, continuing_subword_prefix="##",
                                                show_progress=progress)
            backend.train_from_iterator(stream(), trainer=trainer)
            return backend

        first = run(len(SPECIAL_TOKENS), SPECIAL_TOKENS, False)
        pieces = sorted(t for t in first.get_vocab() if t.startswith("##") and len(t) == 3)
        trained = run(vocab_size, SPECIAL_TOKENS + pieces, show_progress)
        if trained.get_vocab_size() <= len(SPECIAL_TOKENS):
            raise TokenizerError("tokenizer training found no text: the corpus is empty")
        # Rebuild from the vocabulary alone, so that the `##c` pieces are ordinary tokens again.
        vocab = trained.get_vocab(with_added_tokens=True)
        backend = Backend(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=MAX_CHARS_PER_WORD))
        return cls._assemble(backend, Path("<trained>"), {"lowercase": lowercase})

    def save_pretrained(self, save_directory: str | Path, legacy_format: bool | None = None,
                        filename_prefix: str | None = None, push_to_hub: bool = False) -> tuple[str, ...]:
        """transformers' name for `save`; returns the files it wrote. `legacy_format` changes nothing (both the
        vocabulary files and tokenizer.json are always written); a filename prefix and pushing to the Hub are
        refused rather than ignored."""
        if filename_prefix or push_to_hub:
            raise TokenizerError("save_pretrained: filename_prefix and push_to_hub are not supported; save to a "
                                 "directory of its own")
        self.save(save_directory)
        return tuple(str(Path(save_directory) / name) for name in self.saved_files)

    # What `save` writes (each kind's own list).
    saved_files: tuple[str, ...] = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

    def save(self, path: str | Path) -> None:
        """Write vocab.txt, tokenizer.json, tokenizer_config.json and special_tokens_map.json."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        vocab = sorted(self.backend.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
        write_text(path / "vocab.txt", "".join(t + "\n" for t, _ in vocab))
        atomic_write(path / "tokenizer.json", lambda tmp: self.backend.save(tmp))
        specials = dict(self.specials)
        if self.extra_specials:
            specials["additional_special_tokens"] = self.extra_specials
        config = {"tokenizer_class": self.tokenizer_class, "do_lower_case": self.lowercase,
                  "strip_accents": self.strip_accents, "tokenize_chinese_chars": self.chinese_chars,
                  "model_max_length": self.model_max_length, **specials}
        write_text(path / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")
        write_text(path / "special_tokens_map.json", json.dumps(specials, indent=2) + "\n")

    def lowercased(self) -> "Tokenizer":
        """A copy that lower-cases its input first, as sentence-transformers' `do_lower_case` does
        (a Lowercase normaliser in front of the existing one; accents are left as they were)."""
        if self.lowercase:
            return self
        backend = Backend.from_str(self.backend.to_str())
        backend.normalizer = normalizers.Sequence([normalizers.Lowercase(), backend.normalizer])
        copy = Tokenizer(backend, self.lowercase, self.strip_accents, self.model_max_length, self.chinese_chars,
                         self.specials, self.extra_specials)
        copy.tokenizer_class = self.tokenizer_class
        return copy

    def for_words(self) -> "Tokenizer":
        """The tokenizer to encode pre-split words with (`is_split_into_words`): this one, for WordPiece."""
        return self

    # ----------------------------------------------------------------- vocabulary
    @property
    def vocab_size(self) -> int:
        """The base vocabulary, without tokens added on top of it (as transformers counts); `len(tok)` counts those
        too, and is the size a model's embeddings need."""
        return self.backend.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self.backend.get_vocab(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, index: int) -> str | None:
        return self.backend.id_to_token(index)

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | list[int]:
        """A token's id (the unknown token's for one not in the vocabulary); a list of them for a list."""
        def one(token: str) -> int:
            found = self.backend.token_to_id(token)
            return found if found is not None else self.unk_token_id

        return one(tokens) if isinstance(tokens, str) else [one(t) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | Iterable[int], skip_special_tokens: bool = False) -> str | list[str]:
        if isinstance(ids, int) or (hasattr(ids, "dim") and ids.dim() == 0):
            return self.backend.id_to_token(int(ids))
        special = self.special_ids if skip_special_tokens else set()
        return [self.backend.id_to_token(int(i)) for i in ids if int(i) not in special]

    # The special tokens, by transformers' attribute names; a role the tokenizer has no token for is None.
    # (RoBERTa-style tokenizers begin and end a text with their CLS and SEP: those are also its bos and eos.)
    def _special(self, role: str) -> str | None:
        if role in ("bos_token", "eos_token") and role not in self.specials:
            return self.specials["cls_token" if role == "bos_token" else "sep_token"] if self.has_sentence_ends else None
        return self.specials.get(role)

    has_sentence_ends = False  # True for the kinds whose tokenizer_config.json names bos/eos (RoBERTa's, XLM-R's)
    pad_token = property(lambda self: self._special("pad_token"))
    unk_token = property(lambda self: self._special("unk_token"))
    cls_token = property(lambda self: self._special("cls_token"))
    sep_token = property(lambda self: self._special("sep_token"))
    mask_token = property(lambda self: self._special("mask_token"))
    bos_token = property(lambda self: self._special("bos_token"))
    eos_token = property(lambda self: self._special("eos_token"))
    pad_token_id = property(lambda self: self._special_id("pad_token"))
    unk_token_id = property(lambda self: self._special_id("unk_token"))
    cls_token_id = property(lambda self: self._special_id("cls_token"))
    sep_token_id = property(lambda self: self._special_id("sep_token"))
    mask_token_id = property(lambda self: self._special_id("mask_token"))
    bos_token_id = property(lambda self: self._special_id("bos_token"))
    eos_token_id = property(lambda self: self._special_id("eos_token"))

    def _special_id(self, role: str) -> int | None:
        token = self._special(role)
        return None if token is None else self.backend.token_to_id(token)

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """Role -> token, for the roles the tokenizer has (transformers' `special_tokens_map`)."""
        found = {r: self._special(r) for r in SPECIAL_ATTRIBUTES if self._special(r) is not None}
        return found | ({"additional_special_tokens": list(self.extra_specials)} if self.extra_specials else {})

    @property
    def all_special_tokens(self) -> list[str]:
        """Every special token once, in transformers' order of roles, then the additional ones."""
        return list(dict.fromkeys([*(self._special(r) for r in SPECIAL_ATTRIBUTES if self._special(r) is not None),
                                   *self.extra_specials]))

    @property
    def all_special_ids(self) -> list[int]:
        return [self.backend.token_to_id(t) for t in self.all_special_tokens]

    @property
    def additional_special_tokens(self) -> list[str]:
        return list(self.extra_specials)

    def add_tokens(self, new_tokens: str | list[str], special_tokens: bool = False) -> int:
        """Add tokens to the vocabulary (kept whole in text, given new ids at the end); returns how many were new.
        Then `model.resize_token_embeddings(len(tok))`, as in transformers."""
        tokens = [new_tokens] if isinstance(new_tokens, str) else list(new_tokens)
        if special_tokens:
            self.extra_specials += [t for t in tokens if t not in self.extra_specials]
            return self.backend.add_special_tokens(tokens)
        return self.backend.add_tokens(tokens)  # (counts a token the vocabulary has as added too, as transformers)

    def add_special_tokens(self, special_tokens_dict: dict[str, Any],
                           replace_additional_special_tokens: bool = True) -> int:
        """transformers' `add_special_tokens({"pad_token": ..., "additional_special_tokens": [...]})`: each token is
        added as a special token (never split, skipped by `decode(skip_special_tokens=True)`) and takes its role;
        returns how many tokens were added, counted as transformers counts them."""
        added = 0
        for role, value in special_tokens_dict.items():
            if role in ("additional_special_tokens", "extra_special_tokens"):
                values = list(value.values()) if isinstance(value, dict) else list(value)
                added += self.backend.add_special_tokens(values)
                kept = [] if replace_additional_special_tokens else self.extra_specials
                self.extra_specials = kept + [t for t in values if t not in kept]
            elif role in SPECIAL_ATTRIBUTES:
                if not isinstance(value, str):
                    raise TypeError(f"add_special_tokens: {role} must be a string, got {type(value).__name__}")
                added += self.backend.add_special_tokens([value])
                self.specials[role] = value
            else:
                raise ValueError(f"add_special_tokens: unknown role {role!r} ({', '.join(SPECIAL_ATTRIBUTES)}, "
                                 "additional_special_tokens)")
        return added

    @property
    def special_ids(self) -> set[int]:
        ids = (self.backend.token_to_id(t) for t in [*self.specials.values(), *self.extra_specials])
        return {i for i in ids if i is not None}

    # ----------------------------------------------------------------- encoding
    def tokenize(self, text: str) -> list[str]:
        """WordPieces of `text`, without special tokens."""
        return self.backend.encode(text, add_special_tokens=False).tokens

    def encode(self, text: str, text_pair: str | None = None, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, text_pair, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: int | Iterable[int], skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool | None = None) -> str:
        """Text of `ids` (a list, a tensor or one id). Special tokens are kept unless `skip_special_tokens`, as in
        transformers. `clean_up_tokenization_spaces` (None: the tokenizer's setting) removes the space the decoder
        leaves before punctuation and in English contractions."""
        if isinstance(ids, int) or (hasattr(ids, "dim") and ids.dim() == 0):
            ids = [int(ids)]
        text = self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
        if clean_up_tokenization_spaces if clean_up_tokenization_spaces is not None else self.clean_up_spaces:
            for before, after in CLEAN_UP:
                text = text.replace(before, after)
        return text

    def batch_decode(self, sequences: Iterable[Iterable[int]], skip_special_tokens: bool = False,
                     clean_up_tokenization_spaces: bool | None = None) -> list[str]:
        """`decode` of each row (a list of lists, or a [B, T] tensor)."""
        return [self.decode(row, skip_special_tokens, clean_up_tokenization_spaces) for row in sequences]

    # WordPiece's decoder cleans those spaces itself whatever the setting (as transformers' fast BertTokenizer does);
    # the other kinds follow tokenizer_config.json's clean_up_tokenization_spaces (`SentenceTokenizer`).
    clean_up_spaces = False

    def __call__(self, text: str | list[str], text_pair: str | list[str] | None = None, *,
                 text_pairs: list[str] | None = None, max_length: int | None = None,
                 truncation: bool | str = False, padding: bool | str = False, stride: int = 0,
                 return_tensors: str | None = None, return_offsets_mapping: bool = False,
                 return_word_ids: bool = False, return_overflowing_tokens: bool = False,
                 return_special_tokens_mask: bool = False, add_special_tokens: bool = True,
                 pad_to_multiple_of: int | None = None, is_split_into_words: bool = False,
                 return_token_type_ids: bool | None = None, truncation_side: str | None = None,
                 return_attention_mask: bool | None = None, return_length: bool = False,
                 padding_side: str | None = None, verbose: bool = True) -> Encoding:
        """Encode one text or a batch, as transformers' tokenizers do.

        truncation: False, True / "longest_first", "only_first" or "only_second".
        padding: False, True / "longest" (to the longest row) or "max_length".
        return_tensors: None (lists), "pt" (torch) or "np" (numpy): ids become [B, T].
        return_overflowing_tokens with `stride`: long inputs become several windows that
        overlap by `stride` tokens; `overflow_to_sample_mapping` says which input each came from.
        is_split_into_words: each text is a list of words (e.g. NER tokens); word ids index them.
        return_token_type_ids: None follows `model_input_names` (RoBERTa's tokenizers send none).
        truncation_side: "right" cuts the end of a long text, "left" its beginning (as TEI's
            `truncation_direction: left` asks); None: the tokenizer's `truncation_side` (right unless set).
        padding_side: None: the tokenizer's `padding_side` (right unless set); "left" pads before the text.
        return_attention_mask: None or True returns it; return_length adds each row's "length" (its tokens,
            padding included, as transformers counts).
        verbose: transformers' switch for its warnings; this tokenizer warns of nothing here, so it changes nothing.
        """
        truncation_side = truncation_side or self.truncation_side
        padding_side = padding_side or self.padding_side
        if padding_side not in ("left", "right"):
            raise ValueError(f"unknown padding_side {padding_side!r} (left or right)")
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
        if truncation_side not in ("left", "right"):
            raise ValueError(f"unknown truncation_side {truncation_side!r} (left or right)")
        if max_length is None and (strategy or padding == "max_length"):
            max_length = self.model_max_length
        if max_length is not None and max_length >= UNSET_MAX_LENGTH:  # no maximum: nothing to cut (transformers)
            if padding == "max_length":
                raise ValueError("padding='max_length' needs max_length: this tokenizer has no model_max_length")
            max_length, strategy = None, None
        if strategy:
            # Each text needs at least one token beside the special ones; with less room, `tokenizers`
            # returns rows longer than max_length (and transformers passes them on), so refuse instead.
            least = (self.backend.num_special_tokens_to_add(pairs is not None) if add_special_tokens else 0) + \
                (2 if pairs is not None else 1)
            if max_length < least:
                raise TokenizerError(f"max_length {max_length} is too short: it must leave each text at least one "
                                     f"token beside the special tokens (at least {least})")
            try:
                self.backend.enable_truncation(max_length, stride=stride, strategy=strategy, direction=truncation_side)
            except ValueError as exc:  # e.g. a stride as long as the window
                raise TokenizerError(str(exc).strip().rstrip(",")) from None
        else:
            self.backend.no_truncation()
        inputs = texts if pairs is None else list(zip(texts, pairs))
        try:
            encodings = self.backend.encode_batch(inputs, is_pretokenized=is_split_into_words,
                                                  add_special_tokens=add_special_tokens)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # the Rust side raises plain Exceptions, or panics (a BaseException),
            # for a truncation it cannot do, e.g. a stride longer than the room one text has beside its pair
            raise TokenizerError(f"cannot encode the input: {str(exc).splitlines()[0]}") from None
        finally:
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
                    enc.pad(target, direction=padding_side, pad_id=self.pad_token_id, pad_type_id=0,
                            pad_token=self.specials["pad_token"])

        data: dict[str, Any] = {
            "input_ids": [e.ids for e in encodings],
            "token_type_ids": [e.type_ids for e in encodings],
            "attention_mask": [e.attention_mask for e in encodings],
        }
        if not (return_token_type_ids if return_token_type_ids is not None
                else "token_type_ids" in self.model_input_names):
            del data["token_type_ids"]
        if return_offsets_mapping:
            data["offset_mapping"] = [e.offsets for e in encodings]
        if return_special_tokens_mask:
            data["special_tokens_mask"] = [e.special_tokens_mask for e in encodings]
        if return_attention_mask is False:
            del data["attention_mask"]
        if return_length:
            data["length"] = [len(e.ids) for e in encodings]
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
    lengths = {len(r) for r in rows} if rows and isinstance(rows[0], list) else {0}  # ("length": one int a row)
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
    import zlib

    opener = gzip.open if file.suffix == ".gz" else open
    offset = lines = 0
    try:
        with opener(file, "rb") as handle:
            for raw in handle:
                try:
                    yield raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise TokenizerError(f"{file}: not UTF-8 at byte {offset + exc.start}") from None
                offset += len(raw)
                lines += 1
    except (OSError, EOFError, zlib.error) as exc:  # a truncated .gz ends in EOFError, a damaged one in zlib's
        from ..data.io import corrupt

        raise TokenizerError(corrupt(file, lines, exc)) from None
