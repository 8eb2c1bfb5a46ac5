"""What every model of the family shares: its initialisation, and the hook through which it is read and written.

Reading and writing Hugging Face directories is not the models' business: that is `bertforge.interop`,
which sits above them and plugs its reader and writer in here when it is imported (as `import bertforge`
does for every model name). The models therefore import torch only, and `Model.from_pretrained(dir)`
still works as it does in transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
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
    original: for a family whose checkpoints on the Hub hold another layout than transformers 5 writes (GTE's fused
        QKV, under `new.`), a function from such a state dict to transformers' names, applied before the table;
        it returns a state dict already in transformers' layout unchanged.
    written: for such a family, the function from transformers' runtime names to the layout its `save_pretrained`
        writes (the table names the runtime modules, one bertforge module each); None: the table's names are written.
    """

    backbone: tuple[tuple[str, str], ...]
    heads: tuple[tuple[str, str], ...]
    prefix: str
    derived: str
    tied_decoder: str
    original: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    written: Callable[[dict[str, Any]], dict[str, Any]] | None = None


class ModelOutput:
    """What transformers' outputs also are: a tuple by position (`out[0]`), a mapping by name (`out["logits"]`),
    and `to_tuple()`, which `return_dict=False` returns. The tuple holds the fields that are set (not None) in
    transformers' order for the class, `tuple_fields` (the dataclass's own order unless a class names it)."""

    tuple_fields: ClassVar[tuple[str, ...] | None] = None

    def keys(self) -> list[str]:
        """The names of the fields that are set, in the tuple's order."""
        import dataclasses

        names = self.tuple_fields or tuple(f.name for f in dataclasses.fields(self))  # type: ignore[arg-type]
        return [n for n in names if getattr(self, n) is not None]

    def to_tuple(self) -> tuple:
        return tuple(getattr(self, n) for n in self.keys())

    def __getitem__(self, key: int | slice | str) -> Any:
        if isinstance(key, str):
            if key not in self.keys():
                raise KeyError(key)
            return getattr(self, key)
        return self.to_tuple()[key]

    def __len__(self) -> int:
        return len(self.keys())

    def __iter__(self):
        """Over the values, as a tuple (so `loss, logits = model(**batch, labels=y)` unpacks as transformers')."""
        return iter(self.to_tuple())


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
    def from_pretrained(cls, path: str | Path, *, torch_dtype: Any = None, dtype: Any = None,
                        attn_implementation: str | None = None, device_map: Any = None,
                        **config_overrides: Any) -> Any:
        """Load a Hugging Face style directory (config.json + model.safetensors or pytorch_model.bin).

        Keyword arguments override config fields, e.g. `num_labels=3` for a new head. As in transformers:
        `dtype` (or its older name `torch_dtype`): a torch dtype, its name, or "auto" (the config's `torch_dtype`);
        `device_map`: a device ("cpu", "cuda:0", a `torch.device`), or "auto" (the GPU when there is one);
        `attn_implementation`: "eager", "sdpa" or "flash_attention_2" are accepted and change nothing here:
        bertforge computes attention its own way for every value (a native kernel or PyTorch's fused attention
        on unpadded rows), with the same numbers, and the explicit probabilities when `output_attentions` asks.
        """
        if attn_implementation not in (None, "eager", "sdpa", "flash_attention_2", "flex_attention"):
            raise BertforgeError(f"attn_implementation {attn_implementation!r}: transformers knows eager, sdpa, "
                                 "flash_attention_2 and flex_attention")
        if torch_dtype is not None and dtype is not None and torch_dtype != dtype:
            raise BertforgeError(f"dtype {dtype!r} and torch_dtype {torch_dtype!r}: give one")
        model = checkpoint_io().load_pretrained(cls, path, **config_overrides)
        wanted = _dtype_of(dtype if dtype is not None else torch_dtype, path)
        if wanted is not None:
            model.to(wanted)
        if device_map is not None:
            model.to(_device_of(device_map))
        return model

    def __call__(self, *args: Any, return_dict: bool | None = None, **kwargs: Any) -> Any:
        """`model(**batch)`; `return_dict=False` gives the output as a tuple, as transformers does."""
        out = super().__call__(*args, **kwargs)
        return out.to_tuple() if return_dict is False and isinstance(out, ModelOutput) else out

    # ----------------------------------------------------------------- transformers' model API
    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(p.dtype for p in self.parameters() if p.is_floating_point())

    def get_input_embeddings(self) -> nn.Embedding:
        """The word embedding table (float [V, E]), which a tied masked-LM decoder shares."""
        return getattr(self, "backbone", self).embeddings.word

    def set_input_embeddings(self, table: nn.Embedding) -> None:
        """Use `table` (its weight itself, not a copy) as the word embeddings."""
        from .tied import TiedEmbedding

        if not isinstance(table, TiedEmbedding):  # a tied decoder reads the table through TiedEmbedding's hook
            tied = TiedEmbedding(table.num_embeddings, table.embedding_dim, padding_idx=table.padding_idx,
                                 device=table.weight.device, dtype=table.weight.dtype)
            tied.weight = table.weight
            table = tied
        getattr(self, "backbone", self).embeddings.word = table

    def tie_weights(self) -> None:
        """Nothing to do: a tied decoder reads the word embeddings at every forward (there is no second reference
        to re-point, as transformers' decoder.weight is), so it stays tied through `set_input_embeddings` and
        `resize_token_embeddings`."""

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        """Recompute each encoder block in the backward pass instead of keeping its activations (transformers' name):
        activation memory falls to about one block's, a step costs about one more forward. The random state is
        replayed, so dropout draws the same masks and the gradients are the ones without it."""
        from torch.utils.checkpoint import checkpoint

        options = {"use_reentrant": False, **(gradient_checkpointing_kwargs or {})}
        backbone = getattr(self, "backbone", self)
        for block in {id(b): b for b in backbone.blocks()}.values():  # ALBERT runs a shared block several times
            if getattr(block, "_plain_forward", None) is not None:
                continue
            block._plain_forward = plain = block.forward

            def forward(*args: Any, _plain: Any = plain, _block: nn.Module = block, **kwargs: Any) -> Any:
                if _block.training and torch.is_grad_enabled():
                    return checkpoint(_plain, *args, **options, **kwargs)
                return _plain(*args, **kwargs)

            block.forward = forward
        self.is_gradient_checkpointing = True

    def gradient_checkpointing_disable(self) -> None:
        backbone = getattr(self, "backbone", self)
        for block in backbone.blocks():
            if getattr(block, "_plain_forward", None) is not None:
                block.forward, block._plain_forward = block._plain_forward, None
        self.is_gradient_checkpointing = False

    is_gradient_checkpointing = False

    def resize_token_embeddings(self, new_num_tokens: int) -> nn.Embedding:
        """Grow or shrink the vocabulary to `new_num_tokens` rows: the rows kept keep their values, new ones are
        initialised as the model's own (N(0, initializer_range)); an untied decoder and a decoder's bias are resized
        the same way (new bias entries 0); `config.vocab_size` is updated. Returns the new table."""
        if new_num_tokens < 1:
            raise BertforgeError(f"resize_token_embeddings: {new_num_tokens} tokens; at least 1")
        old = self.get_input_embeddings()
        table = nn.Embedding(new_num_tokens, old.embedding_dim, device=old.weight.device, dtype=old.weight.dtype,
                             padding_idx=old.padding_idx if old.padding_idx is not None
                             and old.padding_idx < new_num_tokens else None)
        with torch.no_grad():
            nn.init.normal_(table.weight, mean=0.0, std=self.config.initializer_range)
            keep = min(new_num_tokens, old.num_embeddings)
            table.weight[:keep] = old.weight[:keep]
        self.set_input_embeddings(table)
        for module in self.modules():
            resize = getattr(module, "resize_vocabulary", None)
            if callable(resize):
                resize(new_num_tokens, self.config.initializer_range)
        self.config.vocab_size = new_num_tokens
        return self.get_input_embeddings()

    def save_pretrained(self, path: str | Path, tokenizer: Any = None) -> None:
        """Write config.json and model.safetensors in the transformers layout (and the tokenizer, if given)."""
        checkpoint_io().save_pretrained(self, path, tokenizer=tokenizer)

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """Every parameter, counted once (as transformers counts: `only_trainable`, `exclude_embeddings`)."""
        skip = {id(m.weight) for m in self.modules() if isinstance(m, nn.Embedding)} if exclude_embeddings else set()
        return sum(p.numel() for p in self.parameters()
                   if (p.requires_grad or not only_trainable) and id(p) not in skip)


def _dtype_of(value: Any, path: Any) -> torch.dtype | None:
    """A torch dtype from transformers' `dtype` argument: a dtype, its name ("bfloat16", "float32"), or "auto"
    (config.json's `dtype` or `torch_dtype`, float32 where it names none)."""
    if value is None:
        return None
    if value == "auto":  # what config.json says the weights were saved in
        import json

        try:
            saved = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            saved = {}
        value = saved.get("dtype") or saved.get("torch_dtype") or "float32"
    if isinstance(value, str):
        found = getattr(torch, value.removeprefix("torch."), None)
        if not isinstance(found, torch.dtype):
            raise BertforgeError(f"{path}: dtype {value!r} is not a torch dtype")
        value = found
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise BertforgeError(f"{path}: dtype {value!r}: a model's weights take a floating-point dtype")
    return value


def _device_of(device_map: Any) -> torch.device:
    """transformers' `device_map` for a model on one device: a device, its name or index, or "auto"."""
    if device_map == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(device_map, dict):
        places = set(device_map.values())
        if len(places) != 1:
            raise BertforgeError(f"device_map {device_map}: bertforge places a model on one device, not split")
        device_map = places.pop()
    return torch.device(device_map if not isinstance(device_map, int) else f"cuda:{device_map}")
