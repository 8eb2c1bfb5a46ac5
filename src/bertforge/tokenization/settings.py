"""tokenizer_config.json for the `<s> A </s></s> B </s>` tokenizers (RoBERTa's byte-level BPE, XLM-R's Unigram).

transformers builds these tokenizers from their vocabulary plus a few settings of
tokenizer_config.json, whatever pipeline tokenizer.json carries; the added tokens (with their
lstrip/rstrip flags) come from tokenizer.json. Every key is honoured, known to change no output,
or refused by name, as for BERT's WordPiece (`wordpiece.py`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..errors import TokenizerError
from .files import NO_EFFECT_KEYS, SPECIAL_ROLES, read_max_length, read_special_tokens

log = logging.getLogger("bertforge")

# Their special tokens, as transformers' RobertaTokenizer and XLMRobertaTokenizer default them.
SENTENCE_SPECIALS = {"pad_token": "<pad>", "unk_token": "<unk>", "cls_token": "<s>", "sep_token": "</s>",
                     "mask_token": "<mask>", "bos_token": "<s>", "eos_token": "</s>"}


# DeBERTa-v2/v3's, as transformers' DebertaV2Tokenizer defaults them: BERT's names.
DEBERTA_SPECIALS = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                    "mask_token": "[MASK]", "bos_token": "[CLS]", "eos_token": "[SEP]"}

# ALBERT's, as transformers' AlbertTokenizer defaults them: BERT's bracketed names around SentencePiece's own.
ALBERT_SPECIALS = {"pad_token": "<pad>", "unk_token": "<unk>", "cls_token": "[CLS]", "sep_token": "[SEP]",
                   "mask_token": "[MASK]", "bos_token": "[CLS]", "eos_token": "[SEP]"}


def read_sentence_settings(path: Path, classes: set[str], default_prefix_space: bool,
                           defaults: dict[str, str] = SENTENCE_SPECIALS,
                           flags: dict[str, bool] | None = None, unused: tuple[str, ...] = ()) -> dict[str, Any]:
    """{specials, model_max_length, add_prefix_space, trim_offsets, clean_up_spaces, *flags} of a checkpoint directory.

    classes: the tokenizer_class names that are this pipeline; default_prefix_space: transformers' default
    of add_prefix_space for it (RoBERTa False, XLM-R True); defaults: its special tokens; flags: the
    pipeline's own true/false settings with their defaults (ALBERT's do_lower_case, keep_accents); unused: special
    tokens the pipeline always has besides the roles' (CamemBERT's NOTUSED pieces), which files may list.
    """
    flags = flags or {}
    config_file, config, _, specials = read_special_tokens(path, defaults)

    def flag(key: str, default: bool) -> bool:
        value = config.get(key, default)
        if not isinstance(value, bool):
            raise TokenizerError(f"{config_file}: key '{key}' must be true or false, got {value!r}")
        return value

    def refuse_unless(key: str, ok, why: str) -> None:
        if key in config and not ok(config[key]):
            raise TokenizerError(f"{config_file}: key '{key}' = {config[key]!r} is not supported: {why}")

    refuse_unless("tokenizer_class", lambda v: v in classes, f"this directory's tokenizer is one of {sorted(classes)}")
    refuse_unless("errors", lambda v: v == "replace", "bytes that are not UTF-8 decode to U+FFFD ('replace')")
    refuse_unless("padding_side", lambda v: v == "right", "bertforge pads on the right")
    refuse_unless("truncation_side", lambda v: v == "right", "bertforge truncates on the right")
    refuse_unless("split_special_tokens", lambda v: v is False, "special tokens typed in the text are kept whole")
    own = set(specials.values()) | set(unused)
    for key in ("additional_special_tokens", "extra_special_tokens"):
        # transformers 5 lists the tokenizer's own special tokens here on saving (DeBERTa's): those add nothing.
        refuse_unless(key, lambda v: not v or (isinstance(v, list) and set(v) <= own),
                      "extra special tokens are not supported for this tokenizer yet")
    known = {"model_max_length", "max_len", "tokenizer_class", "errors", "padding_side", "truncation_side",
             "split_special_tokens", "add_prefix_space", "trim_offsets", "clean_up_tokenization_spaces",
             *SENTENCE_SPECIALS, *flags, *NO_EFFECT_KEYS,
             "unk_id"}  # DeBERTa's: the unknown piece's id, which tokenizer.json's model carries and is read from
    unknown = sorted(k for k in config if k not in known)
    if unknown:
        log.warning("%s: keys %s are not settings of this tokenizer; transformers ignores them and so does bertforge",
                    config_file, ", ".join(unknown))
    return {"specials": {r: specials[r] for r in SPECIAL_ROLES}, "model_max_length": read_max_length(config, config_file),
            "add_prefix_space": flag("add_prefix_space", default_prefix_space),
            "trim_offsets": flag("trim_offsets", True),
            "clean_up_spaces": flag("clean_up_tokenization_spaces", False),
            **{key: flag(key, default) for key, default in flags.items()}}
