"""Hugging Face checkpoint directories in and out of the Flax NNX models.

Loading goes through the torch model of the same architecture: its `from_pretrained` applies
every config rule (fields honoured or refused), the safe weight readers (safetensors, or
`pytorch_model.bin` through torch's weights-only unpickler) and the one name table in
`bertforge.interop.hf`. The NNX modules carry the torch modules' attribute names, so the state dict
then maps onto them by path, with only the layout of each tensor changed (a Linear's kernel is
the transpose of torch's weight). Saving runs the same road backwards, so `transformers` and
bertforge read what the JAX side writes with no missing keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from ..errors import CheckpointError
from .bert import MODELS, seeded


def _torch_class(architecture: str):
    from ..models.registry import HEADS

    return HEADS[architecture].cls


def _target(model: nnx.Module, key: str) -> tuple[nnx.Variable, bool]:
    """The NNX variable for a torch state-dict key, and whether its tensor is transposed."""
    parts = key.replace("mlm.transform.", "mlm.").split(".")
    node: Any = model
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else getattr(node, part, None)
        if node is None:
            raise CheckpointError(f"internal: the JAX model has no place for '{key}'")
    leaf = parts[-1]
    if isinstance(node, nnx.Linear):
        return (node.kernel, True) if leaf == "weight" else (node.bias, False)
    if isinstance(node, nnx.Embed):
        return node.embedding, False
    if isinstance(node, nnx.LayerNorm):
        return (node.scale if leaf == "weight" else node.bias), False
    variable = getattr(node, leaf, None)
    if not isinstance(variable, nnx.Variable):
        raise CheckpointError(f"internal: the JAX model has no place for '{key}'")
    return variable, False


def _param_count(model: nnx.Module) -> int:
    return len(nnx.to_flat_state(nnx.state(model, nnx.Param)))


def load_torch_state(model: nnx.Module, state: dict[str, Any]) -> None:
    """Copy a bertforge torch state dict (our names) into `model`, every parameter exactly once."""
    seen = set()
    for key, tensor in state.items():
        variable, transpose = _target(model, key)
        value = tensor.detach().cpu().numpy()
        value = value.T if transpose else value
        if value.shape != variable[...].shape:
            raise CheckpointError(f"'{key}' has shape {value.shape}; the JAX model expects {variable[...].shape}")
        variable.set_value(jnp.asarray(value))
        seen.add(id(variable))
    if len(seen) != _param_count(model):
        raise CheckpointError(f"the checkpoint filled {len(seen)} of the JAX model's {_param_count(model)} parameters")


def torch_state(model: nnx.Module, torch_model) -> dict[str, Any]:
    """`model`'s parameters as a state dict for `torch_model` (same architecture and config)."""
    import torch

    out = {}
    for key, reference in torch_model.state_dict().items():
        variable, transpose = _target(model, key)
        value = np.asarray(variable[...])
        out[key] = torch.from_numpy(np.array(value.T if transpose else value)).to(reference.dtype)  # a writable copy
    return out


def from_pretrained(path: str | Path, architecture: str | None = None) -> nnx.Module:
    """A checkpoint directory as a Flax NNX model, in evaluation mode: its own architecture
    (config.json's `architectures`), or `architecture` (e.g. "BertModel" to read only the encoder)."""
    from ..interop.hf import architecture_of

    architecture = architecture or architecture_of(path)
    if architecture not in MODELS:
        raise CheckpointError(f"{path}: {architecture} has no JAX model yet; JAX has {', '.join(MODELS)}")
    torch_model = _torch_class(architecture).from_pretrained(path)
    model = MODELS[architecture](torch_model.config, seeded(0))
    load_torch_state(model, torch_model.state_dict())
    model.eval()  # as transformers' from_pretrained: dropout off until `model.train()`
    return model


def save_pretrained(model: nnx.Module, path: str | Path, tokenizer=None) -> None:
    """Write `model` as a Hugging Face directory (config.json + model.safetensors [+ tokenizer])."""
    torch_model = _torch_class(model.hf_architecture)(model.config)
    torch_model.load_state_dict(torch_state(model, torch_model))
    torch_model.save_pretrained(path, tokenizer=tokenizer)
