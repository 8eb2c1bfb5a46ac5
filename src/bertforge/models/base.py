"""What every model of the family shares: its initialisation, and the hook through which it is read and written.

Reading and writing Hugging Face directories is not the models' business: that is `bertforge.interop`,
which sits above them and plugs its reader and writer in here when it is imported (as `import bertforge`
does for every model name). The models therefore import torch only, and `Model.from_pretrained(dir)`
still works as it does in transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from ..errors import BertforgeError


@dataclass(frozen=True)
class NameTable:
    """How an architecture's modules are named in its transformers checkpoints: data, read both ways by
    `bertforge.interop.hf`.

    backbone: (our module, transformers' module) pairs relative to the backbone; `{i}` is a layer index.
    heads: the same for the head layers, relative to the whole model.
    prefix: the attribute that holds the backbone in a head model, which is also its checkpoint key
        prefix (`bert` for `bert.encoder.layer.0...`).
    derived: a regex of checkpoint keys that carry no information of their own (buffers, tied copies).
    tied_decoder: the MLM decoder matrix's key, a copy of the word embeddings unless the config unties it.
    """

    backbone: tuple[tuple[str, str], ...]
    heads: tuple[tuple[str, str], ...]
    prefix: str
    derived: str
    tied_decoder: str


class CheckpointIO(Protocol):
    """The reader and writer `bertforge.interop` installs (see `install_checkpoint_io`)."""

    def load_pretrained(self, cls: type, path: str | Path, **config_overrides: Any) -> Any: ...

    def save_pretrained(self, model: nn.Module, path: str | Path, tokenizer: Any = None) -> None: ...


_checkpoint_io: CheckpointIO | None = None


def install_checkpoint_io(io: CheckpointIO) -> None:
    """Called once by `bertforge.interop` on import."""
    global _checkpoint_io
    _checkpoint_io = io


def checkpoint_io() -> CheckpointIO:
    if _checkpoint_io is None:
        raise BertforgeError("reading and writing checkpoints needs bertforge.interop: `import bertforge.interop` "
                             "(or take the model class from `bertforge`, which does it)")
    return _checkpoint_io


class PreTrainedModel(nn.Module):
    """Shared by every backbone and head: initialisation and checkpoint I/O."""

    config: Any
    # The `model_type` of config.json: which registry row (and so which name table) the model belongs to.
    model_type: ClassVar[str]
    # The transformers class whose checkpoint layout this model reads and writes.
    hf_architecture: ClassVar[str]

    def init_weights(self) -> None:
        """BERT's initialisation: N(0, initializer_range) weights, zero biases, unit LayerNorm."""
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)) and module.weight.requires_grad:
                # (a frozen table, such as DistilBERT's sinusoidal positions, keeps the values it was built with)
                nn.init.normal_(module.weight, mean=0.0, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
            if isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                if module.bias is not None:  # (ModernBERT's norms have none)
                    nn.init.zeros_(module.bias)

    def checkpoint_names(self, table: NameTable) -> NameTable:
        """The name table this model's checkpoints use: its family's (`table`), unless a config setting
        renames a head (DeBERTa's `legacy`)."""
        return table

    @classmethod
    def from_pretrained(cls, path: str | Path, **config_overrides: Any) -> Any:
        """Load a Hugging Face style directory (config.json + model.safetensors or pytorch_model.bin).

        Keyword arguments override config fields, e.g. `num_labels=3` for a new head.
        """
        return checkpoint_io().load_pretrained(cls, path, **config_overrides)

    def save_pretrained(self, path: str | Path, tokenizer: Any = None) -> None:
        """Write config.json and model.safetensors in the transformers layout (and the tokenizer, if given)."""
        checkpoint_io().save_pretrained(self, path, tokenizer=tokenizer)

    def num_parameters(self) -> int:
        """Every parameter, counted once."""
        return sum(p.numel() for p in self.parameters())
