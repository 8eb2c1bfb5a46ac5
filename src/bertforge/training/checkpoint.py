"""Training checkpoints: atomic saves and everything an exact resume needs.

A checkpoint is a directory `OUT/checkpoints/step-00001234/` holding
- `config.json` + `model.safetensors`: the model, in the Hugging Face layout;
- `training_state.pt`: optimizer state and torch RNG state (tensors only, read back with
  `torch.load(weights_only=True)`);
- `best.safetensors`: the best evaluation's weights so far, when a metric selects the model;
- `trainer_state.json`: step, epoch, data position, schedule, python and numpy RNG states,
  and the run configuration it was made with.

It is written into a hidden temporary directory, flushed to the disk (`fsync`) and renamed into
place, so a crash, a SIGKILL or a power cut mid-save leaves the previous checkpoint intact and no
half-written one visible. A full or read-only disk is said in one line naming the checkpoint that
is intact.
Only the last `keep_last` checkpoints are kept.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..errors import CheckpointError
from ..safefiles import fsync_path, fsync_tree, refusing_writes
from . import distributed as dist

_STEP_DIR = re.compile(r"^step-(\d{8})$")

# trainer_state.json's layout. A checkpoint names the version it was written in; one this bertforge does not know,
# or a key missing or unknown, is refused: read as best it could be, it would restart the epoch's data (or worse)
# and the resumed model would differ from the uninterrupted run's without a word. Checkpoints from before the field
# existed hold version 1's keys.
FORMAT_VERSION = 1
_STATE_KEYS: dict[str, tuple[type, ...]] = {  # the keys every checkpoint holds, and their JSON types
    "step": (int,), "epoch": (int,), "position": (int,), "horizon": (int, type(None)), "elapsed": (int, float),
    "rng": (dict,), "run": (dict,)}
_OPTIONAL_KEYS = {"format_version", "best", "best_step", "stale_evals", "best_metrics", "config"}


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name) and (p / "trainer_state.json").is_file()]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def latest_checkpoint(root: Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def rng_state() -> dict[str, Any]:
    state = np.random.get_state()
    return {"python": random.getstate(),
            "numpy": [state[0], state[1].tolist(), state[2], state[3], state[4]]}


def set_rng_state(saved: dict[str, Any]) -> None:
    version, internal, gauss = saved["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = saved["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


def save_checkpoint(root: Path, step: int, write: Callable[[Path], None], trainer_state: dict[str, Any],
                    keep_last: int = 2, best_weights: dict[str, torch.Tensor] | None = None,
                    rank_rng: dict[str, list[torch.Tensor]] | None = None) -> Path:
    """Write checkpoint `step` atomically and prune older ones. Returns its directory.

    `write(folder)` puts the engine's files there (`torch_files` for the torch loop; the JAX loop
    writes its own); `best_weights` (a torch state dict) is the model selected so far, saved as
    `best.safetensors`; `trainer_state` goes to `trainer_state.json` with the RNG states;
    `rank_rng` (several processes; `rank_rng_states()`) is each rank's torch RNG states, in `rank_rng.pt`: the
    ranks draw different dropout masks, so each must resume from its own.
    """
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}"
    def intact() -> str:
        last = latest_checkpoint(root)
        return (f"checkpoint {last.name} is intact: free space (or make {root} writable) and run again with "
                "--resume" if last else "no earlier checkpoint exists")

    with refusing_writes(f"checkpoint {final.name} in {root}", root, intact,
                         cleanup=lambda: shutil.rmtree(tmp, ignore_errors=True)):
        if tmp.exists():
            shutil.rmtree(tmp)  # an earlier save of ours that was cut off
        tmp.mkdir()
        write(tmp)
        if best_weights is not None:
            save_file({k: v.contiguous() for k, v in best_weights.items()}, tmp / "best.safetensors")
        if rank_rng is not None:
            torch.save(rank_rng, tmp / "rank_rng.pt")
        state = dict(trainer_state, format_version=FORMAT_VERSION, step=step, rng=rng_state())
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
        fsync_tree(tmp)  # on the disk before its name says it is complete
    if final.exists():  # the same step saved again (e.g. the final save right after a periodic one)
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_path(root)
    for old in list_checkpoints(root)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def torch_files(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[Path], None]:
    """The torch loop's checkpoint files: the model (HF layout) and `training_state.pt`."""
    def write(folder: Path) -> None:
        parts = model.checkpoint_parts() if hasattr(model, "checkpoint_parts") else {"": model}
        for sub, part in parts.items():
            part.save_pretrained(folder / sub)
        if hasattr(model, "extra_state"):  # weights outside the parts (a sentence encoder's Dense layers)
            save_file({k: v.detach().contiguous().cpu() for k, v in model.extra_state().items()},
                      folder / "extra.safetensors")
        tensors = {"optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state()}
        if torch.cuda.is_available():
            tensors["cuda_rng"] = torch.cuda.get_rng_state_all()
        torch.save(tensors, folder / "training_state.pt")
    return write


def read_trainer_state(path: Path) -> dict[str, Any]:
    """`trainer_state.json` of checkpoint `path`, its version and every key checked (refused in one line)."""
    file = path / "trainer_state.json"
    try:
        state = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read checkpoint ({exc})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{file}: holds a JSON {type(state).__name__}, not the object bertforge writes")
    version = state.get("format_version", 1)
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise CheckpointError(f"{file}: format_version {version!r} is not one this bertforge reads (it reads "
                              f"{FORMAT_VERSION}); resume it with the bertforge that wrote it")
    for key, types in _STATE_KEYS.items():
        if key not in state:
            raise CheckpointError(f"{file}: key '{key}' is missing; the run cannot resume where it stopped "
                                  "without it (start a new --out, or restore the file)")
        if not isinstance(state[key], types) or isinstance(state[key], bool):
            raise CheckpointError(f"{file}: key '{key}' is {state[key]!r}, not "
                                  f"{' or '.join('null' if t is type(None) else t.__name__ for t in types)}")
    unknown = sorted(set(state) - set(_STATE_KEYS) - _OPTIONAL_KEYS)
    if unknown:
        raise CheckpointError(f"{file}: key '{unknown[0]}' is not one bertforge writes in format_version "
                              f"{FORMAT_VERSION}; was the file edited, or written by another version?")
    return state


def _tensor_file(file: Path, keys: tuple[str, ...]) -> dict[str, Any]:
    """A checkpoint's torch file (the optimizer's state, the RNG states): read with `weights_only=True`, which
    refuses to run what a crafted pickle holds; that refusal, a damaged file and a file without `keys` are one
    line naming the file."""
    import pickle

    try:
        tensors = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(f"{file}: refused to load: it holds more than tensors and plain values, which no "
                              f"bertforge checkpoint does, and unpickling it could run code "
                              f"({str(exc).splitlines()[0]}); resume from a checkpoint you trust") from None
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        raise CheckpointError(f"{file}: cannot read checkpoint ({exc})") from None
    missing = [k for k in keys if not isinstance(tensors, dict) or k not in tensors]
    if missing:
        raise CheckpointError(f"{file}: not a bertforge checkpoint's state (no '{missing[0]}')")
    return tensors


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore model, optimizer and RNG states from `path`; returns the trainer state dict."""
    from ..interop.hf import from_hf_state_dict, read_weights

    state = read_trainer_state(path)
    tensors = _tensor_file(path / "training_state.pt", ("optimizer", "torch_rng"))
    # A model of several parts (ELECTRA's generator and discriminator) keeps each in its own subfolder.
    parts = model.checkpoint_parts() if hasattr(model, "checkpoint_parts") else {"": model}
    for sub, part in parts.items():
        report = from_hf_state_dict(part, read_weights(path / sub / "model.safetensors"), source=str(path / sub))
        if report.missing_keys:
            raise CheckpointError(f"{path / sub}: checkpoint lacks {', '.join(report.missing_keys[:3])}")
    # A model with no extra weights (a plain SPLADE model) may come from a checkpoint written without the file.
    if hasattr(model, "extra_state") and (model.extra_state() or (path / "extra.safetensors").exists()):
        try:
            model.load_extra_state(load_file(path / "extra.safetensors"))
        except (OSError, SafetensorError, RuntimeError) as exc:
            raise CheckpointError(f"{path / 'extra.safetensors'}: cannot read ({exc})") from None
    optimizer.load_state_dict(tensors["optimizer"])
    torch.set_rng_state(tensors["torch_rng"])
    if "cuda_rng" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(tensors["cuda_rng"])
    set_rng_state(state["rng"])
    return state


def rank_rng_states() -> dict[str, list[torch.Tensor]] | None:
    """Every rank's torch RNG states in rank order, on every rank (each rank must call it; None for one process):
    `torch_rng`, the CPU generator's, and on a GPU `cuda_rng`, the generator of the one device the rank trains on.
    `training_state.pt` holds rank 0's states alone: each rank's own device generator is its dropout stream, and
    restoring rank 0's on every rank would make a multi-GPU resume differ from the uninterrupted run."""
    cpu = dist.gather_cpu(torch.get_rng_state())
    if cpu is None:
        return None
    states = {"torch_rng": cpu}
    here = dist.device()
    if here.type == "cuda":
        states["cuda_rng"] = dist.gather_cpu(torch.cuda.get_rng_state(here))
    return states


def load_rank_rng(path: Path, rank: int, world: int) -> None:
    """Restore this rank's torch RNG states (`rank_rng_states`) from checkpoint `path`, when it holds one per rank
    of this world: the CPU generator's, and its own device's when both the checkpoint and this process have one."""
    file = path / "rank_rng.pt"
    if not file.is_file():
        return
    states = _tensor_file(file, ("torch_rng",))
    if len(states["torch_rng"]) != world:
        return
    torch.set_rng_state(states["torch_rng"][rank])
    here = dist.device()
    if "cuda_rng" in states and here.type == "cuda":
        torch.cuda.set_rng_state(states["cuda_rng"][rank], here)


def load_best_weights(path: Path) -> dict[str, torch.Tensor] | None:
    """The selected model's state dict saved with checkpoint `path`, if any."""
    best = path / "best.safetensors"
    if not best.is_file():
        return None
    try:
        return load_file(best)
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"{best}: cannot read ({exc})") from None
