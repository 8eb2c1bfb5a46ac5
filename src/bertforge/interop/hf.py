"""Hugging Face checkpoint interop: one declarative name table, used in both directions.

A bertforge output directory *is* a transformers model directory: `config.json`
(model_type "bert", `architectures`, label maps) and `model.safetensors`, plus the
tokenizer files when a tokenizer is saved alongside. Reading also accepts
`pytorch_model.bin` (loaded with `torch.load(weights_only=True)`, never unpickled
with arbitrary code), sharded safetensors, backbone-only checkpoints with or
without the `bert.` prefix, and the `gamma`/`beta` LayerNorm names of checkpoints
converted from the original TensorFlow code.
"""

from __future__ import annotations

import json
import logging
import pickle
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..errors import CheckpointError, ConfigError
from ..jsonfile import read_json_object
from ..models.base import NameTable
from ..models.registry import ARCHITECTURES, FAMILIES, HEADS, Family, HeadInfo, family
from ..safefiles import atomic_write

log = logging.getLogger("bertforge")

# Set while a resumed run builds its model: the head's weights are about to come from the run's checkpoint, so
# a head missing from --model is expected, not news.
_HEADS_FROM_CHECKPOINT: ContextVar[bool] = ContextVar("heads_from_checkpoint", default=False)


@contextmanager
def heads_from_checkpoint(resuming: bool = True) -> Iterator[None]:
    """Within it (when `resuming`), a head missing from the directory loaded is not warned about as random:
    a resumed run restores it from its checkpoint right after."""
    token = _HEADS_FROM_CHECKPOINT.set(resuming)
    try:
        yield
    finally:
        _HEADS_FROM_CHECKPOINT.reset(token)

def _compile(table: list[tuple[str, str]], prefix: str, reverse: bool) -> list[tuple[re.Pattern, str]]:
    """Regexes for one direction of the table; each `{i}`-style placeholder (a layer number, or ALBERT's
    group `{g}` and block `{j}`) becomes a captured number, put back in the other name."""
    rules = []
    for ours, theirs in table:
        src, dst = (theirs, ours) if reverse else (ours, theirs)
        pattern = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>\\d+)", re.escape(prefix + src))
        rules.append((re.compile(f"^{pattern}(?P<suffix>\\.[a-z_]+)?$"), prefix + dst))
    return rules


def names_of(model: torch.nn.Module) -> NameTable:
    """The name table of the model's architecture (its registry row, as the model's config reads it)."""
    return model.checkpoint_names(family(model.model_type).names)


def has_backbone_prefix(model: torch.nn.Module) -> bool:
    """A head model holds its backbone under the table's prefix (`bert`); a bare backbone does not."""
    return hasattr(model, names_of(model).prefix)


def _rules(table: NameTable, has_backbone_prefix: bool, reverse: bool) -> list[tuple[re.Pattern, str]]:
    prefix = table.prefix + "." if has_backbone_prefix else ""
    return _compile(list(table.backbone), prefix, reverse) + _compile(list(table.heads), "", reverse)


def _rename(key: str, rules: list[tuple[re.Pattern, str]]) -> str | None:
    for pattern, template in rules:
        m = pattern.match(key)
        if m:
            numbers = {k: v for k, v in m.groupdict().items() if k != "suffix"}
            return template.format(**numbers) + (m.group("suffix") or "")
    return None


def hf_names(model: torch.nn.Module) -> dict[str, str]:
    """Each of our state-dict keys -> transformers' name for the same tensor (a tied MLM decoder is
    no entry of ours, so it is left out, as transformers does). Also names parameters."""
    rules = _rules(names_of(model), has_backbone_prefix(model), reverse=False)
    out = {}
    for key in model.state_dict():
        name = _rename(key, rules)
        if name is None:
            raise CheckpointError(f"internal: no Hugging Face name for parameter '{key}'")
        out[key] = name
    return out


def to_hf_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Our state dict under transformers' names (the tied MLM decoder is left out, as transformers does)."""
    names = hf_names(model)
    state = {names[key]: tensor for key, tensor in model.state_dict().items()}
    head_bias, decoder_bias = _mlm_bias_keys(names_of(model))
    if _untied_decoder(model) and head_bias in state and decoder_bias != head_bias:
        # transformers 5 gives an untied decoder a bias of its own and uses it; write our one bias under both names.
        state[decoder_bias] = state[head_bias].clone()
    table = names_of(model)
    return table.written(state) if table.written is not None else state


def _mlm_bias_keys(table: NameTable) -> tuple[str, str]:
    """The masked-LM head's bias key (`cls.predictions.bias`) and its decoder's copy (`cls.predictions.decoder.bias`)."""
    return dict(table.heads)["mlm.bias"], table.tied_decoder.rsplit(".", 1)[0] + ".bias"


def _untied_decoder(model: torch.nn.Module) -> bool:
    return getattr(getattr(model, "mlm", None), "decoder", None) is not None


@dataclass
class LoadReport:
    """Which parameters a checkpoint did not provide, and which of its keys were not used."""

    missing_keys: list[str] = field(default_factory=list)
    unexpected_keys: list[str] = field(default_factory=list)


def from_hf_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str = "checkpoint",
                       new_head: bool = False) -> LoadReport:
    """Load transformers-named weights into `model`, refusing any shape mismatch by key name.

    With `new_head` (the caller asked for a different number of labels), a task head whose
    shape differs is left newly initialised instead, as transformers' ignore_mismatched_sizes.
    """
    state = dict(state)
    table = names_of(model)
    if table.original is not None:  # the family's original layout, as transformers converts it on load
        state = table.original(state)
    # Checkpoints converted from TensorFlow name LayerNorm parameters gamma and beta.
    for key in list(state):
        if key.endswith(".gamma") or key.endswith(".beta"):
            state[key.rsplit(".", 1)[0] + (".weight" if key.endswith(".gamma") else ".bias")] = state.pop(key)
    # The MLM output bias: transformers ties decoder.bias to cls.predictions.bias, except that an untied
    # decoder (tie_word_embeddings: false) in transformers 5 adds its own decoder.bias, which is the one used.
    untied = _untied_decoder(model)
    head_bias, decoder_bias = _mlm_bias_keys(table)
    if decoder_bias in state and (untied or head_bias not in state):
        state[head_bias] = state[decoder_bias]
    derived = re.compile(table.derived)
    state = {k: v for k, v in state.items() if not derived.search(k)}
    if not untied:
        state.pop(table.tied_decoder, None)

    prefix = table.prefix + "."
    wants_prefix = has_backbone_prefix(model)
    ckpt_has_prefix = any(k.startswith(prefix) for k in state)
    if wants_prefix and not ckpt_has_prefix:  # a backbone-only checkpoint into a head model
        state = {(prefix + k if not is_head_key(k, table) else k): v for k, v in state.items()}
    report = LoadReport()
    if not wants_prefix and ckpt_has_prefix:  # a full checkpoint into the bare backbone: heads unused
        report.unexpected_keys = [k for k in state if not k.startswith(prefix)]
        state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}

    rules = _rules(table, wants_prefix, reverse=True)
    ours = model.state_dict()
    renamed: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        name = _rename(key, rules)
        if name is None or name not in ours:
            report.unexpected_keys.append(key)
            continue
        if tuple(tensor.shape) != tuple(ours[name].shape):
            if new_head and is_head_key(key, table):
                report.unexpected_keys.append(key)
                continue
            raise CheckpointError(
                f"{source}: key '{key}' has shape {tuple(tensor.shape)} but the config gives "
                f"{tuple(ours[name].shape)}; config.json does not match the weights"
            )
        renamed[name] = tensor
    report.missing_keys = sorted(set(ours) - set(renamed))
    model.load_state_dict(renamed, strict=False)
    return report


def is_head_key(key: str, table: NameTable) -> bool:
    """A key of a head layer: its first part is the first part of a head entry (`cls`, `classifier`, ...)."""
    return key.split(".", 1)[0] in {theirs.split(".", 1)[0] for _, theirs in table.heads}


def weights_files(path: Path) -> list[Path]:
    """The weight files of a checkpoint directory, preferring safetensors."""
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{index}: not a valid safetensors index ({exc})") from None
        return [path / name for name in sorted(set(weight_map.values()))]
    binary = path / "pytorch_model.bin"
    if binary.is_file():
        return [binary]
    raise CheckpointError(
        f"{path}: no model.safetensors or pytorch_model.bin; a checkpoint directory holds config.json plus one of them"
    )


def non_finite(tensors: dict[str, torch.Tensor]) -> dict[str, int]:
    """Name -> how many NaN or infinite values, for the floating-point tensors that hold any."""
    found = {}
    for name, tensor in tensors.items():
        if tensor.is_floating_point():
            bad = int((~torch.isfinite(tensor)).sum())
            if bad:
                found[name] = bad
    return found


def read_weights(file: Path, check_finite: bool = True) -> dict[str, torch.Tensor]:
    """Read one weights file safely: safetensors, or a .bin through torch's weights-only unpickler. Weights
    with NaN or infinite values (bit rot, a run that diverged) are refused by name unless `check_finite` is
    off (`inspect`, which lists them): they would give NaN outputs that look like answers."""
    if not file.is_file():
        raise CheckpointError(f"{file}: missing weights file")
    if file.suffix == ".safetensors":
        try:
            state = load_file(str(file), device="cpu")
        except (SafetensorError, OSError, ValueError) as exc:
            raise CheckpointError(f"{file}: cannot read safetensors ({exc}); the file may be truncated or corrupt") from None
    else:
        try:
            state = torch.load(file, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            raise CheckpointError(f"{file}: refused to load: it holds more than tensors, and unpickling it could run "
                                  f"code ({str(exc).splitlines()[0]})") from None
        except (RuntimeError, EOFError, OSError) as exc:
            raise CheckpointError(f"{file}: cannot read PyTorch weights ({exc}); the file may be truncated or "
                                  "corrupt") from None
        if not isinstance(state, dict):
            raise CheckpointError(f"{file}: expected a dict of tensors, got {type(state).__name__}")
    bad = non_finite({k: v for k, v in state.items() if isinstance(v, torch.Tensor)}) if check_finite else {}
    if bad:
        names = ", ".join(f"{k} ({n:,} values)" for k, n in list(bad.items())[:3])
        raise CheckpointError(f"{file}: {len(bad)} tensor(s) hold NaN or infinite values: {names}"
                              f"{' ...' if len(bad) > 3 else ''}; the file is damaged or its run diverged "
                              "(`bertforge inspect` lists them all)")
    return state


def _config_json(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """A checkpoint directory's config.json as a dict, refusing a missing or malformed one by name."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a checkpoint directory")
    file = path / "config.json"
    if not file.is_file():
        raise CheckpointError(f"{path}: no config.json; a checkpoint directory holds config.json and model weights")
    return file, read_json_object(file, ConfigError)


def _family_config(path: str | Path) -> tuple[Family, Any, dict[str, Any]]:
    """The directory's registry row, its config (as that family's config class, every field honoured or
    refused) and config.json itself, read once."""
    file, data = _config_json(path)
    row = family(data.get("model_type", "bert"), source=str(file))
    return row, row.config.from_dict(data, source=str(file)), data


def family_of(path: str | Path) -> Family:
    """The registry row of the directory's `model_type` ('bert' when config.json names none, as transformers'
    BERT files of old did); an unknown model_type is refused naming the supported ones."""
    file, data = _config_json(path)
    return family(data.get("model_type", "bert"), source=str(file))


def read_config(path: str | Path):
    """The directory's config, as its family's config class (every field honoured or refused)."""
    return _family_config(path)[1]


def architecture_of(path: str | Path) -> str:
    """The `architectures[0]` a config.json names, or its family's bare encoder when it names none."""
    row, _, data = _family_config(path)  # refuses a missing or malformed config.json with a message naming it
    archs = data.get("architectures") or [row.backbone.hf_architecture]
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise CheckpointError(f"{path}/config.json: key 'architectures' must be a list of class names, got {archs!r}")
    return archs[0]


def head_of(path: str | Path) -> HeadInfo:
    """The registry entry of the head config.json's `architectures` names. An architecture bertforge has no
    head for is read as its family's bare encoder; one of another family than `model_type` is refused."""
    family, architecture = family_of(path), architecture_of(path)
    info = HEADS.get(architecture)
    if info is None:
        return family.heads[0]
    if info.cls.model_type != family.model_type:
        raise CheckpointError(f"{path}/config.json: architecture {architecture} is a '{info.cls.model_type}' model, "
                              f"but model_type is '{family.model_type}'; make the two agree")
    return info


def load_for_task(task: str, path: str | Path, accepted: tuple[str, ...]):
    """Load the checkpoint at `path` for `task`, refusing it unless config.json's `architectures`
    names one of `accepted` (head classes, the one to build first)."""
    architecture = architecture_of(path)
    if architecture not in accepted:
        model_type = family_of(path).model_type  # name the heads of this checkpoint's own family
        needed = [a for a in accepted if HEADS[a].cls.model_type == model_type] or list(accepted)
        raise CheckpointError(f"{path}: config.json names architecture {architecture}, which has no head for "
                              f"{task}; it needs {' or '.join(needed)} (fine-tune the model for {task} first)")
    return load_pretrained(ARCHITECTURES[architecture], path)


def _numel(model: torch.nn.Module) -> int:
    return sum(t.numel() for t in (*model.parameters(), *model.buffers()))


@contextmanager
def shapes_only() -> Iterator[None]:
    """Modules built inside are on the meta device (shapes, no data) and skip their random initialisation: a meta
    tensor has nothing to draw, and torch's meta `normal_` imports TorchDynamo the first time (~1.5 s of every
    command that loads a model). Tensors on other devices, in other threads, are initialised as ever."""
    import torch.nn.init as init

    drawn = {name: getattr(init, name) for name in ("normal_", "trunc_normal_")}

    def skipping(original):
        return lambda tensor, *args, **kwargs: tensor if tensor.is_meta else original(tensor, *args, **kwargs)

    for name, original in drawn.items():
        setattr(init, name, skipping(original))
    try:
        with torch.device("meta"):
            yield
    finally:
        for name, original in drawn.items():
            setattr(init, name, original)


def check_config_fits(cls: type, config: Any, path: Path, state: dict[str, torch.Tensor], new_head: bool = False) -> None:
    """Refuse, before any memory is allocated, a config.json that does not describe the weights beside it or that
    asks for more memory than this machine has (a hostile `hidden_size: 10000000` would allocate 1.2 TB;
    `num_hidden_layers: 1000000` would build for hours).

    A copy of the model with one or two of its layers is built on the meta device (shapes only, no data): its
    shapes are compared with the weights' by transformers' names (`from_hf_state_dict`, the loader's own rule),
    and its size per layer gives the whole model's size without building it."""
    import dataclasses

    from ..training.memory import GB, available_bytes

    layers = config.num_hidden_layers
    few = max(1, getattr(config, "num_hidden_groups", 1))  # ALBERT's groups: its layers share their weights
    small = [n for n in (few, 2 * few) if n < layers] or [layers]
    per_layer_lists = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
                       if isinstance(getattr(config, f.name), (list, tuple)) and len(getattr(config, f.name)) == layers}
    built = []
    for n in small:  # a per-layer list (ModernBERT's layer_types) keeps its first n entries
        fewer = {"num_hidden_layers": n, **{k: type(v)(v[:n]) for k, v in per_layer_lists.items()}}
        with shapes_only():
            built.append(cls(dataclasses.replace(config, **fewer) if n != layers else config))
    sizes = [_numel(m) for m in built]
    per_layer = (sizes[1] - sizes[0]) / (small[1] - small[0]) if len(small) == 2 else 0
    needed = int(sizes[0] + per_layer * (layers - small[0]))
    shapes = {k: torch.empty(v.shape, device="meta") for k, v in state.items()}  # `state`: the weights, read once
    from_hf_state_dict(built[0], shapes, source=str(path), new_head=new_head)  # a shape the config contradicts
    held = sum(t.numel() for t in shapes.values())
    sizes_of = (f"hidden_size {config.hidden_size}, num_hidden_layers {layers}, intermediate_size "
                f"{config.intermediate_size}, vocab_size {config.vocab_size}")
    if needed > 2 * held + (1 << 20):  # new heads and a pooler add little; a wrong config adds orders of magnitude
        raise CheckpointError(f"{path}/config.json asks for {needed:,} parameters ({sizes_of}), but the weights hold "
                              f"{held:,}: the config does not describe these weights")
    room, what = available_bytes()
    if needed * 4 > room:
        raise CheckpointError(f"{path}/config.json asks for {needed:,} parameters ({sizes_of}): "
                              f"{needed * 4 / GB:,.1f} GiB in float32, more than the {room / GB:,.1f} GiB {what}")


def load_pretrained(cls: type, path: str | Path, **config_overrides: Any):
    """Build `cls` from a checkpoint directory and load its weights; log what was missing or unused."""
    path = Path(path)
    config = read_config(path)
    if config.model_type != cls.model_type:
        raise CheckpointError(f"{path}: config.json's model_type is '{config.model_type}', but {cls.__name__} reads "
                              f"'{cls.model_type}' checkpoints; load it with bertforge.AutoModel (or the Auto class "
                              "of its head)")
    if config_overrides:
        fields = config.__dict__ | config_overrides
        if "num_labels" in config_overrides and "id2label" not in config_overrides:
            if config.id2label and len(config.id2label) != config_overrides["num_labels"]:
                fields["id2label"] = fields["label2id"] = None
        config = type(config)(**fields)
    state: dict[str, torch.Tensor] = {}
    for file in weights_files(path):
        state.update(read_weights(file))
    check_config_fits(cls, config, path, state, new_head="num_labels" in config_overrides)
    model = cls(config)
    report = from_hf_state_dict(model, state, source=str(path), new_head="num_labels" in config_overrides)
    prefix = names_of(model).prefix + "."
    backbone_missing = [k for k in report.missing_keys if k.startswith(prefix) or not has_backbone_prefix(model)]
    # The pooler is new where a checkpoint never had one (a masked-LM model's, as transformers saves it): it is
    # initialised like a head, as transformers does, and said. Any other backbone tensor missing is refused:
    # outputs from random weights would pass for the checkpoint's.
    pooler_missing = [k for k in backbone_missing if ".pooler." in f".{k}"]
    backbone_missing = [k for k in backbone_missing if k not in pooler_missing]
    head_missing = [k for k in report.missing_keys if k not in backbone_missing]
    if backbone_missing:
        raise CheckpointError(_missing_backbone(path, config.model_type, model, backbone_missing, state))
    if head_missing and _HEADS_FROM_CHECKPOINT.get():
        log.info("%s: %s head weights to be restored from the checkpoint resumed: %s",
                 path, cls.__name__, ", ".join(head_missing))
    elif head_missing:
        log.warning("%s: new %s head weights, initialised randomly (train before use): %s",
                    path, cls.__name__, ", ".join(head_missing))
    if report.unexpected_keys:
        log.info("%s: checkpoint weights not used by %s: %s", path, cls.__name__, ", ".join(report.unexpected_keys))
    model.load_report = report
    model.eval()
    return model


def _missing_backbone(path: Path, model_type: str, model: torch.nn.Module, missing: list[str],
                      state: dict[str, torch.Tensor]) -> str:
    """The refusal of a checkpoint whose weights lack some of the backbone's tensors: how many, the first names,
    and, where it holds none of them, whose backbone's tensors it holds instead (config.json's model_type edited)."""
    files = " and ".join(f.name for f in weights_files(path))
    prefix = names_of(model).prefix + "."
    total = sum(1 for k in model.state_dict()
                if (k.startswith(prefix) or not has_backbone_prefix(model)) and ".pooler." not in f".{k}")
    shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
    if len(missing) < total:
        return (f"{path}: {len(missing)} of the {model_type} backbone's {total} tensors are not in {files} ({shown}); "
                "config.json does not describe these weights. Only a task head may be new")
    holders = [t for t, row in FAMILIES.items() if t != model_type and any(k.startswith(row.names.prefix + ".")
                                                                           for k in state)]
    held = f": it holds {holders[0]}'s" if holders else ""
    return (f"{path}: config.json says {model_type}, but none of the {model_type} backbone's {total} tensors are in "
            f"{files}{held}; set config.json's model_type to the family the weights are of")


def save_pretrained(model: torch.nn.Module, path: str | Path, tokenizer=None) -> None:
    """Write `config.json` and `model.safetensors` that transformers' matching class loads unchanged."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in to_hf_state_dict(model).items()}
    atomic_write(path / "model.safetensors", lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    atomic_write(path / "config.json", lambda tmp: model.config.save(tmp, architectures=[model.hf_architecture]))
    if tokenizer is not None:
        tokenizer.save(path)
