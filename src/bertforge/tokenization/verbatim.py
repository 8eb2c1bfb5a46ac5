"""A tokenizer.json used as it is: transformers' `PreTrainedTokenizerFast` (ModernBERT's tokenizer).

The other pipelines here rebuild tokenizer.json's normaliser, pre-tokenizer and post-processor from
tokenizer_config.json's settings, as transformers' model-specific classes do. A directory whose
tokenizer_config.json names `PreTrainedTokenizerFast` (transformers 5: `TokenizersBackend`) is read
the other way round, as transformers reads it: tokenizer.json's whole pipeline is the tokenizer, and
tokenizer_config.json gives only the special tokens, the longest input, `model_input_names` (whether
token_type_ids are returned) and the decode clean-up. Settings that would have transformers change the
pipeline (`add_bos_token`, `add_eos_token`) are refused by name; a `truncation` or `padding` stored in
tokenizer.json is overridden by each call, in transformers as here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

from tokenizers import (
    AddedToken,
    decoders,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from tokenizers import Tokenizer as Backend

from ..errors import TokenizerError
from ..jsonfile import read_json_object
from ..safefiles import write_text
from .bpe import ByteLevelBPETokenizer
from .settings import read_sentence_settings
from .files import SPECIAL_ROLES
from .subword import SubwordTokenizer

# ModernBERT's special tokens (BERT's names); a PreTrainedTokenizerFast has no defaults of its own.
MODERN_SPECIALS = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                   "mask_token": "[MASK]", "bos_token": "[CLS]", "eos_token": "[SEP]"}
# transformers' PreTrainedTokenizerFast sends these unless tokenizer_config.json's model_input_names says otherwise;
# token_type_ids only when it lists them.
DEFAULT_INPUTS = ("input_ids", "attention_mask")
INPUTS = ("input_ids", "token_type_ids", "attention_mask")


class VerbatimTokenizer(SubwordTokenizer):
    """tokenizer.json's pipeline as stored (its model byte-level BPE, as ModernBERT's), with the call signature,
    padding, truncation and tensors of every bertforge tokenizer."""

    kind, model_type, transformers_class = "tokenizer.json (BPE)", "BPE", "PreTrainedTokenizerFast"
    classes: ClassVar[set[str]] = {"PreTrainedTokenizerFast", "TokenizersBackend"}
    default_prefix_space = False
    default_specials = MODERN_SPECIALS
    _keeps_normalizer = True

    def __init__(self, backend: Backend, settings: dict[str, Any]) -> None:
        super().__init__(backend, settings)
        self._inputs = tuple(settings.get("model_input_names") or DEFAULT_INPUTS)

    @property
    def model_input_names(self) -> tuple[str, ...]:  # type: ignore[override]
        return self._inputs

    @classmethod
    def from_pretrained(cls, path: str | Path) -> VerbatimTokenizer:
        path = Path(path)
        if not path.is_dir():
            raise TokenizerError(f"{path}: no such tokenizer directory")
        json_file = path / "tokenizer.json"
        if not json_file.is_file():
            raise TokenizerError(f"{path}: a PreTrainedTokenizerFast directory needs its tokenizer.json")
        settings = read_sentence_settings(path, cls.classes, cls.default_prefix_space, cls.default_specials)
        config_file = path / "tokenizer_config.json"
        config = read_json_object(config_file, TokenizerError) if config_file.is_file() else {}
        for key in ("add_bos_token", "add_eos_token"):
            if key in config:
                raise TokenizerError(f"{config_file}: key '{key}' is not supported: tokenizer.json's post-processor "
                                     "decides the special tokens")
        inputs = config.get("model_input_names", list(DEFAULT_INPUTS))
        if not isinstance(inputs, list) or not set(inputs) <= set(INPUTS) or "input_ids" not in inputs:
            raise TokenizerError(f"{config_file}: key 'model_input_names' must list some of {list(INPUTS)} "
                                 f"with input_ids, got {inputs!r}")
        settings["model_input_names"] = inputs
        spec = read_json_object(json_file, TokenizerError)
        model = spec.get("model") or {}
        if model.get("type") != cls.model_type:
            raise TokenizerError(f"{json_file}: model type {model.get('type')!r} is not {cls.model_type}, which a "
                                 f"{cls.kind} tokenizer needs")
        # A stored truncation or padding (what transformers saves after a call that used them) is reset by each
        # call there, as here: every call says its own.
        spec["truncation"] = spec["padding"] = None
        # transformers 5 skips the decode clean-up for a BPE tokenizer whatever the file says (it would eat the
        # spaces before punctuation that byte-level BPE keeps).
        settings["clean_up_spaces"] = False
        try:
            backend = Backend.from_str(json.dumps(spec))
        except Exception as exc:  # noqa: BLE001  (tokenizers raises plain Exception; its message names the problem)
            raise TokenizerError(f"{json_file}: not a tokenizer the tokenizers library reads ({exc})") from None
        return cls._checked(backend, settings, path)

    @classmethod
    def _checked(cls, backend: Backend, settings: dict[str, Any], source: Path) -> VerbatimTokenizer:
        specials = settings["specials"]
        missing = [f"{specials[r]!r} ({r})" for r in ("pad_token", "cls_token", "sep_token", "mask_token")
                   if backend.token_to_id(specials[r]) is None]
        if missing:
            raise TokenizerError(f"{source}: vocabulary lacks the special token(s) {', '.join(missing)}")
        known = {t.content for t in backend.get_added_tokens_decoder().values()}
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                    for t in dict.fromkeys(specials.values())
                                    if t not in known and backend.token_to_id(t) is not None])
        return cls(backend, settings)

    def save(self, path: str | Path) -> None:
        super().save(path)
        config_file = Path(path) / "tokenizer_config.json"
        config = json.loads(config_file.read_text(encoding="utf-8"))
        config["model_input_names"] = list(self._inputs)
        write_text(config_file, json.dumps(config, indent=2) + "\n")

    def _config_extra(self) -> dict[str, Any]:
        return {}

    def for_words(self) -> VerbatimTokenizer:
        """A copy whose byte-level pre-tokenizer adds the space before each pre-split word, so words are the
        pieces pretraining saw after a space (transformers' add_prefix_space=True)."""
        spec = json.loads(self.backend.to_str())
        changed = _set_prefix_space(spec.get("pre_tokenizer"))
        if not changed:
            return self
        return type(self)(Backend.from_str(json.dumps(spec)), {**self.settings, "add_prefix_space": True})

    @classmethod
    def train(cls, files: Iterable[str | Path] | None = None, vocab_size: int = 50368, min_frequency: int = 2,
              texts: Iterable[str] | None = None, show_progress: bool = False) -> VerbatimTokenizer:
        """A ModernBERT-style vocabulary: NFC, byte-level BPE, `[CLS] A [SEP]` and `[CLS] A [SEP] B [SEP]`, the
        five bracketed specials first ([MASK] takes the space before it, as ModernBERT's)."""
        specials = [MODERN_SPECIALS[r] for r in ("unk_token", "cls_token", "sep_token", "pad_token", "mask_token")]
        backend = ByteLevelBPETokenizer._bpe({}, [])
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=show_progress)
        backend.train_from_iterator(cls._stream(files, texts), trainer)
        trained = Backend.from_str(backend.to_str())
        trained.normalizer = normalizers.NFC()
        trained.decoder = decoders.ByteLevel()
        cls_id, sep_id = trained.token_to_id("[CLS]"), trained.token_to_id("[SEP]")
        trained.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls_id),
                                                                                     ("[SEP]", sep_id)])
        trained.add_special_tokens([AddedToken(t, special=True, normalized=False, lstrip=t == "[MASK]")
                                    for t in specials])
        settings = {"specials": {r: MODERN_SPECIALS[r] for r in SPECIAL_ROLES}, "model_max_length": 8192,
                    "add_prefix_space": False, "trim_offsets": True, "clean_up_spaces": False,
                    "model_input_names": ["input_ids", "attention_mask"]}
        return cls._checked(trained, settings, Path("<trained>"))


def _set_prefix_space(spec: dict | None) -> bool:
    """Turn on add_prefix_space in a ByteLevel pre-tokenizer (alone or in a Sequence); whether one was found."""
    if not spec:
        return False
    if spec.get("type") == "ByteLevel":
        spec["add_prefix_space"] = True
        return True
    return any([_set_prefix_space(s) for s in spec.get("pretokenizers") or []])  # noqa: C419  (set every one)
