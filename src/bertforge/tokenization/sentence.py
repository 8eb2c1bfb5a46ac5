"""The `<s> A </s></s> B </s>` tokenizers: RoBERTa's byte-level BPE and XLM-RoBERTa's SentencePiece Unigram.

Both are built the way transformers builds them: the vocabulary (and, for BPE, the merges) from
the directory's files, the rest of the pipeline from tokenizer_config.json's settings
(`settings.py`), and the added tokens, with their lstrip/rstrip flags, from tokenizer.json. The
call signature, padding, truncation, offsets and tensors are the WordPiece tokenizer's
(`tokenizer.py`); only the pipeline differs. Neither sends token_type_ids by default, as in
transformers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as Backend

from ..errors import TokenizerError
from ..jsonfile import read_json_object
from .settings import SENTENCE_SPECIALS, read_sentence_settings
from .tokenizer import SPECIAL_ROLES, Tokenizer, _read_lines

log = logging.getLogger("bertforge")

# transformers' decode clean-up (`clean_up_tokenization_spaces`): spaces before these are dropped.
_CLEAN_UP = (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"), \
    (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")


# A new vocabulary's first ids, as fairseq (and so RoBERTa and XLM-R) number them.
TRAINED_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


class SentenceTokenizer(Tokenizer):
    """What the BPE and Unigram tokenizers share: settings, added tokens, training, saving and decoding."""

    model_input_names = ("input_ids", "attention_mask")  # type: ignore[assignment]  (no segments in this family)
    kind: ClassVar[str]
    classes: ClassVar[set[str]]  # tokenizer_class names in tokenizer_config.json that are this pipeline
    default_prefix_space: ClassVar[bool]
    model_type: ClassVar[str]  # the spec "type" of tokenizer.json's model
    transformers_class: ClassVar[str]  # the tokenizer_class written on saving
    _keeps_normalizer: ClassVar[bool] = False  # whether tokenizer.json's normaliser is part of the model
    needs_prefix_space_for_words: ClassVar[bool] = False  # pre-split words need add_prefix_space (BPE)

    def __init__(self, backend: Backend, settings: dict[str, Any]) -> None:
        super().__init__(backend, lowercase=False, strip_accents=None, model_max_length=settings["model_max_length"],
                         chinese_chars=False, specials=settings["specials"])
        self.settings = settings

    # ----------------------------------------------------------------- loading
    @classmethod
    def from_pretrained(cls, path: str | Path) -> "SentenceTokenizer":
        """A directory holding tokenizer.json (or this kind's own vocabulary files), read as transformers reads it."""
        path = Path(path)
        if not path.is_dir():
            raise TokenizerError(f"{path}: no such tokenizer directory")
        settings = read_sentence_settings(path, cls.classes, cls.default_prefix_space)
        json_file = path / "tokenizer.json"
        added: list[dict[str, Any]] = []
        if json_file.is_file():
            spec = read_json_object(json_file, TokenizerError)
            model = spec.get("model") or {}
            if model.get("type") != cls.model_type:
                raise TokenizerError(f"{json_file}: model type {model.get('type')!r} is not {cls.model_type}, "
                                     f"which a {cls.kind} tokenizer needs")
            backend = cls._backend_from_spec(model, json_file)
            added = spec.get("added_tokens") or []
            if spec.get("normalizer") and not cls._keeps_normalizer:
                log.warning("%s: its normalizer is dropped, as transformers builds this tokenizer without one", json_file)
            normalizer_spec = spec.get("normalizer")
        else:
            backend, normalizer_spec = cls._backend_from_files(path), None
        return cls._assemble(backend, settings, added, normalizer_spec, path)

    @classmethod
    def _assemble(cls, backend: Backend, settings: dict[str, Any], added: list[dict[str, Any]],
                  normalizer_spec: dict | None, source: Path) -> "SentenceTokenizer":
        specials = settings["specials"]
        missing = [f"{specials[r]!r} ({r})" for r in ("pad_token", "cls_token", "sep_token")
                   if backend.token_to_id(specials[r]) is None]
        if missing:
            raise TokenizerError(f"{source}: vocabulary lacks the special token(s) {', '.join(missing)}")
        cls._pipeline(backend, settings, normalizer_spec)
        # Added tokens as tokenizer.json declares them (flags included); the special tokens in any case.
        declared = {t.get("content") for t in added}
        for token in added:
            if not isinstance(token.get("content"), str):
                raise TokenizerError(f"{source}: an added token has no 'content': {token!r}")
            flags = {k: bool(token.get(k, False)) for k in ("single_word", "lstrip", "rstrip")}
            new = AddedToken(token["content"], normalized=bool(token.get("normalized", not token.get("special"))),
                             special=bool(token.get("special", False)), **flags)
            (backend.add_special_tokens if token.get("special") else backend.add_tokens)([new])
        present = [t for t in dict.fromkeys(specials.values()) if t not in declared and backend.token_to_id(t) is not None]
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in present])
        return cls(backend, settings)

    @classmethod
    def _trained(cls, backend: Backend, trainer: Any, files: Iterable[str | Path] | None,
                 texts: Iterable[str] | None) -> "SentenceTokenizer":
        """Train `backend` on the files (UTF-8, .gz allowed) and texts, then assemble it with transformers' defaults."""
        def stream() -> Iterator[str]:
            for file in files or []:
                yield from _read_lines(Path(file))
            if texts is not None:
                yield from texts

        backend.train_from_iterator(stream(), trainer)
        settings = {"specials": {r: SENTENCE_SPECIALS[r] for r in SPECIAL_ROLES}, "model_max_length": 512,
                    "add_prefix_space": cls.default_prefix_space, "trim_offsets": True, "clean_up_spaces": False}
        return cls._assemble(backend, settings, [], None, Path("<trained>"))

    # ----------------------------------------------------------------- saving
    def save(self, path: str | Path) -> None:
        """Write tokenizer.json and tokenizer_config.json (plus the kind's own vocabulary files)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(path / "tokenizer.json"))
        specials = {**{r: self.specials[r] for r in self.specials},
                    "bos_token": self.specials["cls_token"], "eos_token": self.specials["sep_token"]}
        config = {"tokenizer_class": self.transformers_class, "model_max_length": self.model_max_length,
                  "add_prefix_space": self.settings["add_prefix_space"],
                  "clean_up_tokenization_spaces": self.settings["clean_up_spaces"], **specials,
                  **self._config_extra()}
        (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        (path / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n", encoding="utf-8")
        self._save_vocabulary(path)

    def _config_extra(self) -> dict[str, Any]:
        return {}

    def _save_vocabulary(self, path: Path) -> None:
        pass

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        text = super().decode(ids, skip_special_tokens=skip_special_tokens)
        if self.settings["clean_up_spaces"]:
            for before, after in _CLEAN_UP:
                text = text.replace(before, after)
        return text

    def __call__(self, text: Any, text_pair: Any = None, **kwargs: Any):
        if kwargs.get("is_split_into_words") and self.needs_prefix_space_for_words and \
                not self.settings["add_prefix_space"]:
            # As transformers: each word would otherwise be encoded as if it began the text, not as a word
            # after a space, which is how the model saw every word but the first in pretraining.
            raise TokenizerError(f"a {self.kind} tokenizer encodes pre-split words only with add_prefix_space: "
                                 "true (use tokenizer.for_words())")
        return super().__call__(text, text_pair, **kwargs)

    def for_words(self) -> "SentenceTokenizer":
        """A copy that adds the space before each pre-split word (transformers' add_prefix_space=True, which its
        token-classification examples use for RoBERTa); the same tokenizer when it already does."""
        if self.settings["add_prefix_space"]:
            return self
        settings = {**self.settings, "add_prefix_space": True}
        backend = Backend.from_str(self.backend.to_str())
        self._pipeline(backend, settings, json.loads(self.backend.to_str()).get("normalizer"))
        return type(self)(backend, settings)

    def lowercased(self) -> "Tokenizer":
        raise TokenizerError(f"a {self.kind} tokenizer has no lower-casing setting (sentence-transformers' "
                             "do_lower_case) in bertforge yet")

    # ----------------------------------------------------------------- the kind's own parts
    @classmethod
    def _backend_from_spec(cls, model: dict[str, Any], source: Path) -> Backend:
        raise NotImplementedError

    @classmethod
    def _backend_from_files(cls, path: Path) -> Backend:
        raise NotImplementedError

    @classmethod
    def _pipeline(cls, backend: Backend, settings: dict[str, Any], normalizer_spec: dict | None) -> None:
        raise NotImplementedError


class ByteLevelBPETokenizer(SentenceTokenizer):
    """RoBERTa's tokenizer: GPT-2's byte-level BPE (every byte has a symbol, so nothing is unknown), pairs as
    `<s> A </s></s> B </s>`, offsets trimmed of the spaces that byte-level symbols carry."""

    kind, model_type, transformers_class = "byte-level BPE", "BPE", "RobertaTokenizer"
    classes = {"RobertaTokenizer", "RobertaTokenizerFast"}
    default_prefix_space = False
    needs_prefix_space_for_words = True

    @classmethod
    def _backend_from_spec(cls, model: dict[str, Any], source: Path) -> Backend:
        vocab, merges = model.get("vocab"), model.get("merges")
        if not isinstance(vocab, dict) or not isinstance(merges, list):
            raise TokenizerError(f"{source}: a BPE model needs 'vocab' (token -> id) and 'merges'")
        pairs = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]
        return cls._bpe(vocab, pairs)

    @classmethod
    def _backend_from_files(cls, path: Path) -> Backend:
        vocab_file, merges_file = path / "vocab.json", path / "merges.txt"
        if not (vocab_file.is_file() and merges_file.is_file()):
            raise TokenizerError(f"{path}: no tokenizer.json, nor vocab.json with merges.txt")
        vocab = read_json_object(vocab_file, TokenizerError)
        lines = merges_file.read_text(encoding="utf-8").splitlines()
        pairs = [tuple(line.split(" ", 1)) for line in lines if line and not line.startswith("#version")]
        bad = next((i for i, p in enumerate(pairs) if len(p) != 2), None)
        if bad is not None:
            raise TokenizerError(f"{merges_file}: a merge is two tokens separated by a space")
        return cls._bpe(vocab, pairs)

    @staticmethod
    def _bpe(vocab: dict[str, int], merges: list[tuple[str, str]]) -> Backend:
        # transformers' RobertaTokenizer builds exactly this model: no unknown token, no dropout, no affixes.
        return Backend(models.BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                                  end_of_word_suffix="", fuse_unk=False))

    @classmethod
    def _pipeline(cls, backend: Backend, settings: dict[str, Any], normalizer_spec: dict | None) -> None:
        backend.normalizer = None
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=settings["add_prefix_space"])
        backend.decoder = decoders.ByteLevel()
        specials = settings["specials"]
        sep, cls_token = specials["sep_token"], specials["cls_token"]
        backend.post_processor = processors.RobertaProcessing(
            (sep, backend.token_to_id(sep)), (cls_token, backend.token_to_id(cls_token)),
            trim_offsets=settings["trim_offsets"], add_prefix_space=settings["add_prefix_space"])

    def _config_extra(self) -> dict[str, Any]:
        return {"trim_offsets": self.settings["trim_offsets"], "errors": "replace"}

    def _save_vocabulary(self, path: Path) -> None:
        self.backend.model.save(str(path))  # vocab.json and merges.txt, for tools that read those

    @classmethod
    def train(cls, files: Iterable[str | Path] | None = None, vocab_size: int = 50265, min_frequency: int = 2,
              texts: Iterable[str] | None = None, show_progress: bool = False) -> "ByteLevelBPETokenizer":
        """Train a byte-level BPE vocabulary (`<s>`=0 `<pad>`=1 `</s>`=2 `<unk>`=3 `<mask>`=4, as RoBERTa's)."""
        backend = cls._bpe({}, [])
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=TRAINED_SPECIALS,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=show_progress)
        return cls._trained(backend, trainer, files, texts)


class UnigramTokenizer(SentenceTokenizer):
    """XLM-RoBERTa's tokenizer: a SentencePiece Unigram model with its normaliser, words marked with `▁`,
    pairs as `<s> A </s></s> B </s>`."""

    kind, model_type, transformers_class = "SentencePiece Unigram", "Unigram", "XLMRobertaTokenizer"
    classes = {"XLMRobertaTokenizer", "XLMRobertaTokenizerFast"}
    default_prefix_space = True
    _keeps_normalizer = True  # the SentencePiece normaliser (precompiled charsmap) is part of the model

    @classmethod
    def _backend_from_spec(cls, model: dict[str, Any], source: Path) -> Backend:
        vocab = model.get("vocab")
        if not isinstance(vocab, list) or not all(isinstance(v, list) and len(v) == 2 for v in vocab):
            raise TokenizerError(f"{source}: a Unigram model needs 'vocab' as [piece, score] pairs")
        return cls._unigram([(str(p), float(s)) for p, s in vocab])

    @classmethod
    def _backend_from_files(cls, path: Path) -> Backend:
        raise TokenizerError(f"{path}: no tokenizer.json; bertforge reads a SentencePiece Unigram tokenizer from "
                             "its tokenizer.json (transformers writes one on save_pretrained)")

    @classmethod
    def train(cls, *args: Any, **kwargs: Any) -> "UnigramTokenizer":
        """Refused: the `tokenizers` library's Unigram trainer gives a different vocabulary on each run of the
        same text (its seed pieces come out of a hash map in random order), and bertforge's runs are
        reproducible bit for bit. Train with sentencepiece and save with transformers' XLMRobertaTokenizer."""
        raise TokenizerError("training a Unigram vocabulary is not built: the tokenizers library's Unigram trainer "
                             "is not reproducible run to run; train one with sentencepiece and save it with "
                             "transformers' XLMRobertaTokenizer, which bertforge reads")

    @staticmethod
    def _unigram(vocab: list[tuple[str, float]]) -> Backend:
        # transformers' XLMRobertaTokenizer fixes the unknown id at 3 (fairseq's <unk>).
        return Backend(models.Unigram(vocab, unk_id=3, byte_fallback=False))

    @classmethod
    def _pipeline(cls, backend: Backend, settings: dict[str, Any], normalizer_spec: dict | None) -> None:
        # transformers keeps SentencePiece's precompiled normaliser and nothing else of tokenizer.json's.
        charsmap = _precompiled_charsmap(normalizer_spec)
        from tokenizers import normalizers

        backend.normalizer = normalizers.Precompiled(charsmap) if charsmap is not None else None
        scheme = "always" if settings["add_prefix_space"] else "never"
        backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                         pre_tokenizers.Metaspace(replacement="▁",
                                                                                  prepend_scheme=scheme)])
        backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme)
        specials = settings["specials"]
        bos, eos = specials["cls_token"], specials["sep_token"]
        backend.post_processor = processors.TemplateProcessing(
            single=[bos, "$A", eos], pair=[bos, "$A", eos, eos, "$B", eos],
            special_tokens=[(bos, backend.token_to_id(bos)), (eos, backend.token_to_id(eos))])


def _precompiled_charsmap(spec: dict | None) -> str | None:
    """The SentencePiece charsmap of a tokenizer.json normaliser, alone or inside a Sequence."""
    if not spec:
        return None
    if spec.get("type") == "Precompiled":
        return spec.get("precompiled_charsmap")
    for inner in spec.get("normalizers") or []:
        found = _precompiled_charsmap(inner)
        if found is not None:
            return found
    return None
