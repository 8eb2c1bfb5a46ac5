"""The training loop's settings, which every training command is made of: `LoopSettings` (optimisation, stopping
rule, precision, seed), `EvalSettings` (when to evaluate, which model to keep), `OutputSettings` (where a run
writes, how often it saves, resume and overwrite), and `TrainConfig`, the three together: all the one loop
(`training.trainer.Trainer`) reads."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, fields
from typing import Any

from ..errors import ConfigError
from .fields import Settings, flag, parse_duration, setting


@dataclass
class LoopSettings(Settings):
    """What the training loop does each step, and when it stops."""

    batch_size: int = setting(32, "examples per micro-batch, per process")
    grad_accum: int = setting(1, "micro-batches per optimizer step, per process")
    lr: float = setting(1e-4, "peak learning rate")
    warmup: float = setting(0.01, "warmup: a fraction of the total steps if < 1, else a number of steps")
    weight_decay: float = setting(0.01, "decoupled weight decay (not on biases and LayerNorm)")
    optimizer: str = setting("adamw", "adamw or lamb")
    max_grad_norm: float = setting(1.0, "clip the global gradient norm (0 = off)")
    max_steps: int | None = setting(None, "stop after this many optimizer steps")
    epochs: float | None = setting(None, "stop after this many passes over the data")
    time_budget: float | None = setting(None, "stop after this long, in seconds or as 30m, 2h")
    precision: str = setting("auto", "fp32, bf16 (autocast, fp32 master weights), or auto: bf16 where the CPU or "
                                     "GPU has native bf16 (AMX, AVX512-BF16, Ampere+), else fp32")
    matmul: str = setting("auto", "fp32 CPU training's linear layers: torch (its BLAS, MKL on x86), onednn, or "
                                  "auto: the faster of the two per layer shape, measured once per machine")
    compile: bool = setting(False, "torch.compile the model")
    deterministic: bool = setting(False, "deterministic GPU kernels (torch.use_deterministic_algorithms), so that a "
                                         "CUDA run and its resume repeat bit for bit; slower. CPU runs always do")
    pack: bool = setting(False, "pack several examples per row (block-diagonal attention): same loss, fewer rows")
    seed: int = setting(0, "seed of every random choice: data order, masking, dropout, new weights")
    backend: str = setting("torch", "torch, or jax (Flax NNX; pip install \"bertforge[jax]\")")

    def fill(self) -> None:
        if isinstance(self.time_budget, str):  # a config file may say "30m"
            self.time_budget = parse_duration(self.time_budget)

    def check(self) -> None:
        for name in ("batch_size", "grad_accum"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{flag(name)} must be at least 1")
        for name in ("lr", "warmup", "weight_decay", "max_grad_norm"):
            if not math.isfinite(getattr(self, name)):
                raise ConfigError(f"{flag(name)} must be a finite number")
        if self.lr <= 0:
            raise ConfigError(f"{flag('lr')} must be positive")
        if self.warmup < 0:
            raise ConfigError(f"{flag('warmup')} must be >= 0")
        if self.optimizer not in ("adamw", "lamb"):
            raise ConfigError(f"{flag('optimizer')} must be adamw or lamb, not {self.optimizer!r}")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ConfigError(f"{flag('precision')} must be auto, fp32 or bf16, not {self.precision!r}")
        if self.matmul not in ("auto", "torch", "onednn"):
            raise ConfigError(f"{flag('matmul')} must be auto, torch or onednn, not {self.matmul!r}")
        if self.backend not in ("torch", "jax"):
            raise ConfigError(f"{flag('backend')} must be torch or jax, not {self.backend!r}")
        if self.backend == "jax":  # what the JAX engine does not do (yet): refused, never ignored
            for name, torch_only in (("optimizer", self.optimizer != "adamw"), ("precision", self.precision == "bf16"),
                                     ("matmul", self.matmul != "auto"),
                                     ("compile", self.compile), ("pack", self.pack),
                                     ("deterministic", self.deterministic)):
                if torch_only:
                    raise ConfigError(f"{flag(name)} {getattr(self, name)} is not available with --backend jax")
        if self.pack and self.compile:
            raise ConfigError("pack (--pack) and compile (--compile) cannot be combined: packed rows are found "
                              "from the data, which a compiled graph cannot look at")
        for name in ("max_steps", "epochs", "time_budget"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"{flag(name)} must be positive")


@dataclass
class EvalSettings(Settings):
    """When the loop evaluates, and which model it keeps."""

    eval_every: int | None = setting(None, "steps between evaluations (default: at the end only; "
                                           "finetune: every epoch)")
    patience: int | None = setting(None, "stop after this many evaluations without improvement")
    eval_each_epoch: bool = setting(False, "evaluate at the end of every epoch", cli=False)
    select_metric: str | None = setting(None, "keep the model with the best value of this metric", cli=False)
    greater_is_better: bool = setting(True, "whether a higher select_metric is better", cli=False)

    def check(self) -> None:
        for name in ("eval_every", "patience"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{flag(name)} must be at least 1")


@dataclass
class OutputSettings(Settings):
    """Where a run writes, how often it saves and logs, and what it may replace."""

    out: str = setting("run", "output directory")
    overwrite: bool = setting(False, "reuse a non-empty --out, replacing what an earlier run wrote there")
    resume: bool = setting(False, "continue the run in --out from its last checkpoint")
    save_every: int | None = setting(500, "steps between checkpoints (none: at the end only)")
    save_every_minutes: float | None = setting(30.0, "minutes between checkpoints, whatever the step count, so "
                                                     "that a killed run loses at most this much (none: by steps only)")
    keep_last: int = setting(2, "checkpoints kept")
    log_every: int = setting(10, "steps between metrics.jsonl rows")
    progress: bool | None = setting(None, "show a progress bar (default: when stderr is a terminal)")

    def fill(self) -> None:
        if self.progress is None:
            self.progress = sys.stderr.isatty()

    def check(self) -> None:
        if self.resume and self.overwrite:
            raise ConfigError("resume (--resume) and overwrite (--overwrite) contradict each other; pick one")
        for name in ("keep_last", "log_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{flag(name)} must be at least 1")
        if self.save_every is not None and self.save_every < 1:
            raise ConfigError(f"{flag('save_every')} must be at least 1")
        if self.save_every_minutes is not None and not self.save_every_minutes > 0:
            raise ConfigError(f"{flag('save_every_minutes')} must be positive")


@dataclass
class TrainConfig(LoopSettings, EvalSettings, OutputSettings):
    """Everything the one training loop reads; `pretrain` and `finetune` add their data and model."""

    @classmethod
    def of(cls, run: "TrainConfig", **changes: Any) -> "TrainConfig":
        """The loop's settings out of a run's config (a `PretrainConfig`, a `FinetuneConfig`)."""
        return cls(**{**{f.name: getattr(run, f.name) for f in fields(cls)}, **changes})

    def check(self) -> None:
        if self.max_steps is None and self.epochs is None and self.time_budget is None:
            raise ConfigError("give a stopping rule: max_steps (--max-steps), epochs (--epochs) or "
                              "time_budget (--time-budget)")
