"""What the `<s> A </s></s> B </s>` tokenizer kinds share (RoBERTa's byte-level BPE, `bpe.py`; SentencePiece
Unigram, `unigram.py`): built the way transformers builds them, the vocabulary (and, for BPE, the merges) from the
directory's files, the rest of the pipeline from tokenizer_config.json's settings (`settings.py`), and the added
tokens, with their lstrip/rstrip flags, from tokenizer.json; training, saving and decoding. The call signature,
padding, truncation, offsets and tensors are every kind's (`base.py`). Neither sends token_type_ids by default, as
in transformers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from tokenizers import AddedToken
from tokenizers import Tokenizer as Backend

from ..errors import TokenizerError
from ..jsonfile import read_json_object
from ..safefiles import atomic_write, write_text
from .settings import SENTENCE_SPECIALS, read_sentence_settings
from .base import Tokenizer
from .files import SPECIAL_ROLES, read_lines

log = logging.getLogger("bertforge")

# A new vocabulary's first ids, as fairseq (and so RoBERTa and XLM-R) number them.
TRAINED_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


class SubwordTokenizer(Tokenizer):
    """What the BPE and Unigram tokenizers share: settings, added tokens, training, saving and decoding."""

    model_input_names = ("input_ids", "attention_mask")  # type: ignore[assignment]  (no segments in this family)
    kind: ClassVar[str]
    classes: ClassVar[set[str]]  # tokenizer_class names in tokenizer_config.json that are this pipeline
    default_prefix_space: ClassVar[bool]
    model_type: ClassVar[str]  # the spec "type" of tokenizer.json's model
    transformers_class: ClassVar[str]  # the tokenizer_class written on saving
    _keeps_normalizer: ClassVar[bool] = False  # whether tokenizer.json's normaliser is part of the model
    needs_prefix_space_for_words: ClassVar[bool] = False  # pre-split words need add_prefix_space (BPE)
    default_specials: ClassVar[dict[str, str]] = SENTENCE_SPECIALS  # the special tokens transformers defaults
    flags: ClassVar[dict[str, bool]] = {}  # the pipeline's own true/false settings in tokenizer_config.json
    unused: ClassVar[tuple[str, ...]] = ()  # special tokens the pipeline has besides the roles' (CamemBERT's)

    def __init__(self, backend: Backend, settings: dict[str, Any]) -> None:
        super().__init__(backend, model_max_length=settings["model_max_length"], specials=settings["specials"],
                         extra_specials=[t for t in self.unused if backend.token_to_id(t) is not None])
        self.settings = settings

    # ----------------------------------------------------------------- loading
    @classmethod
    def from_pretrained(cls, path: str | Path) -> "SubwordTokenizer":
        """A directory holding tokenizer.json (or this kind's own vocabulary files), read as transformers reads it."""
        path = Path(path)
        if not path.is_dir():
            raise TokenizerError(f"{path}: no such tokenizer directory")
        settings = read_sentence_settings(path, cls.classes, cls.default_prefix_space, cls.default_specials, cls.flags,
                                          cls.unused)
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
                  normalizer_spec: dict | None, source: Path) -> "SubwordTokenizer":
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

    @staticmethod
    def _stream(files: Iterable[str | Path] | None, texts: Iterable[str] | None) -> Iterator[str]:
        """The lines of the files (UTF-8, .gz allowed), then the texts."""
        for file in files or []:
            yield from read_lines(Path(file))
        if texts is not None:
            yield from texts

    @classmethod
    def _trained(cls, backend: Backend, trainer: Any, files: Iterable[str | Path] | None,
                 texts: Iterable[str] | None) -> "SubwordTokenizer":
        """Train `backend` on the files and texts, then assemble it with transformers' defaults."""
        backend.train_from_iterator(cls._stream(files, texts), trainer)
        # The trainer leaves a model with its own settings (no affixes: None where a loaded one has ""): rebuild it as
        # loading would, so the tokenizer saved and read back is the same, byte for byte (shards check this).
        return cls._new(cls._backend_from_spec(json.loads(backend.to_str())["model"], Path("<trained>")), None)

    @classmethod
    def _new(cls, backend: Backend, normalizer_spec: dict | None) -> "SubwordTokenizer":
        """A newly trained vocabulary, assembled with transformers' default settings for this pipeline."""
        settings = {"specials": {r: cls.default_specials[r] for r in SPECIAL_ROLES}, "model_max_length": 512,
                    "add_prefix_space": cls.default_prefix_space, "trim_offsets": True, "clean_up_spaces": False,
                    **cls.flags}
        return cls._assemble(backend, settings, [], normalizer_spec, Path("<trained>"))

    # ----------------------------------------------------------------- saving
    def save(self, path: str | Path) -> None:
        """Write tokenizer.json and tokenizer_config.json (plus the kind's own vocabulary files)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        atomic_write(path / "tokenizer.json", lambda tmp: self.backend.save(tmp))
        specials = {**{r: self.specials[r] for r in self.specials},
                    "bos_token": self.specials["cls_token"], "eos_token": self.specials["sep_token"]}
        config = {"tokenizer_class": self.transformers_class, "model_max_length": self.model_max_length,
                  "add_prefix_space": self.settings["add_prefix_space"],
                  "clean_up_tokenization_spaces": self.settings["clean_up_spaces"], **specials,
                  **self._config_extra()}
        write_text(path / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")
        write_text(path / "special_tokens_map.json", json.dumps(specials, indent=2) + "\n")
        self._save_vocabulary(path)

    def _config_extra(self) -> dict[str, Any]:
        return {key: self.settings[key] for key in self.flags}

    def _save_vocabulary(self, path: Path) -> None:
        pass

    saved_files = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

    @property
    def clean_up_spaces(self) -> bool:  # tokenizer_config.json's clean_up_tokenization_spaces
        return self.settings["clean_up_spaces"]

    has_sentence_ends = True  # <s> and </s> are also its bos and eos tokens

    def __call__(self, text: Any, text_pair: Any = None, **kwargs: Any):
        if kwargs.get("is_split_into_words") and self.needs_prefix_space_for_words and \
                not self.settings["add_prefix_space"]:
            # As transformers: each word would otherwise be encoded as if it began the text, not as a word
            # after a space, which is how the model saw every word but the first in pretraining.
            raise TokenizerError(f"a {self.kind} tokenizer encodes pre-split words only with add_prefix_space: "
                                 "true (use tokenizer.for_words())")
        return super().__call__(text, text_pair, **kwargs)

    def for_words(self) -> "SubwordTokenizer":
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


