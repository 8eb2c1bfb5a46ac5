"""Model configuration: `BertConfig` with Hugging Face field names, and the named size presets.

The field names are those of `transformers.BertConfig`, so a `config.json` written
by either library is read by the other unchanged.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

# Activations the encoder knows. "gelu" is BERT's exact erf GELU; the tanh
# approximation is accepted because some published checkpoints were trained with it.
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu")

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


@dataclass
class BertConfig:
    """Hyper-parameters of a BERT encoder and its heads (Hugging Face field names)."""

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
    pad_token_id: int = 0
    # Head settings, as transformers names them.
    classifier_dropout: float | None = None
    num_labels: int = 2
    id2label: dict[int, str] | None = None
    label2id: dict[str, int] | None = None
    problem_type: str | None = None  # regression | single_label_classification | multi_label_classification
    # Anything else found in a config.json, kept so that saving round-trips it.
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size", "num_labels"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"config key '{name}' must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"config key 'hidden_size' ({self.hidden_size}) must be divisible by "
                f"'num_attention_heads' ({self.num_attention_heads})"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"config key 'hidden_act' is {self.hidden_act!r}; supported: {', '.join(ACTIVATIONS)}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"config key '{name}' must be in [0, 1), got {getattr(self, name)!r}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(f"config key 'pad_token_id' ({self.pad_token_id}) is outside the vocabulary")
        if self.id2label is not None:
            self.id2label = {int(k): str(v) for k, v in self.id2label.items()}
            if sorted(self.id2label) != list(range(len(self.id2label))):
                raise ConfigError("config key 'id2label' must map the ids 0..n-1 to names")
            self.num_labels = len(self.id2label)
            if self.label2id is None:
                self.label2id = {v: k for k, v in self.id2label.items()}
        if self.problem_type not in (None, "regression", "single_label_classification", "multi_label_classification"):
            raise ConfigError(f"config key 'problem_type' has unknown value {self.problem_type!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

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
                    f"unknown model preset {name!r}; use one of {', '.join(PRESETS)} or L<layers>-H<hidden>"
                ) from None
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
        model_type = data.get("model_type", "bert")
        if model_type != "bert":
            raise ConfigError(f"{source}: model_type is {model_type!r}, but bertforge reads only 'bert' checkpoints")
        pos_type = data.get("position_embedding_type", "absolute")
        if pos_type != "absolute":
            raise ConfigError(f"{source}: position_embedding_type {pos_type!r} is not supported (only 'absolute')")
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in data.items() if k in names}
        extra = {k: v for k, v in data.items() if k not in names and k not in _FILE_KEYS}
        try:
            return cls(**known, extra=extra)
        except TypeError as exc:  # a value of the wrong type for a field
            raise ConfigError(f"{source}: {exc}") from None
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None

    @classmethod
    def from_json(cls, path: str | Path) -> "BertConfig":
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such file") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from None
        return cls.from_dict(data, source=str(path))

    def to_dict(self) -> dict[str, Any]:
        """The Hugging Face `config.json` fields (without `architectures`, which the model adds)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("extra", "num_labels")}
        id2label = self.id2label or {i: f"LABEL_{i}" for i in range(self.num_labels)}
        out["id2label"] = {str(k): v for k, v in id2label.items()}
        out["label2id"] = self.label2id or {v: k for k, v in id2label.items()}
        if out["problem_type"] is None:
            del out["problem_type"]
        out.update(self.extra)
        out["model_type"] = "bert"
        out["position_embedding_type"] = "absolute"
        return out

    def save(self, path: str | Path, architectures: list[str] | None = None) -> None:
        data = self.to_dict()
        if architectures:
            data["architectures"] = architectures
        Path(path).write_text(json.dumps(dict(sorted(data.items())), indent=2) + "\n", encoding="utf-8")
