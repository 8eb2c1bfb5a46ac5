"""The life of a training run, shared by `pretrain` and `finetune`: claim the output directory,
save the settings, and report the result.

Output-directory policy (one rule for every run):
- a new or empty `--out` is used as it is;
- a non-empty one is refused unless `--overwrite` (start again there) or `--resume` (continue
  from its last checkpoint) is given;
- `--overwrite` removes only what a bertforge run writes there; any other file stays;
- an `--out` that is, contains or lies inside one of the run's inputs (`--model`, `--tokenizer`,
  the data) is refused, so no run can delete what it reads;
- one run at a time: the directory is locked (`OUT/.bertforge.lock`) before anything in it changes.

Each run writes `OUT/run_config.json`, the settings it ran with, which `--config` reads back.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from ..errors import BertforgeError
from ..lockfile import LOCK_NAME, check_not_in_use, lock_directory
from ..settings import saved_settings
from ..safefiles import write_text
from . import distributed as dist

RUN_FILES = ("checkpoints", "best", "generator", "metrics.jsonl", "curves.png", "run_config.json", "pretrain_results.json",
             "eval_results.json", "config.json", "model.safetensors", "vocab.txt", "tokenizer.json",
             "tokenizer_config.json", "special_tokens_map.json")
"""What a run may have written in its output directory, and so what `--overwrite` may remove."""


INPUTS = ("model", "tokenizer", "teacher", "train", "dev", "corpus")
"""Run settings that name files or directories the run reads, which its --out must never touch."""


def check_inputs_apart(cfg: Any, out: Path) -> None:
    """Refuse an --out that is, contains or lies inside one of the run's inputs: writing there (and
    --overwrite's clean-up) could destroy what the run reads."""
    target = out.resolve()
    for name in INPUTS:
        value = getattr(cfg, name, None)
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if not item or not isinstance(item, str) or not Path(item).exists():
                continue  # a preset name, hf:NAME, a glob or "-": nothing on disk to protect
            source = Path(item).resolve()
            if target == source or target in source.parents or source in target.parents:
                relation = "is" if target == source else ("contains" if target in source.parents else "lies inside")
                raise BertforgeError(f"--out {out} {relation} the --{name.replace('_', '-')} input {item}; writing "
                                     "there could destroy it: choose an --out apart from the run's inputs")


def check_own_files(out: Path, names: tuple[str, ...]) -> None:
    """Refuse a run that would replace a file of the user's: each of `names` the run writes into `out` that exists
    there must be one a bertforge run wrote (today: README.md, the model card of a retrieval model)."""
    from .model_card import is_bertforge_card

    for name in names:
        target = out / name
        if name == "README.md" and target.is_file() and not is_bertforge_card(target):
            raise BertforgeError(f"{target}: not a model card bertforge wrote, and the run writes its card there; "
                                 "move the file, or choose another --out (nothing was changed)")


def claim_output(cfg: Any, extra: tuple[str, ...] = ()) -> Path:
    """The run's output directory, checked against `cfg.resume` / `cfg.overwrite` (see module doc) and
    locked against a second run (`bertforge.lockfile`).

    `extra` names further entries this kind of run writes (e.g. finetune's `seed-*` folders).
    Call it on every rank before any rank writes, then `dist.barrier()`.
    """
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise BertforgeError(f"{out}: exists and is not a directory (out, --out)")
    check_inputs_apart(cfg, out)
    if dist.is_main():  # (the other ranks of this run would find rank 0's own lock)
        check_not_in_use(out)  # a run still writing there is named first, whatever else would be said of it
    if cfg.resume:
        if not (out / "checkpoints").is_dir() and not any(out.glob("seed-*/checkpoints")):
            raise BertforgeError(f"{out}: nothing to resume (no checkpoints/ directory); the run either never "
                                 "saved or already finished")
    elif out.exists() and any(p.name != LOCK_NAME for p in out.iterdir()) and not cfg.overwrite:
        raise BertforgeError(f"{out}: directory exists and is not empty; pass --overwrite to start again there, "
                             "--resume to continue its run, or choose another --out")
    from ..tasks import TASKS

    if getattr(cfg, "task", None) in TASKS and TASKS[cfg.task].card:  # a README.md model card: ours to replace
        check_own_files(out, ("README.md",))
    if dist.is_main():
        lock_directory(out)  # before anything is deleted or written: one run per directory
        if cfg.overwrite and not cfg.resume:
            for pattern in (*RUN_FILES, *extra):
                for target in out.glob(pattern):
                    shutil.rmtree(target) if target.is_dir() else target.unlink()
    return out


def save_run_config(out: Path, cfg: Any) -> None:
    """OUT/run_config.json: the settings of this run, readable by `--config`."""
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "run_config.json", json.dumps(saved_settings(cfg), indent=2) + "\n")


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return "  ".join(f"{k} {_format(v)}" for k, v in value.items())
    return str(value)


def report(result: dict[str, Any], as_json: bool, title: str) -> None:
    """Print a run's result: one JSON object (`--json`, for machines), or an aligned summary."""
    if as_json:
        print(json.dumps(result), flush=True)
        return
    print(title, flush=True)
    width = max((len(k) for k in result), default=0)
    for key, value in result.items():
        print(f"  {key:<{width}}  {_format(value)}", flush=True)
