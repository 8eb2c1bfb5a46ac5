"""`bertforge finetune` and `bertforge evaluate`: every task of the task table (`tasks/table.py`) on the one loop.

Each run loads the tokenizer, has the task's module build (model, task) from the data, trains with evaluation
every epoch, keeps the best model by the task's main metric (early stopping with `--patience`), and has the task
save it (the Hugging Face layout by default) with its model card where the task writes one. `--seeds 1,2,3`
repeats the run per seed and reports mean ± std. Nothing here knows a task by name.
"""

from __future__ import annotations

import functools
import json
import shutil
import statistics
from dataclasses import replace
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..data.classification import Columns
from ..errors import BertforgeError
from ..heartbeat import phase
from ..interop.hf import heads_from_checkpoint, load_for_task, read_config
from ..jsonfile import dumps
from ..models.config import BertConfig
from ..models.registry import TASK_ARCHITECTURES
from ..safefiles import write_text
from ..settings import FinetuneConfig, TrainConfig, check_seq_len
from ..tasks import task_spec
from ..tasks.table import check_backend
from ..tokenization.kinds import load_tokenizer
from ..tokenization.base import Tokenizer
from . import distributed as dist
from .engines import check_engine, make_trainer
from .runs import claim_output, report, save_run_config


def _model_config(cfg: FinetuneConfig) -> Any:
    """The config of the run's model: its directory's (the folder the task keeps the backbone in), or a preset's (a
    mistyped directory is called missing)."""
    if Path(cfg.model).is_dir():
        return read_config(task_spec(cfg.task).model_folder(cfg))
    return BertConfig.from_preset(cfg.model)


def _load_tokenizer(cfg: FinetuneConfig, config: Any) -> Tokenizer:
    """The run's tokenizer, checked against the model (`config`): every id it can give must have an embedding."""
    if Path(cfg.model).is_dir():
        model = str(task_spec(cfg.task).model_folder(cfg))
        tokenizer = load_tokenizer(cfg.tokenizer or model)
        largest = max(tokenizer.get_vocab().values())
        if largest >= config.vocab_size:
            source = cfg.tokenizer or f"{model}'s tokenizer"
            raise BertforgeError(f"{source} gives ids up to {largest:,}, but {model} embeds only "
                                 f"{config.vocab_size:,} (vocab_size in its config.json); use the tokenizer the model "
                                 "was trained with")
        own = _has_tokenizer(model) and cfg.tokenizer
        if own and load_tokenizer(model).get_vocab() != tokenizer.get_vocab():
            # Its embeddings would be trained under ids that name other tokens, as distill refuses for a student.
            raise BertforgeError(f"--tokenizer {cfg.tokenizer}: its vocabulary is not the checkpoint's ({cfg.model} "
                                 "holds its own tokenizer); fine-tune with the tokenizer the model was trained with")
        return tokenizer
    if not cfg.tokenizer:
        raise BertforgeError(f"--model {cfg.model} is a preset: give --tokenizer DIR with its vocabulary")
    return load_tokenizer(cfg.tokenizer)


def _checked(cfg: FinetuneConfig) -> Tokenizer:
    """Refuse a --seq-len the model cannot hold (the task works out a length left to it when it builds) and load
    the run's checked tokenizer."""
    config = _model_config(cfg)
    if cfg.seq_len is not None:
        check_seq_len(cfg.seq_len, config)
    return _load_tokenizer(cfg, config)


def _has_tokenizer(folder: str) -> bool:
    """Whether a checkpoint directory holds a tokenizer of its own (any kind's files)."""
    from ..errors import TokenizerError
    from ..tokenization.kinds import kind_of_files

    try:
        kind_of_files(folder)
    except TokenizerError:
        return False
    return True


def build(cfg: FinetuneConfig, tokenizer: Tokenizer, train_path: str, dev_path: str, model=None):
    """(model, task) for a config, from the task's own module; a given `model` is evaluated as it is."""
    return task_spec(cfg.task).build(cfg, tokenizer, train_path, dev_path, model)


class WithoutDev:
    """A task trained without --dev (as sentence-transformers' trainers and transformers' run_glue train without an
    evaluator): it evaluates to no metrics, so the loop selects nothing and the final model is written."""

    def __init__(self, task: Any) -> None:
        self.task = task

    def __getattr__(self, name: str) -> Any:
        return getattr(self.task, name)

    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        return {}


def _run_one(cfg: FinetuneConfig, out: Path, tokenizer: Tokenizer | None = None) -> dict[str, Any]:
    """One run in `out`; `tokenizer`: the one `run_finetune` loaded for this very run (each seed loads its own, so
    that no seed sees what another's save changed in it)."""
    if cfg.resume and (out / "eval_results.json").is_file() and not (out / "checkpoints").is_dir():
        return json.loads((out / "eval_results.json").read_text(encoding="utf-8"))  # this seed had finished
    torch.manual_seed(cfg.seed)
    if tokenizer is None:
        tokenizer = _checked(cfg)
    resuming = cfg.resume and (out / "checkpoints").is_dir()
    with phase("reading and tokenising the data"), heads_from_checkpoint(resuming):
        model, task = build(cfg, tokenizer, cfg.train, cfg.dev)
    results = train_and_export(cfg, out, model, task if cfg.dev else WithoutDev(task), tokenizer)
    if dist.is_main():
        write_text(out / "eval_results.json", dumps(results, indent=2) + "\n")
        retire_checkpoints(out)
    return results


def retire_checkpoints(out: Path) -> None:
    """Remove OUT/checkpoints/ once the run's last file (eval_results.json) is written, and not before: a run killed
    while it writes its model, curves, card or results still holds the checkpoint its `--resume` finishes from
    (without a step), where removing them first left a half-written directory that `--resume` refused."""
    shutil.rmtree(out / "checkpoints", ignore_errors=True)


def train_and_export(cfg: FinetuneConfig, out: Path, model: torch.nn.Module, task: Any, tokenizer: Tokenizer,
                     title: str | None = None) -> dict[str, Any]:
    """Train `model` on `task` with the run's settings, keep the best by the task's metric, write it to `out` in
    the Hugging Face layout (with the tokenizer) and its curves; returns the selected model's results.
    Shared by `finetune` and `distill`."""
    if dist.is_main():
        save_run_config(out, cfg)
    # Evaluate every epoch unless --eval-every says otherwise; keep the best model by the task's metric.
    train_cfg = TrainConfig.of(cfg, out=str(out), eval_each_epoch=not cfg.eval_every and bool(cfg.dev),
                               select_metric=task.main_metric, greater_is_better=task.greater_is_better)
    run_info = {"task": cfg.task, "model": cfg.model, "train": cfg.train, "seq_len": task.seq_len, "lr": cfg.lr,
                "batch_size": cfg.batch_size, "seed": cfg.seed}
    trainer = make_trainer(model, task, train_cfg, run_info, task.seq_len, tokenizer.pad_token_id)
    summary = trainer.fit(resume=cfg.resume and (out / "checkpoints").is_dir())
    trainer.restore_best()  # export the selected model, not the last one
    dist.barrier()  # every rank is past its last checkpoint before rank 0 writes the result (and later removes them)
    if dist.is_main():  # in a torchrun job, rank 0 writes (every rank holds the same weights)
        task.save(model, out, tokenizer)  # the task's own layout (an embedder's sentence-transformers modules)
        from ..viz import plot_curves

        plot_curves(out / "metrics.jsonl", out / "curves.png", title=title or f"fine-tuning ({cfg.task})")
    results = {"task": cfg.task, "metric": task.main_metric, "selected_step": summary["best_step"],
               **(summary["best_metrics"] or summary["eval"]), "seconds": round(summary["elapsed"], 1)}
    if not cfg.dev:
        results["note"] = (f"no --dev: no model was selected; {out} holds the final step's "
                           f"({summary['step']}) model")
    if summary.get("compile_seconds") is not None:  # --backend jax: the step's one-off compile, within seconds
        results["compile_seconds"] = round(summary["compile_seconds"], 1)
    if summary.get("kernel_compile_seconds") is not None:  # a first run on this machine: not in `seconds`
        results["kernel_compile_seconds"] = round(summary["kernel_compile_seconds"], 1)
    if dist.is_main():
        task.write_card(out, cfg, results)
    return results


def run_finetune(cfg: FinetuneConfig, as_json: bool = True) -> dict[str, Any]:
    """One run, or one per seed with mean and std; results also in OUT/eval_results.json.

    The result is printed at the end: one JSON object with `as_json`, else a readable block.
    """
    check_backend(cfg)  # a task the table lacks, or one --backend jax does not train, is refused by name
    tokenizer = _checked(cfg)  # a missing model or tokenizer is refused before --out is touched
    check_engine(cfg)
    dist.init()  # under torchrun: one run, its processes splitting each global batch
    try:
        return run_seeds(cfg, _run_one if cfg.seeds else functools.partial(_run_one, tokenizer=tokenizer), as_json,
                         "fine-tuning")
    finally:
        dist.cleanup()


def run_seeds(cfg: FinetuneConfig, run_one: Callable[[Any, Path], dict[str, Any]], as_json: bool,
              what: str) -> dict[str, Any]:
    """`run_one(cfg, out)` once in --out, or once per --seeds in OUT/seed-N with the mean and std of every
    figure in OUT/eval_results.json (finetune's and distill's)."""
    out = claim_output(cfg, extra=("seed-*",))
    dist.barrier()  # every rank has checked --out as the user left it before rank 0 writes there
    if not cfg.seeds:
        result = run_one(cfg, out)
        if dist.is_main():
            report(result, as_json, title=f"{what} done: the model is in {out}/")
        return result
    seeds = [int(s) for s in cfg.seeds.split(",") if s.strip()]
    runs = []
    for seed in seeds:
        one = replace(cfg, seed=seed, seeds=None)  # the settings as the user gave them, with this seed
        runs.append(run_one(one, out / f"seed-{seed}"))
        if dist.is_main():  # in a torchrun job, rank 0 reports
            report({"seed": seed, **runs[-1]}, as_json, title=f"seed {seed}: the model is in {out / f'seed-{seed}'}/")
    keys = [k for k, v in runs[0].items() if isinstance(v, float)]
    summary = {"task": cfg.task, "seeds": seeds,
               **{k: {"mean": statistics.mean(r[k] for r in runs),
                      "std": statistics.stdev(r[k] for r in runs) if len(runs) > 1 else 0.0} for k in keys}}
    if dist.is_main():
        write_text(out / "eval_results.json", dumps(summary, indent=2) + "\n")
        report(summary, as_json, title=f"{what} done over {len(seeds)} seeds (mean and std)")
    return summary


def run_evaluate(task: str, model_dir: str, data: str, seq_len: int | None = None, batch_size: int = 32,
                 columns: Columns | None = None, predictions: str | None = None) -> dict[str, Any]:
    """Metrics of a fine-tuned checkpoint on a labelled file (and its predictions, one JSON per line)."""
    model = load_for_task(task, model_dir, TASK_ARCHITECTURES[task])
    tokenizer = load_tokenizer(model_dir)
    columns = columns or Columns()
    if seq_len is not None:  # asked for: honoured or refused, never cut to the model's length unsaid
        check_seq_len(seq_len, model.config)
    seq_len = seq_len or task_spec(task).evaluate_seq_len
    cfg = FinetuneConfig(task=task, model=model_dir, train="-", dev=data,
                         seq_len=min(seq_len, model.config.max_sequence_length), batch_size=batch_size,
                         text_column=columns.text, pair_column=columns.pair, label_column=columns.label,
                         progress=False)
    model, scorer = build(cfg, tokenizer, "", data, model=model)
    model.eval()
    metrics = scorer.evaluate(model)
    if predictions:
        rows = scorer.prediction_rows(model)
        lines = [rows] if isinstance(rows, dict) else rows  # one object for the file, or one per example
        write_text(predictions, "".join(dumps(r) + "\n" for r in lines))
    return metrics
