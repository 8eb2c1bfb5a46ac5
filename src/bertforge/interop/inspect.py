"""`bertforge inspect`: what a checkpoint directory holds (from file headers), and whether every weight is finite
(read a tensor at a time)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from ..errors import CheckpointError
from .hf import (
    architecture_of,
    family_of,
    from_hf_state_dict,
    head_of,
    is_head_key,
    non_finite,
    read_config,
    read_weights,
    shapes_only,
    weights_files,
)



def _heads_present(path: Path, shapes: dict[str, tuple[int, ...]]) -> list[str]:
    """The heads a checkpoint carries, recognised by their weights' key prefixes in its family's registry row. Where
    two heads of a family share a prefix (ModernBERT names every task layer `classifier`), the checkpoint's own
    architecture says which it is."""
    own = head_of(path)
    by_prefix: dict[str, str] = {}
    for info in family_of(path).heads:
        if info.weights and (info.weights[0] not in by_prefix or info is own):
            by_prefix[info.weights[0]] = info.weights[1]
    return [label for prefix, label in by_prefix.items() if any(k.startswith(prefix) for k in shapes)]


def _scan(file: Path) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    """(name -> shape, name -> count of NaN or infinite values) of one weights file, a tensor at a time, so
    a damaged file is reported rather than refused."""
    if file.suffix == ".safetensors":
        try:
            with safe_open(str(file), framework="pt") as f:
                shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
                bad = {}
                for k in f.keys():
                    bad.update(non_finite({k: f.get_tensor(k)}))
                return shapes, bad
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{file}: cannot read safetensors ({exc}); the file may be truncated or corrupt") from None
    tensors = read_weights(file, check_finite=False)
    return {k: tuple(v.shape) for k, v in tensors.items()}, non_finite(tensors)


def inspect_checkpoint(path: str | Path) -> dict[str, Any]:
    """Config, architecture, parameter counts by part, and the heads present."""
    path = Path(path)
    config = read_config(path)
    shapes: dict[str, tuple[int, ...]] = {}
    bad: dict[str, int] = {}
    for file in weights_files(path):
        file_shapes, file_bad = _scan(file)
        shapes.update(file_shapes)
        bad.update(file_bad)
    table = family_of(path).names
    derived, prefix = re.compile(table.derived), table.prefix + "."
    counts = {"embeddings": 0, "encoder": 0, "pooler": 0, "heads": 0}
    for key, shape in shapes.items():
        if derived.search(key) or (key == table.tied_decoder and config.tie_word_embeddings):
            continue  # buffers and the tied decoder hold no parameters of their own
        n = 1
        for d in shape:
            n *= d
        name = key[len(prefix):] if key.startswith(prefix) else key
        if is_head_key(key, table):
            part = "heads"
        else:  # the layers are `encoder.layer.*` in BERT's layout, `transformer.layer.*` in DistilBERT's
            part = next((p for p in ("embeddings", "pooler") if name.startswith(p + ".")), "encoder")
        counts[part] += n
    heads = _heads_present(path, shapes)
    # Check the weights against the config without allocating them: build the model on the
    # meta device and load shape-only tensors, which raises on the first mismatched key.
    architecture = architecture_of(path)
    with shapes_only():
        model = head_of(path).cls(config)
        report = from_hf_state_dict(model, {k: torch.empty(s) for k, s in shapes.items()}, source=str(path))
    return {
        "path": str(path),
        "architecture": architecture,
        "heads": heads,
        "missing_keys": report.missing_keys,
        "unexpected_keys": report.unexpected_keys,
        "non_finite": bad,
        "parameters": {**counts, "total": sum(counts.values())},
        # In bertforge's own names, the same for every family (config.json's differ: DistilBERT says n_layers, dim).
        "size": {"layers": config.num_hidden_layers, "hidden": config.hidden_size,
                 "heads": config.num_attention_heads, "ffn": config.intermediate_size,
                 "vocab": config.vocab_size, "max_len": config.max_position_embeddings},
        "config": config.to_dict(),
    }


def format_report(info: dict[str, Any]) -> str:
    c, p, z = info["config"], info["parameters"], info["size"]
    lines = [
        f"checkpoint    {info['path']}",
        f"architecture  {info['architecture']}",
        f"size          L={z['layers']} H={z['hidden']} heads={z['heads']} FFN={z['ffn']} vocab={z['vocab']} "
        f"max_len={z['max_len']}",
        f"heads         {', '.join(info['heads']) or 'none (backbone only)'}",
        "parameters    " + "  ".join(f"{k}={v:,}" for k, v in p.items()),
        "config        " + json.dumps({k: v for k, v in c.items() if k not in ("id2label", "label2id")}),
    ]
    if info["missing_keys"]:
        lines.append("MISSING       " + ", ".join(info["missing_keys"]))
    if info["unexpected_keys"]:
        lines.append("unused        " + ", ".join(info["unexpected_keys"]))
    if info["non_finite"]:
        lines.append("NON-FINITE    " + ", ".join(f"{k} ({n:,} NaN/inf values)" for k, n in info["non_finite"].items()))
    if info["config"].get("id2label") and any(h == "classifier" for h in info["heads"]):
        lines.append("labels        " + json.dumps(c["id2label"]))
    return "\n".join(lines)
