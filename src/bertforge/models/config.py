"""Model configuration: `BertConfig` with Hugging Face field names, and the named size presets.

The field names are those of `transformers.BertConfig`, so a `config.json` written
by either library is read by the other unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..errors import ConfigError
from ..jsonfile import read_json_object
from ..safefiles import write_text

# `hidden_act` names transformers accepts, each mapped to the function bertforge computes for it.
# Only names whose function is the same as transformers' are listed (tests/test_config_fields.py
# checks every one against transformers' ACT2FN); any other name is refused.
HIDDEN_ACT: dict[str, str] = {
    "gelu": "gelu", "gelu_python": "gelu",  # BERT's exact erf GELU
    # the tanh approximation some published checkpoints were trained with, under its several names
    "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
    "gelu_accurate": "gelu_tanh", "gelu_python_tanh": "gelu_tanh",
    "relu": "relu", "silu": "silu", "swish": "silu", "tanh": "tanh", "sigmoid": "sigmoid", "mish": "mish",
    "relu6": "relu6", "leaky_relu": "leaky_relu", "hardswish": "hardswish", "linear": "identity",
}
ACTIVATIONS = tuple(HIDDEN_ACT)

# config.json keys that are not fields of `BertConfig`, and what bertforge does with each.
# Refused unless they hold the one value bertforge implements (the value transformers writes by default):
REFUSED_UNLESS: dict[str, tuple[Any, str]] = {
    "is_decoder": (False, "a causal (decoder) mask is not implemented; bertforge's BERT is an encoder"),
    "add_cross_attention": (False, "cross-attention layers are not implemented"),
    "is_encoder_decoder": (False, "encoder-decoder models are not implemented"),
    "tie_encoder_decoder": (False, "encoder-decoder models are not implemented"),
    "position_embedding_type": ("absolute", "only learned absolute position embeddings are implemented "
                                            "(relative_key and relative_key_query are not)"),
    "pruned_heads": ({}, "checkpoints with pruned attention heads are not supported"),
}
# Keys that change no number bertforge computes, here or in transformers, kept verbatim on saving:
NO_EFFECT: dict[str, str] = {
    "use_cache": "only decoders cache keys and values",
    "chunk_size_feed_forward": "running the feed-forward in chunks along the sequence gives the same numbers",
    "output_attentions": "chooses outputs; pass output_attentions=True to forward",
    "output_hidden_states": "chooses outputs; pass output_hidden_states=True to forward",
    "return_dict": "a Python API choice of transformers",
    "torchscript": "a tracing option of transformers",
    "gradient_checkpointing": "a training-memory option of older transformers",
    "bos_token_id": "an encoder has no generation tokens", "eos_token_id": "an encoder has no generation tokens",
    "sep_token_id": "the tokenizer decides the [SEP] id", "decoder_start_token_id": "an encoder generates nothing",
    "finetuning_task": "a label for people", "task_specific_params": "used by transformers' generation pipelines",
    "prefix": "used by transformers' generation pipelines", "tokenizer_class": "read from tokenizer_config.json",
    "use_bfloat16": "a TensorFlow-era flag; weights are computed in float32",
    "dtype": "weights are read at their stored precision and computed in float32 (transformers without dtype='auto')",
    "torch_dtype": "as dtype", "transformers_version": "describes the file", "_name_or_path": "describes the file",
    "architectures": "chooses the head class to load (see `bertforge inspect`)", "model_type": "chooses the family (models/registry.py)",
    "_attn_implementation_autoset": "a transformers loading detail", "output_past": "only decoders cache",
    "_attn_implementation": "a transformers loading detail", "_commit_hash": "describes the file",
    "tf_legacy_loss": "a TensorFlow loss option of transformers",
    "cross_attention_hidden_size": "used only with add_cross_attention, which is refused",
}
# Generation settings that older transformers wrote into every config.json: an encoder generates nothing.
GENERATION_KEYS = ("max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
                   "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
                   "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
                   "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
                   "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
                   "suppress_tokens", "begin_suppress_tokens")
NO_EFFECT.update({key: "a generation setting; an encoder generates nothing" for key in GENERATION_KEYS})

# (layers, hidden) for the Turc et al. compact models and the paper's two sizes.
# Heads are hidden/64 and the feed-forward width is 4*hidden, as in every one of them.
PRESETS: dict[str, tuple[int, int]] = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
    "large": (24, 1024),
}

# Keys of a config.json that describe the file rather than the model; we neither need
# nor keep them when reading, and write our own on saving.
_FILE_KEYS = {"architectures", "model_type", "transformers_version", "_name_or_path", "dtype", "torch_dtype",
              "position_embedding_type"}  # the last is checked on reading and always written

log = logging.getLogger("bertforge")


@dataclass
class BertConfig:
    """Hyper-parameters of a BERT encoder and its heads (Hugging Face field names)."""

    # The config.json `model_type` this class reads and writes (a family's config class sets its own).
    model_type: ClassVar[str] = "bert"
    # Whether the family has segment (token type) embeddings; DistilBERT has none (type_vocab_size 0).
    segments: ClassVar[bool] = True
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    # False gives the masked-LM decoder its own matrix instead of sharing the word embeddings.
    tie_word_embeddings: bool = True
    # Head settings, as transformers names them.
    classifier_dropout: float | None = None
    num_labels: int = 2
    id2label: dict[int, str] | None = None
    label2id: dict[str, int] | None = None
    problem_type: str | None = None  # regression | single_label_classification | multi_label_classification
    # Anything else found in a config.json, kept so that saving round-trips it.
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    # config.json keys of this family's transformers config that change no number bertforge computes.
    family_no_effect: ClassVar[dict[str, str]] = {}

    def check_sizes(self, *names: str) -> None:
        """Refuse any of the named fields that is not a positive integer (type_vocab_size may be 0 without segments)."""
        for name in names:
            value = getattr(self, name)
            least = 0 if name == "type_vocab_size" and not self.segments else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ConfigError(f"config key '{name}' must be a positive integer, got {value!r}")

    def __post_init__(self) -> None:
        self.check_sizes("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                         "intermediate_size", "max_position_embeddings", "type_vocab_size", "num_labels")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"config key 'hidden_size' ({self.hidden_size}) must be divisible by "
                f"'num_attention_heads' ({self.num_attention_heads})"
            )
        if not isinstance(self.hidden_act, str) or self.hidden_act not in HIDDEN_ACT:
            raise ConfigError(f"config key 'hidden_act' is {self.hidden_act!r}; supported: {', '.join(ACTIVATIONS)}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout",
                     "initializer_range", "layer_norm_eps"):
            value = getattr(self, name)
            if value is None and name == "classifier_dropout":
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ConfigError(f"config key '{name}' must be a number, got {value!r}")
            if name.endswith(("dropout_prob", "dropout")) and not 0.0 <= value < 1.0:
                raise ConfigError(f"config key '{name}' must be in [0, 1), got {value!r}")
            if name in ("initializer_range", "layer_norm_eps") and not value > 0:
                raise ConfigError(f"config key '{name}' must be positive, got {value!r}")
        if not isinstance(self.tie_word_embeddings, bool):
            raise ConfigError(f"config key 'tie_word_embeddings' must be true or false, got {self.tie_word_embeddings!r}")
        if self.pad_token_id is not None and (not isinstance(self.pad_token_id, int)
                                              or not 0 <= self.pad_token_id < self.vocab_size):
            raise ConfigError(f"config key 'pad_token_id' ({self.pad_token_id!r}) is outside the vocabulary")
        if self.id2label is not None:
            try:
                self.id2label = {int(k): str(v) for k, v in dict(self.id2label).items()}
            except (TypeError, ValueError):
                raise ConfigError("config key 'id2label' must map integer ids to label names") from None
            if sorted(self.id2label) != list(range(len(self.id2label))):
                raise ConfigError("config key 'id2label' must map the ids 0..n-1 to names")
            self.num_labels = len(self.id2label)
            inverse = {v: k for k, v in self.id2label.items()}
            if len(inverse) != len(self.id2label):
                raise ConfigError("config key 'id2label' gives two ids the same name")
            if self.label2id is None:
                self.label2id = inverse
            elif not isinstance(self.label2id, dict) or {str(k): v for k, v in self.label2id.items()} != inverse:
                raise ConfigError(f"config keys 'label2id' {self.label2id} and 'id2label' {self.id2label} disagree; "
                                  "make label2id the inverse of id2label")
        elif self.num_labels >= 1:  # transformers' names for unnamed classes, so every head's labels have a name
            self.id2label = {i: f"LABEL_{i}" for i in range(self.num_labels)}
            if self.label2id is None:
                self.label2id = {v: k for k, v in self.id2label.items()}
        if self.label2id is not None and not isinstance(self.label2id, dict):
            raise ConfigError(f"config key 'label2id' must map label names to ids, got {self.label2id!r}")
        if self.problem_type not in (None, "regression", "single_label_classification", "multi_label_classification"):
            raise ConfigError(f"config key 'problem_type' has unknown value {self.problem_type!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def embedding_width(self) -> int:
        """The width of the token, position and segment embeddings: the hidden size, unless the family
        factorises them (ALBERT's and ELECTRA's `embedding_size`, projected up to the hidden size)."""
        return self.hidden_size

    @property
    def position_offset(self) -> int:
        """The position id of a row's first token: 0 for BERT (RoBERTa counts from after its padding id)."""
        return 0

    @property
    def label_names(self) -> list[str]:
        """Each class's name, by index: `id2label`, else transformers' `LABEL_i`."""
        return [self.id2label[i] if self.id2label else f"LABEL_{i}" for i in range(self.num_labels)]

    @property
    def max_sequence_length(self) -> int:
        """The longest row the position table allows: what tokenizers truncate to and servers accept."""
        return self.max_position_embeddings - self.position_offset

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "BertConfig":
        """A preset size (`tiny` … `large`), or any `L<layers>-H<hidden>` such as `L6-H384`."""
        key = name.lower()
        if key in PRESETS:
            layers, hidden = PRESETS[key]
        else:
            try:
                l_part, h_part = key.split("-")
                assert l_part[0] == "l" and h_part[0] == "h"
                layers, hidden = int(l_part[1:]), int(h_part[1:])
            except (ValueError, AssertionError, IndexError):
                raise ConfigError(
                    f"{name}: no such checkpoint directory, and not a model preset ({', '.join(PRESETS)} or "
                    "L<layers>-H<hidden>)") from None
        if hidden % 64:
            raise ConfigError(f"preset {name!r}: hidden size {hidden} must be a multiple of 64 (heads are 64 wide)")
        base = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=hidden // 64,
                    intermediate_size=4 * hidden)
        base.update(overrides)
        return cls(**base)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "BertConfig":
        """Build from a Hugging Face style dict; unknown keys are kept in `extra`."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a JSON object")
        model_type = data.get("model_type", cls.model_type)
        if model_type != cls.model_type:
            raise ConfigError(f"{source}: model_type is {model_type!r}, but {cls.__name__} reads "
                              f"{cls.model_type!r} checkpoints")
        for key, (supported, why) in REFUSED_UNLESS.items():
            value = data.get(key, supported)
            if value != supported:
                raise ConfigError(f"{source}: key '{key}' is {value!r}, which bertforge cannot honour: {why}")
        if "num_labels" in data and isinstance(data.get("id2label"), dict) and data["num_labels"] != len(data["id2label"]):
            raise ConfigError(f"{source}: key 'num_labels' is {data['num_labels']!r} but 'id2label' names "
                              f"{len(data['id2label'])} labels")
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in data.items() if k in names}
        extra = {k: v for k, v in data.items() if k not in names and k not in _FILE_KEYS}
        unknown = sorted(k for k in extra if k not in NO_EFFECT and k not in REFUSED_UNLESS
                         and k not in cls.family_no_effect)
        if unknown:
            log.warning("%s: keys %s are not BertConfig settings; they are kept when saving but change nothing, "
                        "as in transformers", source, ", ".join(unknown))
        try:
            return cls(**known, extra=extra)
        except TypeError as exc:  # a value of the wrong type for a field
            raise ConfigError(f"{source}: {exc}") from None
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None

    @classmethod
    def from_json(cls, path: str | Path) -> "BertConfig":
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path}: no such file")
        return cls.from_dict(read_json_object(path, ConfigError), source=str(path))

    def to_dict(self) -> dict[str, Any]:
        """The Hugging Face `config.json` fields (without `architectures`, which the model adds)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("extra", "num_labels")}
        id2label = self.id2label or {i: f"LABEL_{i}" for i in range(self.num_labels)}
        out["id2label"] = {str(k): v for k, v in id2label.items()}
        out["label2id"] = self.label2id or {v: k for k, v in id2label.items()}
        if out["problem_type"] is None:
            del out["problem_type"]
        out["position_embedding_type"] = "absolute"
        out.update(self.extra)
        out["model_type"] = self.model_type
        return out

    def save(self, path: str | Path, architectures: list[str] | None = None) -> None:
        data = self.to_dict()
        if architectures:
            data["architectures"] = architectures
        write_text(path, json.dumps(dict(sorted(data.items())), indent=2) + "\n")


def default_rope(entry: dict[str, Any], default: float, where: str) -> dict[str, Any]:
    """One rotary setting (`rope_parameters`, or one layer kind's), with transformers' default base filled in:
    {"rope_type": "default", "rope_theta": float}. Any other rotary variant (linear, dynamic, yarn, ...) or a base
    that is not positive is refused, `where` naming the key (e.g. "config key 'rope_parameters' gives ")."""
    entry = {"rope_type": "default", "rope_theta": default, **entry}
    if entry["rope_type"] != "default" or set(entry) - {"rope_type", "rope_theta"}:
        raise ConfigError(f"{where}{entry!r}; bertforge computes the default rotary embedding only (rope_type "
                          "'default', rope_theta), without scaling")
    theta = entry["rope_theta"]
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 0:
        raise ConfigError(f"{where}rope_theta {theta!r}; it must be positive")
    return {"rope_type": "default", "rope_theta": float(theta)}


@dataclass
class RenamedConfig(BertConfig):
    """A family config whose transformers class names some of BERT's settings differently (DistilBERT's `dim`,
    ALBERT's `classifier_dropout_prob`): read and written under the family's names, computed with BERT's."""

    # transformers' name in this family -> the BertConfig field bertforge computes with
    renamed: ClassVar[dict[str, str]] = {}
    # BERT names transformers also accepts for a renamed field (its attribute_map): BERT name -> family name
    aliases: ClassVar[dict[str, str]] = {}
    # BERT fields this family's config does not have: in a config.json they change nothing, here or in transformers
    absent: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "RenamedConfig":
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a JSON object")
        data = dict(data)
        for bert_name, name in cls.aliases.items():
            if bert_name in data:
                value = data.pop(bert_name)
                if name in data and data[name] != value:
                    raise ConfigError(f"{source}: keys '{name}' ({data[name]!r}) and '{bert_name}' ({value!r}) "
                                      "name the same setting and disagree")
                data.setdefault(name, value)
        extra = {k: data.pop(k) for k in cls.absent if k in data}
        for bert_name in cls.renamed.values():
            if bert_name in data:  # a BERT name this family's transformers config would not read
                extra[bert_name] = data.pop(bert_name)
        config = super().from_dict({cls.renamed.get(k, k): v for k, v in data.items()}, source)
        config.extra.update(extra)
        return config

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        for name, bert_name in self.renamed.items():
            out[name] = getattr(self, bert_name)
            if bert_name in self.extra:  # a BERT-named key the file held, which meant nothing: written back as read
                out[bert_name] = self.extra[bert_name]
            else:
                del out[bert_name]
        for name in self.absent:
            if name not in self.extra:
                out.pop(name, None)
        return out
