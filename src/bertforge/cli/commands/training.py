"""Commands that train: pretrain, finetune TASK and distill TASK (one subcommand per row of the task table), distill
mlm, demo."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from ...settings import DistillConfig, DistillMLMConfig, PretrainConfig
from ...tasks import TASKS
from ..build import command, settings_from
from .apps import app, distill_app, finetune_app


@command(app, "pretrain", settings=PretrainConfig, settings_skip=frozenset({"corpus"}))
def pretrain(corpus: list[str], *, config: str | None = None, json: bool = False, ctx: typer.Context | None = None,
             **settings: Any) -> None:
    """Pretrain BERT (MLM + NSP) on raw text; no corpus = the embedded default.

    Masked-LM and next-sentence prediction as google-research/bert does it, or MLM only on packed
    full sentences (--objective mlm). With no CORPUS it pretrains a tiny model for three minutes
    on the docstrings of Python's standard library. A run writes OUT/run_config.json, which
    --config reads back.

    Args:
        corpus: files, dirs, globs, hf:NAME, or a `bertforge prepare` directory (none: the embedded corpus)
        config: a JSON or YAML file of these settings (flags given here override it)
        json: print the final summary as one JSON object
    """
    from ...training.pretrain import run_pretrain

    cfg = settings_from(PretrainConfig, {**settings, "corpus": list(corpus or [])}, config, ctx)
    run_pretrain(cfg, as_json=json)


_SETTINGS_ARGS = """

    Args:
        config: a JSON or YAML file of these settings (flags given here override it)
        json: print the final summary as one JSON object
    """
_FINETUNE_COMMON = """

    Each run evaluates every epoch (or every --eval-every steps), keeps the best model, and writes
    a Hugging Face model directory and OUT/run_config.json, which --config reads back."""


def _finetune_command(task: str) -> None:
    """`bertforge finetune TASK`: one subcommand per task, each its config class's flags with its task set."""
    settings_class = TASKS[task].settings

    def finetune(*, config: str | None = None, json: bool = False, ctx: typer.Context | None = None,
                 **settings: Any) -> None:
        from ...training.finetune import run_finetune

        run_finetune(settings_from(settings_class, settings, config, ctx, task=task), as_json=json)

    finetune.__name__ = finetune.__qualname__ = f"finetune_{task}"
    finetune.__doc__ = TASKS[task].summary + _FINETUNE_COMMON + _SETTINGS_ARGS
    command(finetune_app, task, settings=settings_class)(finetune)


for _task in TASKS:
    _finetune_command(_task)


def _distill_command(task: str) -> None:
    """`bertforge distill TASK`: one subcommand per task, each `DistillConfig`'s flags with its task set."""

    def distill(*, config: str | None = None, json: bool = False, ctx: typer.Context | None = None,
                **settings: Any) -> None:
        from ...training.distill import run_distill

        run_distill(settings_from(DistillConfig, settings, config, ctx, task=task), as_json=json)

    distill.__name__ = distill.__qualname__ = f"distill_{task}"
    distill.__doc__ = TASKS[task].distill + _SETTINGS_ARGS
    command(distill_app, task, settings=DistillConfig)(distill)


for _task in (name for name, spec in TASKS.items() if spec.distill):
    _distill_command(_task)


@command(distill_app, "mlm", settings=DistillMLMConfig, settings_skip=frozenset({"corpus"}))
def distill_mlm(corpus: list[str], *, config: str | None = None, json: bool = False,
                ctx: typer.Context | None = None, **settings: Any) -> None:
    """Task-agnostic distillation: a smaller masked-LM student of a teacher, on raw text.

    DistilBERT's recipe on pretraining's corpus readers, prepared shards, loop, checkpoints,
    exact resume and torchrun: the student (the teacher's every other layer by default, written
    as a DistilBERT when the teacher is a BERT) learns the teacher's soft targets at masked
    positions, its own masked-LM loss and the direction of the teacher's hidden states
    (--alpha-ce, --alpha-mlm, --alpha-cos).

    Args:
        corpus: files, dirs, globs, hf:NAME, or a `bertforge prepare` directory (none: the embedded corpus)
        config: a JSON or YAML file of these settings (flags given here override it)
        json: print the final summary as one JSON object
    """
    from ...training.pretrain import run_pretrain

    run_pretrain(settings_from(DistillMLMConfig, {**settings, "corpus": list(corpus or [])}, config, ctx),
                 as_json=json)


@command(app, "demo")
def demo(*, out: str = "bertforge-demo", model: str = "tiny", seed: int = 0, overwrite: bool = False) -> None:
    """Offline end-to-end tour: tokenizer, tiny model, save, reload, fill-mask.

    Trains a vocabulary on the standard library's docstrings, builds a tiny BERT, runs MLM+NSP
    forward, saves in the Hugging Face layout, reloads and fills masks.

    Args:
        out: output directory
        model: size preset
        seed: seed of the new weights
        overwrite: allow writing into a non-empty --out
    """
    from ..demo import run_demo

    run_demo(Path(out), preset=model, seed=seed, overwrite=overwrite)
