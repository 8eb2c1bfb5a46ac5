"""BERT's WordPiece tokenizer, built on the Hugging Face `tokenizers` library.

The pipeline is BERT's: the basic tokenizer (clean control characters, split CJK
characters, lower-case and strip accents for uncased models, split on whitespace
and punctuation), then greedy longest-match WordPiece with `##` continuations,
then the `[CLS] A [SEP] B [SEP]` template with segment ids. The `tokenizers`
library does all of it in Rust; this module only assembles it, reads and writes
the files transformers uses (vocab.txt, tokenizer.json, tokenizer_config.json).
MPNet's tokenizer is the same pipeline with RoBERTa's special tokens and pairs (`MPNetTokenizer`).
The call signature is every kind's (`base.py`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from tokenizers import AddedToken
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from ..errors import TokenizerError
from ..safefiles import atomic_write, write_text
from .base import Tokenizer
from .files import NO_EFFECT_KEYS, SPECIAL_ROLES, read_lines, read_max_length, read_special_tokens, token_text

log = logging.getLogger("bertforge")

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # a trained vocab puts them at ids 0..4
DEFAULT_SPECIALS = dict(zip(SPECIAL_ROLES, SPECIAL_TOKENS))
MAX_CHARS_PER_WORD = 100  # longer words become [UNK], as in BERT
# Tokenizer classes that are BERT's WordPiece pipeline under another name.
# WordPiece classes: DistilBERT's sends no token_type_ids; ELECTRA's is BERT's under another name (in transformers 5
# an alias of BertTokenizer).
_BERT_CLASSES = {"BertTokenizer", "BertTokenizerFast", "DistilBertTokenizer", "DistilBertTokenizerFast",
                 "ElectraTokenizer", "ElectraTokenizerFast"}



def read_settings(path: Path, classes: set[str] = _BERT_CLASSES, defaults: dict[str, str] = DEFAULT_SPECIALS,
                  default_class: str = "BertTokenizer") -> dict[str, Any]:
    """The tokenizer settings of a checkpoint directory, read as transformers' BertTokenizer (or another of the
    WordPiece `classes`, whose special tokens default to `defaults`) reads them.

    Every key of tokenizer_config.json (and special_tokens_map.json) is either honoured,
    known to change no output, or refused with a `TokenizerError` naming it. Defaults are
    transformers': lower-casing on, accents stripped when lower-casing, CJK characters split.
    Returns {lowercase, strip_accents, chinese_chars, model_max_length, specials, extra_specials}.
    """
    config_file, config, token_map, specials = read_special_tokens(path, defaults)

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
    refuse_unless("tokenizer_class", lambda v: v in classes, f"this pipeline is {' or '.join(sorted(classes))}")
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
        extra += [token_text(v, key, config_file) for v in value]
    settings["extra_specials"] = extra
    settings["tokenizer_class"] = config.get("tokenizer_class", default_class)
    known = {"do_lower_case", "strip_accents", "tokenize_chinese_chars", "model_max_length", "max_len", "never_split",
             "do_basic_tokenize", "tokenizer_class", "padding_side", "truncation_side", "split_special_tokens",
             "pad_token_type_id", *SPECIAL_ROLES, *NO_EFFECT_KEYS}
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


def _finish_backend(backend: Backend, specials: dict[str, str], extra_specials: list[str] = (),
                    roberta_pairs: bool = False) -> Backend:
    """Add the [CLS]/[SEP] template (or, with `roberta_pairs`, `<s> A </s></s> B </s>` with no segments and the mask
    token taking the space before it, as MPNet's), the special tokens and the WordPiece decoder to a backend with a
    vocabulary."""
    # Encoding needs these four; a vocabulary without a mask token still classifies, tags and embeds
    # (fill-mask then says there is no mask token), as in transformers.
    needed = ("pad_token", "unk_token", "cls_token", "sep_token")
    missing = [f"{specials[r]!r} ({r})" for r in needed if backend.token_to_id(specials[r]) is None]
    missing += [f"{t!r} (additional special token)" for t in extra_specials if backend.token_to_id(t) is None]
    if missing:
        raise TokenizerError(f"vocabulary lacks the special token(s) {', '.join(missing)}")
    cls, sep = specials["cls_token"], specials["sep_token"]
    if roberta_pairs:
        backend.post_processor = processors.RobertaProcessing((sep, backend.token_to_id(sep)),
                                                              (cls, backend.token_to_id(cls)), trim_offsets=True,
                                                              add_prefix_space=False)
    else:
        backend.post_processor = processors.TemplateProcessing(
            single=f"{cls}:0 $A:0 {sep}:0",
            pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
            special_tokens=[(cls, backend.token_to_id(cls)), (sep, backend.token_to_id(sep))],
        )
    backend.decoder = decoders.WordPiece(prefix="##")
    backend.model.unk_token = specials["unk_token"]
    # Special tokens typed in the text ("[MASK]") are matched whole, before normalisation. MPNet's mask token eats
    # the space before it (transformers' MPNetTokenizer sets lstrip on it whatever the files say).
    present = [AddedToken(specials[r], special=True, normalized=False, lstrip=roberta_pairs and r == "mask_token")
               for r in SPECIAL_ROLES if backend.token_to_id(specials[r]) is not None]
    backend.add_special_tokens(present + list(extra_specials))
    return backend


def _normalizer_behaviour(spec: dict | None) -> Any:
    """What a serialised normalizer does, with BertNormalizer's `strip_accents: null` resolved (it follows lowercase)."""
    if not spec or spec.get("type") != "BertNormalizer":
        return spec
    strip = spec.get("strip_accents")
    return (spec.get("clean_text"), spec.get("handle_chinese_chars"), spec.get("lowercase") if strip is None else strip,
            spec.get("lowercase"))



class WordPieceTokenizer(Tokenizer):
    """WordPiece tokenizer with BERT's conventions (`bertforge.Tokenizer` is this class)."""

    tokenizer_class = "BertTokenizer"
    # The tokenizer_config.json classes this pipeline is, its default special tokens, a new vocabulary's first
    # tokens (ids 0..4), and whether pairs are RoBERTa's `<s> A </s></s> B </s>` with no segments (MPNet's).
    classes: ClassVar[set[str]] = _BERT_CLASSES
    default_specials: ClassVar[dict[str, str]] = DEFAULT_SPECIALS
    trained_specials: ClassVar[list[str]] = SPECIAL_TOKENS
    roberta_pairs: ClassVar[bool] = False

    @property
    def model_input_names(self) -> tuple[str, ...]:  # type: ignore[override]
        """What `__call__` returns by default, as transformers' tokenizer class names it: DistilBERT's
        tokenizer, the same WordPiece as BERT's, sends no token_type_ids."""
        if self.tokenizer_class.startswith("DistilBert") or self.roberta_pairs:
            return ("input_ids", "attention_mask")
        return ("input_ids", "token_type_ids", "attention_mask")

    def __init__(self, backend: Backend, lowercase: bool = True, strip_accents: bool | None = None,
                 model_max_length: int = 512, chinese_chars: bool = True,
                 specials: dict[str, str] | None = None, extra_specials: list[str] = ()) -> None:
        super().__init__(backend, model_max_length, dict(specials or self.default_specials), extra_specials)
        self.lowercase = lowercase
        self.strip_accents = strip_accents
        self.chinese_chars = chinese_chars

    # ----------------------------------------------------------------- loading
    @classmethod
    def from_vocab(cls, vocab_file: str | Path, lowercase: bool = True, strip_accents: bool | None = None,
                   chinese_chars: bool = True, model_max_length: int = 512) -> "WordPieceTokenizer":
        return cls._assemble(Backend(models.WordPiece(read_vocab(vocab_file), unk_token=cls.default_specials["unk_token"],
                                                      max_input_chars_per_word=MAX_CHARS_PER_WORD)),
                             Path(vocab_file), {"lowercase": lowercase, "strip_accents": strip_accents,
                                                "chinese_chars": chinese_chars, "model_max_length": model_max_length})

    @classmethod
    def _assemble(cls, backend: Backend, source: Path, settings: dict[str, Any]) -> "WordPieceTokenizer":
        """BERT's pipeline around a WordPiece vocabulary, configured by `settings` (see `read_settings`)."""
        settings = {"strip_accents": None, "chinese_chars": True, "model_max_length": 512,
                    "specials": cls.default_specials, "extra_specials": [], **settings}
        backend.normalizer = bert_normalizer(settings["lowercase"], settings["strip_accents"], settings["chinese_chars"])
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        try:
            _finish_backend(backend, settings["specials"], settings["extra_specials"], cls.roberta_pairs)
        except TokenizerError as exc:
            raise TokenizerError(f"{source}: {exc}") from None
        tokenizer = cls(backend, settings["lowercase"], settings["strip_accents"], settings["model_max_length"],
                        settings["chinese_chars"], settings["specials"], settings["extra_specials"])
        tokenizer.tokenizer_class = settings.get("tokenizer_class", cls.tokenizer_class)
        return tokenizer

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "WordPieceTokenizer":
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
        settings = read_settings(path, cls.classes, cls.default_specials, cls.tokenizer_class)
        json_file = path / "tokenizer.json"
        if json_file.is_file():
            try:
                backend = Backend.from_file(str(json_file))
            except Exception as exc:  # the Rust side raises a plain Exception
                raise TokenizerError(f"{json_file}: cannot read ({exc})") from None
            spec = json.loads(backend.to_str())
            if (spec.get("model") or {}).get("type") != "WordPiece":
                raise TokenizerError(f"{json_file}: model type {(spec.get('model') or {}).get('type')!r} is not "
                                     f"WordPiece, which {settings['tokenizer_class']} is")
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
              limit_alphabet: int = 1000, show_progress: bool = False) -> "WordPieceTokenizer":
        """Train a new WordPiece vocabulary on text files and/or an iterable of strings.

        The special tokens come first: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4 (MPNet's: <s>=0, <pad>=1,
        </s>=2, [UNK]=3, <mask>=4, so the padding id is the 1 its positions count from).
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
                yield from read_lines(file)
            yield from texts() if callable(texts) else texts

        unk = cls.default_specials["unk_token"]

        def run(size: int, specials: list[str], progress: bool) -> Backend:
            backend = Backend(models.WordPiece(unk_token=unk, max_input_chars_per_word=MAX_CHARS_PER_WORD))
            backend.normalizer = bert_normalizer(lowercase)
            backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
            trainer = trainers.WordPieceTrainer(vocab_size=size, min_frequency=min_frequency, special_tokens=specials,
                                                limit_alphabet=limit_alphabet, continuing_subword_prefix="##",
                                                show_progress=progress)
            backend.train_from_iterator(stream(), trainer=trainer)
            return backend

        first = run(len(cls.trained_specials), cls.trained_specials, False)
        pieces = sorted(t for t in first.get_vocab() if t.startswith("##") and len(t) == 3)
        trained = run(vocab_size, cls.trained_specials + pieces, show_progress)
        if trained.get_vocab_size() <= len(cls.trained_specials):
            raise TokenizerError("tokenizer training found no text: the corpus is empty")
        # Rebuild from the vocabulary alone, so that the `##c` pieces are ordinary tokens again.
        vocab = trained.get_vocab(with_added_tokens=True)
        backend = Backend(models.WordPiece(vocab, unk_token=unk, max_input_chars_per_word=MAX_CHARS_PER_WORD))
        return cls._assemble(backend, Path("<trained>"), {"lowercase": lowercase})


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

    def lowercased(self) -> "WordPieceTokenizer":
        """A copy that lower-cases its input first, as sentence-transformers' `do_lower_case` does
        (a Lowercase normaliser in front of the existing one; accents are left as they were)."""
        if self.lowercase:
            return self
        backend = Backend.from_str(self.backend.to_str())
        backend.normalizer = normalizers.Sequence([normalizers.Lowercase(), backend.normalizer])
        copy = type(self)(backend, self.lowercase, self.strip_accents, self.model_max_length, self.chinese_chars,
                          self.specials, self.extra_specials)
        copy.tokenizer_class = self.tokenizer_class
        return copy



class MPNetTokenizer(WordPieceTokenizer):
    """MPNet's tokenizer (transformers' MPNetTokenizer): BERT's WordPiece pipeline on a vocabulary that starts
    `<s> <pad> </s> <unk>`, with `<s> A </s>` and `<s> A </s></s> B </s>` as RoBERTa builds them, no
    token_type_ids, and a mask token that takes the space before it."""

    tokenizer_class = "MPNetTokenizer"
    classes = {"MPNetTokenizer", "MPNetTokenizerFast"}
    default_specials = {"pad_token": "<pad>", "unk_token": "[UNK]", "cls_token": "<s>", "sep_token": "</s>",
                        "mask_token": "<mask>"}
    trained_specials = ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]
    roberta_pairs = True
