"""The one training loop. Pretraining and every fine-tuning task differ only by their `Task`.

A task supplies batches by (epoch, micro-batch index), computes a loss on one batch, and
evaluates. The loop supplies the rest: AdamW or LAMB, warmup + linear decay, gradient
accumulation, clipping, autocast, torch.compile, DDP, logging (progress bar,
metrics.jsonl, a curves PNG), evaluation, atomic checkpoints, exact resume, and the
stopping rules (--max-steps, --epochs, --time-budget).

Data order is a pure function of (seed, epoch, index): with W processes and A accumulation
steps, optimizer step s of an epoch consumes micro-batches s*A*W ... s*A*W + A*W - 1, and
process r takes index a*W + r at accumulation step a. So a resumed run continues at the
saved (epoch, position) with no replay, no skipping and no scan, and W processes with A
steps see exactly the batches one process sees with W*A steps.
"""

from __future__ import annotations

import contextlib
import json
import math
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import torch

from .. import invocation, kernels
from ..errors import BertforgeError, NothingToDo, Stopped
from ..heartbeat import phase
from ..jsonfile import dumps
from ..settings import TrainConfig
from . import distributed as dist
from .checkpoint import (
    latest_checkpoint,
    load_best_weights,
    load_checkpoint,
    load_rank_rng,
    rank_rng_states,
    read_trainer_state,
    save_checkpoint,
    torch_files,
)
from .determinism import use_deterministic_algorithms
from .matmul import MATMULS, BucketBF16, MatmulChoice, cache_file
from .memory import OutOfMemory, check_fits, is_allocation_failure
from .optim import build_optimizer, warmup_linear, warmup_steps_for
from .precision import autocast_for, resolve
from .prefetch import Prefetcher


class TrainingDiverged(BertforgeError):
    """The loss became NaN or infinite."""

    exit_code = 3


class Task(Protocol):
    """What a training task provides to the loop."""

    def micro_batches_per_epoch(self, epoch: int) -> int: ...

    def micro_batch(self, epoch: int, index: int) -> dict[str, torch.Tensor]: ...

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The scalar loss to minimise and its named parts (detached), for one micro-batch."""
        ...

    def evaluate(self, model: torch.nn.Module) -> dict[str, float]: ...

    # Optional: `begin_step(step, total_steps or None)` before each optimizer step, for a loss with a schedule.


class Trainer:
    """Runs a `Task` on a model to the stopping rule, checkpointing and logging along the way."""

    def __init__(self, model: torch.nn.Module, task: Task, config: TrainConfig, run_info: dict[str, Any] | None = None):
        self.config = config
        self.task = task
        self.out = Path(config.out)
        self.device = dist.device()
        if config.deterministic:  # before the model's first product on the device
            use_deterministic_algorithms()
        self.model = model.to(self.device)
        self.run_info = run_info or {}
        self.world = dist.world_size()
        self.rank = dist.rank()
        self.optimizer = self._make_optimizer()
        # The next micro-batch is built while this one trains, on a GPU (`prefetch.py`).
        self.batches = Prefetcher(self.task.micro_batch, enabled=self.device.type != "cpu")
        self.train_model = dist.wrap(torch.compile(self.model) if config.compile else self.model)
        self._set_precision(*resolve(config.precision, self.device))
        # fp32 CPU linears on torch's BLAS or oneDNN, per shape (`matmul.py`). The choices are part of the
        # run's settings (the same dict), so every checkpoint carries them and a resume keeps them.
        self.matmuls = MatmulChoice(config.matmul, measure=self.world == 1)
        self.run_info.update(matmul=config.matmul, matmuls=self.matmuls.choices)
        self.metrics_file = self.out / "metrics.jsonl"
        self.checkpoints = self.out / "checkpoints"
        self.state: dict[str, Any] = {"epoch": 0, "position": 0, "horizon": None, "elapsed": 0.0,
                                      "best": None, "best_step": None, "stale_evals": 0}
        # The weights of the best evaluation so far (with a select_metric), on the CPU: kept in
        # memory, and saved with each checkpoint so that a resumed run still knows them.
        self.best_weights: dict[str, torch.Tensor] | None = None
        # The file a finished run leaves (pretrain_results.json): with it, `--resume` has nothing to do.
        self.result_file: Path | None = None
        # Called once the run is known to train (after that check): where the caller records its settings.
        self.on_start: Callable[[], None] | None = None

    def _set_precision(self, precision: str, why: str) -> None:
        """Use `precision` (fp32 or bf16): it is part of the run's settings, so a resume keeps it."""
        self.precision, self.precision_reason = precision, why
        self.autocast = autocast_for(precision, self.device)
        self.run_info["precision"] = precision

    # ------------------------------------------------------------------ schedule
    def _steps_per_epoch(self, epoch: int) -> int:
        per_step = self.config.grad_accum * self.world
        return self.task.micro_batches_per_epoch(epoch) // per_step

    def _rule_steps(self) -> dict[str, int]:
        """The step each step-counting stopping rule given ends the run at."""
        c, rules = self.config, {}
        if c.max_steps is not None:
            rules["--max-steps"] = c.max_steps
        if c.epochs is not None:
            rules["--epochs"] = max(1, math.ceil(c.epochs * self._steps_per_epoch(0)))
        return rules

    def _initial_horizon(self) -> int | None:
        return min(self._rule_steps().values(), default=None)

    def _last_step(self) -> int | None:
        """The step the run stops at, where it is known: the schedule's end, or a rule that comes first (a resume
        may lower one; the schedule keeps the length it started with, so the steps taken stay the same)."""
        known = [n for n in (self.state["horizon"], *self._rule_steps().values()) if n is not None]
        return min(known) if known else None

    def _resume_note(self, step: int) -> str:
        """What a resumed run will do, in one line: the stopping rules count the whole run, not this session."""
        c, elapsed, horizon = self.config, self.state["elapsed"], self.state["horizon"]
        parts = [f"resuming at step {step}, after {elapsed:.1f} s of training"]
        rules = self._rule_steps()
        first = min(rules, key=rules.get) if rules else None
        if horizon is not None and (first is None or rules[first] >= horizon):
            parts.append(f"it stops at step {horizon}, the end of the learning-rate schedule fixed when it started"
                         + (f" ({first} would reach step {rules[first]})" if first and rules[first] > horizon else ""))
        elif first is not None:
            parts.append(f"it stops at step {rules[first]} ({first}" + (
                f"; the learning-rate schedule keeps its length of {horizon} steps)" if horizon else ")"))
        if c.time_budget is not None:
            left = max(0.0, c.time_budget - elapsed)
            parts.append(f"--time-budget {c.time_budget:g} s counts the whole run, so {left:.1f} s are left"
                         + ("" if left else f" (give more than {elapsed:.0f} to train further)"))
        return "; ".join(parts)

    def _lr_factor(self, step: int) -> float:
        horizon = self.state["horizon"]
        if horizon is None:  # time budget only, before the schedule's length is measured (30 steps)
            return min(1.0, step / 100)
        return warmup_linear(warmup_steps_for(self.config.warmup, horizon), horizon)(step)

    # ------------------------------------------------------------------ resume
    def resume(self) -> int:
        """Load the latest checkpoint under OUT/checkpoints; returns its step."""
        path = latest_checkpoint(self.checkpoints)
        if path is None:
            raise BertforgeError(f"{self.checkpoints}: no checkpoint to resume from")
        # The settings first: a checkpoint of other settings (or another --backend) is refused by
        # name before its files are read.
        saved_run = read_trainer_state(path).get("run", {})
        saved_run.setdefault("precision", "fp32")  # checkpoints from before --precision auto recorded none
        if self.config.precision == "auto" and saved_run["precision"] in ("fp32", "bf16"):
            # What `auto` chose when the run started, not what it would choose here: the resume stays exact.
            self._set_precision(saved_run["precision"], "the precision this run started with")
        if "matmul" not in saved_run:  # checkpoints from before --matmul: every linear ran on torch's BLAS
            saved_run.update(matmul="torch", matmuls={})
        if self.config.matmul == "auto" and saved_run["matmul"] in MATMULS:
            # As for precision: `auto` takes what the run started with, and the choices it made, not new timings.
            self.matmuls.restore(saved_run["matmul"], saved_run.get("matmuls") or {})
            self.run_info["matmul"] = saved_run["matmul"]
        differences = [k for k in sorted(set(saved_run) | set(self.run_info))
                       if k not in _RESUME_FREE and saved_run.get(k) != self.run_info.get(k)]
        if differences:
            k = differences[0]
            raise BertforgeError(f"{path}: cannot resume: '{k}' was {saved_run.get(k)!r} and is now "
                                 f"{self.run_info.get(k)!r}; resume with the same settings, or start a new --out")
        state = self._load_checkpoint(path)
        load_rank_rng(path, self.rank, self.world)
        self.best_weights = load_best_weights(path)
        self.state.update({k: state[k] for k in ("epoch", "position", "horizon", "elapsed", "best", "best_step",
                                                 "stale_evals", "best_metrics") if k in state})
        if dist.is_main() and self.metrics_file.exists():  # drop rows logged after the checkpoint
            rows = [line for line in self.metrics_file.read_text(encoding="utf-8").splitlines()
                    if line.strip() and json.loads(line)["step"] <= state["step"]]
            self.metrics_file.write_text("".join(r + "\n" for r in rows), encoding="utf-8")
        return int(state["step"])

    # ------------------------------------------------------------------ the loop
    def fit(self, resume: bool = False) -> dict[str, Any]:
        """Train to the stopping rule. SIGTERM, SIGINT and SIGUSR1 (what schedulers and Ctrl-C send) end the
        current optimizer step, save a checkpoint and raise `Stopped`, naming it and the command that resumes."""
        with _StopSignals() as signals, phase("training"):
            self._signals = signals
            try:
                return self._fit(resume)
            finally:
                self.batches.close()

    def _fit(self, resume: bool) -> dict[str, Any]:
        c = self.config
        step = self.resume() if resume else 0
        # A resumed run that had already reached its stopping rule trains no further (its learning rate has
        # decayed to zero). If it also wrote its results, there is nothing to do: say so and change nothing.
        finished = self._stop_reason(step) if resume else None
        if finished and self.result_file is not None and self.result_file.is_file():
            raise NothingToDo(f"{self.out}: the run already finished at step {step} ({finished}); nothing to do. "
                              f"To train further, start a new run from its model: --model {self.out} --out NEW")
        if c.backend == "torch":  # before its settings are saved and any step: refused now, not minutes in
            # Texts a forward with gradients holds: a row each, but an embedder's rows are several texts and a
            # GradCache step holds one mini-batch of them (`activation_rows`).
            rows = getattr(self.task, "activation_rows", None)
            check_fits(self.model, c.batch_size, self.run_info.get("seq_len") or 512, c.grad_accum, self.precision,
                       self.device, self._predictions(), native=kernels.enabled(), rows=rows)
        if self.on_start is not None:
            self.on_start()
        if dist.is_main():
            print(f"precision: {self.precision} ({self.precision_reason})", file=sys.stderr, flush=True)
            if resume:
                print(self._resume_note(step), file=sys.stderr, flush=True)
        if not resume:
            self.state["horizon"] = self._initial_horizon()
            if dist.is_main() and self.metrics_file.exists():  # a fresh run's log starts empty
                self.metrics_file.unlink()
        if self._steps_per_epoch(self.state["epoch"]) < 1:
            raise BertforgeError(
                f"the data gives {self.task.micro_batches_per_epoch(self.state['epoch'])} micro-batches of "
                f"{c.batch_size}, fewer than one optimizer step needs ({c.grad_accum * self.world}); "
                "use more text or a smaller --batch-size")
        main = dist.is_main()
        kernel_seconds = self._ready_kernels()  # before the clock: a time budget counts training alone
        bar = self._progress_bar(step) if main and c.progress else None
        window = _Window()
        last_eval: dict[str, float] = {}
        started = time.perf_counter() - self.state["elapsed"]
        saved_at = step if resume else -1
        ten_steps_at = 0.0
        reported_at = time.perf_counter()
        # Stopped after its last checkpoint but before its results were written: finish, without a step.
        stop_reason = finished
        self._saved_clock = time.monotonic()
        if finished and (c.eval_every or c.eval_each_epoch):
            last_eval = self._evaluate()  # its rows are in metrics.jsonl already; the summary needs the numbers
        while stop_reason is None:
            if hasattr(self.task, "begin_step"):  # a loss that follows the schedule (SPLADE's regulariser warm-up)
                self.task.begin_step(step, self.state["horizon"])
            try:
                grad_norm, lr = self._optimizer_step(step, window)
            except RuntimeError as error:
                if not is_allocation_failure(error):
                    raise
                self.optimizer.zero_grad(set_to_none=True)
                raise self._out_of_memory(step, error) from None
            self.batches.settle()  # the task is the loop's alone again (the epoch's size, evaluation)
            step += 1
            self.matmuls.settled = True
            if main and self.matmuls.reasons:  # the shapes first met in this step, and why each library
                print(f"matmuls: {'; '.join(self.matmuls.reasons)} [cache: {cache_file()}]", file=sys.stderr, flush=True)
                self.matmuls.reasons.clear()
            epoch_ended = self._advance_position()
            self.state["elapsed"] = time.perf_counter() - started
            window.step_done(grad_norm, lr)

            if step == 10:
                ten_steps_at = self.state["elapsed"]
            if (self.state["horizon"] is None and c.time_budget and step >= 30
                    and dist.broadcast_flag(self.state["elapsed"] - ten_steps_at >= MEASURE_SHARE * c.time_budget)):
                # Only a time budget: fix the schedule's length once, from the speed of the steps since step 10
                # (the first steps are slow while allocators warm up) over at least MEASURE_SHARE of the budget,
                # less 5% for evaluation and saving. It is saved with the checkpoints, so a resumed run keeps the
                # same schedule. Rank 0's clock decides when, so every rank fixes it at the same step.
                per_step = (self.state["elapsed"] - ten_steps_at) / (step - 10)
                remaining = 0.95 * (c.time_budget - self.state["elapsed"])
                self.state["horizon"] = step + max(1, int(remaining / per_step))
                self.state["horizon"] = dist.broadcast_int(self.state["horizon"])
                if bar is not None:
                    bar.total = self._last_step()

            stop_reason = self._stop_reason(step)
            evaluate_now = bool((c.eval_every and (step % c.eval_every == 0 or stop_reason))
                                or (c.eval_each_epoch and (epoch_ended or stop_reason)))
            if step % c.log_every == 0 or stop_reason or evaluate_now:
                row = window.summary(self.world)
                if evaluate_now:
                    last_eval = self._evaluate()
                    row.update({f"eval_{k}": v for k, v in last_eval.items()})
                    if self._track_best(last_eval, step) and stop_reason is None:
                        stop_reason = "early_stopping"
                if main:
                    epoch_f = self.state["epoch"] + self.state["position"] / max(1, self.task.micro_batches_per_epoch(self.state["epoch"]))
                    self._log({"step": step, "epoch": round(epoch_f, 4), **row})
                    if bar is not None:
                        bar.set_postfix(loss=f"{row['loss']:.3f}", tok_s=f"{row['tokens_per_s']:.0f}", refresh=False)
                    # Without a bar (output piped or in a log file), a line every REPORT_EVERY_S seconds;
                    # evaluations are reported as they happen either way.
                    now = time.perf_counter()
                    if evaluate_now or stop_reason or (bar is None and now - reported_at >= REPORT_EVERY_S):
                        line = progress_line(step, self._last_step(), row)
                        bar.write(line, file=sys.stderr) if bar is not None else print(line, file=sys.stderr, flush=True)
                        reported_at = now
            if bar is not None:
                bar.update(1)
            # Rank 0's signal and clock decide, so every rank stops (or saves) at the same step.
            minutes = (time.monotonic() - self._saved_clock) / 60
            flags = dist.broadcast_int((1 if self._signals.received else 0)
                                       | (2 if c.save_every_minutes and minutes >= c.save_every_minutes else 0))
            if (c.save_every and step % c.save_every == 0) or stop_reason or flags:
                self._save(step)
                saved_at = step
            if flags & 1 and stop_reason is None:
                if bar is not None:
                    bar.close()
                raise self._stopped(step)
        if bar is not None:
            bar.close()
        if saved_at != step:
            self._save(step)
        if not c.eval_every and not c.eval_each_epoch:
            last_eval = self._evaluate()
            if main and last_eval:  # (a run without an evaluation set has none to log)
                self._log({"step": step, **{f"eval_{k}": v for k, v in last_eval.items()}})
            self._track_best(last_eval, step)
        return {"step": step, "stop": stop_reason, "eval": last_eval, "elapsed": self.state["elapsed"],
                "best": self.state["best"], "best_step": self.state["best_step"],
                "best_metrics": self.state.get("best_metrics"), "kernel_compile_seconds": kernel_seconds}

    # ------------------------------------------------------------------ the engine
    def _ready_kernels(self) -> float | None:
        """Load the native CPU kernels, compiling them first on a machine that has none yet (about 45 s on two
        cores, said on stderr). Done before the loop's clock starts, so that a first run's compile does not
        eat its --time-budget. Returns the seconds this call spent compiling (or waiting for another
        process's compile), None when nothing was compiled."""
        if self.device.type != "cpu":
            return None
        first = kernels.library.cache_info().currsize == 0  # not yet tried in this process
        kernels.library()
        return kernels.status["compile_seconds"] if first else None

    # What a backend supplies: the optimizer, one optimizer step, its checkpoint files, and the
    # weights as a torch state dict. The JAX loop (`jax/loop.py`) overrides these and nothing else.
    def _make_optimizer(self):
        return build_optimizer(self.model, self.config.optimizer, self.config.lr, self.config.weight_decay)

    def _optimizer_step(self, step: int, window: "_Window") -> tuple[float, float]:
        """Optimizer step `step` (0-based): its micro-batches forward and backward, clipping, the
        update. Adds each micro-batch's loss to `window`; returns (gradient norm, learning rate)."""
        c = self.config
        self.train_model.train()
        epoch = self.state["epoch"]
        keys = [(epoch, self.state["position"] + a * self.world + self.rank) for a in range(c.grad_accum)]
        following = self._following_position()  # the next optimizer step's first micro-batch, if this epoch's
        keys.append(None if following is None else (epoch, following + self.rank))
        for a in range(c.grad_accum):
            host = self.batches.get(*keys[a])
            self.batches.ahead(keys[a + 1])  # built while this one trains; `_fit` settles it after the step
            batch = {k: v.to(self.device) for k, v in host.items()}
            sync = (contextlib.nullcontext() if a == c.grad_accum - 1 or self.world == 1
                    else self.train_model.no_sync())
            with sync, self.autocast(), self._route_matmuls():
                loss, parts = self.task.loss(self.train_model, batch)
                (loss / c.grad_accum).backward()
            window.add(loss, parts, int(host["attention_mask"].sum()) if "attention_mask" in host else 0)
        lr = c.lr * self._lr_factor(step)
        if not window.last_step_finite(c.grad_accum):  # before the update: the model stays as it was
            self.optimizer.zero_grad(set_to_none=True)
            raise self._diverged(step, window.last_value(), lr)
        grad_norm = (torch.nn.utils.clip_grad_norm_(self.model.parameters(), c.max_grad_norm)
                     if c.max_grad_norm > 0 else _grad_norm(self.model))
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_ratio", 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(grad_norm), lr

    def _route_matmuls(self) -> contextlib.AbstractContextManager:
        """Around a micro-batch's forward and backward, on the CPU: bf16 linears on bucketed token
        counts (so oneDNN reuses its compiled matmuls), fp32 linears on the library chosen per shape."""
        if self.config.compile or self.device.type != "cpu":
            return contextlib.nullcontext()
        if self.precision == "bf16":
            return BucketBF16()
        return self.matmuls.context() if self.matmuls.applies(self.device, self.precision) else contextlib.nullcontext()

    def _predictions(self) -> int | None:
        """Masked positions per row, for the masked-LM head's share of a step's memory (None: not masked-LM)."""
        masking, seq_len = self.run_info.get("masking"), self.run_info.get("seq_len")
        if not masking or not seq_len:
            return None
        probability, *_, cap = masking
        return cap or math.ceil(seq_len * probability)

    def _out_of_memory(self, step: int, error: RuntimeError) -> OutOfMemory:
        request = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        last = latest_checkpoint(self.checkpoints)
        return OutOfMemory(f"out of memory in step {step + 1} ({request}); stopped without saving. Last checkpoint: "
                           f"{last or 'none'}, intact. Lower --batch-size (--grad-accum keeps the global batch) or "
                           "--seq-len")

    def _diverged(self, step: int, loss: float, lr: float) -> "TrainingDiverged":
        last = latest_checkpoint(self.checkpoints)
        return TrainingDiverged(f"loss became {loss:.4g} at step {step + 1} (lr {lr:.3g}); stopped without saving. "
                                f"Last good checkpoint: {last or 'none'}. Lower --lr, raise --warmup, or check the data.")

    def _checkpoint_files(self):
        """`write(folder)` for `save_checkpoint`: the model and optimizer state."""
        return torch_files(self.model, self.optimizer)

    def _load_checkpoint(self, path: Path) -> dict[str, Any]:
        """Restore the model and optimizer from checkpoint `path`; returns its trainer state."""
        return load_checkpoint(path, self.model, self.optimizer)

    def _weights(self) -> dict[str, torch.Tensor]:
        """The model's weights now, as a CPU torch state dict (a copy)."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def restore_best(self) -> bool:
        """Put the best evaluation's weights back into the model; False when none was selected."""
        if self.best_weights is None:
            return False
        self.model.load_state_dict(self.best_weights)
        return True

    # ------------------------------------------------------------------ helpers
    def _following_position(self) -> int | None:
        """The data position after this optimizer step, or None when that step ends the epoch."""
        per_step = self.config.grad_accum * self.world
        position = self.state["position"] + per_step
        # The last incomplete step's worth of batches is dropped.
        return position if position + per_step <= self.task.micro_batches_per_epoch(self.state["epoch"]) else None

    def _advance_position(self) -> bool:
        """Move the data position past one optimizer step; True when that ended an epoch."""
        following = self._following_position()
        if following is None:
            self.state["epoch"] += 1
            self.state["position"] = 0
            return True
        self.state["position"] = following
        return False

    def _track_best(self, metrics: dict[str, float], step: int) -> bool:
        """Keep the best weights so far (in memory); True when patience has run out."""
        c = self.config
        if not c.select_metric or c.select_metric not in metrics:
            return False
        value = metrics[c.select_metric]
        best = self.state["best"]
        if best is None or (value > best if c.greater_is_better else value < best):
            self.state.update(best=value, best_step=step, stale_evals=0, best_metrics=dict(metrics))
            self.best_weights = self._weights()
            return False
        self.state["stale_evals"] += 1
        return c.patience is not None and self.state["stale_evals"] >= c.patience

    def _stop_reason(self, step: int) -> str | None:
        c = self.config
        reason = None
        if c.max_steps is not None and step >= c.max_steps:
            reason = "max_steps"
        elif self.state["horizon"] is not None and step >= self.state["horizon"]:
            reason = "schedule"  # the learning rate has decayed to zero: further steps change nothing
        elif c.epochs is not None and self.state["epoch"] + self.state["position"] / max(
                1, self.task.micro_batches_per_epoch(self.state["epoch"])) >= c.epochs - 1e-9:
            reason = "epochs"
        over_time = c.time_budget is not None and self.state["elapsed"] >= c.time_budget
        if dist.broadcast_flag(over_time) and reason is None:
            reason = "time_budget"
        return reason

    def _evaluate(self) -> dict[str, float]:
        result: dict[str, float] = {}
        if dist.is_main():
            model = dist.unwrap(self.train_model)
            was = model.training
            model.eval()
            with torch.no_grad(), phase("evaluating"):
                result = self.task.evaluate(model)
            model.train(was)
        dist.barrier()
        return result

    def _stopped(self, step: int) -> Stopped:
        """What a signal ends the run with: the checkpoint just written, and how to go on from it."""
        signum = self._signals.received or signal.SIGTERM
        if invocation.cli_args is not None:  # started by the CLI (`bertforge` or `python -m bertforge`)
            args = [a for a in invocation.cli_args if a not in ("--overwrite", "--resume")]
            if self.world > 1:  # the launcher's own options are not ours to know
                how = "resume by launching it as before: torchrun ... " + shlex.join(["-m", "bertforge", *args, "--resume"])
            else:
                how = "resume with: " + shlex.join(["bertforge", *args, "--resume"])
        else:
            how = "resume with the same settings and resume=True"
        return Stopped(f"stopped by {signal.Signals(signum).name} at step {step}; checkpoint "
                       f"{latest_checkpoint(self.checkpoints)} saved; {how}", signum, quiet=not dist.is_main())

    def _save(self, step: int) -> None:
        self._saved_clock = time.monotonic()
        rank_rng = rank_rng_states()  # every rank's dropout stream, not rank 0's alone
        if dist.is_main():
            state = dict(self.state, run=self.run_info, config=asdict(self.config))
            save_checkpoint(self.checkpoints, step, self._checkpoint_files(), state, self.config.keep_last,
                            best_weights=self.best_weights, rank_rng=rank_rng)
        dist.barrier()

    def _log(self, row: dict[str, Any]) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.metrics_file, "a", encoding="utf-8") as f:
            f.write(dumps(row) + "\n")

    def _progress_bar(self, initial: int):
        from tqdm import tqdm

        return tqdm(total=self._last_step(), initial=initial, unit="step", dynamic_ncols=True, desc="train")


# How much of a time budget the steps that fix the schedule's length span: long enough that the first steps' new
# shapes (bf16's primitives being compiled) do not set the pace for the rest, short enough to leave the budget to
# training. Steps 10-30 alone (about a second of the main job's three minutes) measured ~25% slower than the steps
# after them and so ended the budget early (docs/notes/2026-11-27-training-at-peak.md, "First run").
MEASURE_SHARE = 0.05

REPORT_EVERY_S = 20.0  # seconds between progress lines on stderr when no progress bar is shown (under the 30 s
# a piped run promises, `heartbeat.py`, whose watchdog covers a step or an evaluation that takes longer)


class _StopSignals:
    """While training, SIGTERM, SIGINT and SIGUSR1 only note that a stop was asked for (the first one's number):
    the loop stops at the end of its optimizer step, after a checkpoint. A second signal while that checkpoint is
    written changes nothing, so it cannot cut the save short. The previous handlers come back on exit."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def _note(self, signum: int, frame: Any) -> None:
        if self.received is None:
            self.received = signum
            print(f"bertforge: {signal.Signals(signum).name} received: stopping after this step, with a checkpoint",
                  file=sys.stderr, flush=True)

    def __enter__(self) -> "_StopSignals":
        if threading.current_thread() is threading.main_thread():  # Python delivers signals to the main thread only
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._note)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def progress_line(step: int, horizon: int | None, row: dict[str, Any]) -> str:
    """One human-readable line for a metrics row: 'step 120/1270  loss 5.123  lr 1.0e-03  4,123 tok/s  ...'."""
    parts = [f"step {step}" + (f"/{horizon}" if horizon else "")]
    if "loss" in row:
        parts.append(f"loss {row['loss']:.4f}")
    if "lr" in row:
        parts.append(f"lr {row['lr']:.2e}")
    if "tokens_per_s" in row:
        parts.append(f"{row['tokens_per_s']:,.0f} tok/s")
    parts += [f"{k} {v:.4g}" for k, v in row.items() if k.startswith("eval_") and isinstance(v, (int, float))]
    return "train: " + "  ".join(parts)


# Settings that may change between a run and its resumption.
_RESUME_FREE = {"time_budget", "max_steps", "epochs", "log_every", "eval_every", "save_every", "keep_last", "progress",
                "patience"}


def _grad_norm(model: torch.nn.Module) -> torch.Tensor:
    norms = [p.grad.detach().norm() for p in model.parameters() if p.grad is not None]
    return torch.stack(norms).norm() if norms else torch.zeros(())


class _Window:
    """Running sums between two log rows."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.sums: dict[str, float] = {}
        self.micro = 0
        self.steps = 0
        self.tokens = 0
        self.grad_norm = 0.0
        self.lr = 0.0
        self.started = time.perf_counter()
        self._step_losses: list[float] = []

    def add(self, loss: Any, parts: dict[str, Any], tokens: int) -> None:
        """loss and parts: scalars (torch tensors, JAX or NumPy arrays, floats)."""
        value = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
        self._step_losses.append(value)
        self.sums["loss"] = self.sums.get("loss", 0.0) + value
        for k, v in parts.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v)
        self.micro += 1
        self.tokens += tokens

    def last_step_finite(self, accum: int) -> bool:
        values = dist.sum_across([sum(self._step_losses[-accum:])])
        return math.isfinite(values[0])

    def last_value(self) -> float:
        return sum(self._step_losses[-1:])

    def step_done(self, grad_norm: float, lr: float) -> None:
        self.steps += 1
        self.grad_norm, self.lr = grad_norm, lr
        self._step_losses = []

    def summary(self, world: int) -> dict[str, float]:
        keys = sorted(self.sums)
        totals = dist.sum_across([self.sums[k] for k in keys] + [self.micro, self.tokens])
        micro, tokens = totals[-2], totals[-1]
        seconds = time.perf_counter() - self.started
        row = {k: totals[i] / max(1, micro) for i, k in enumerate(keys)}
        row.update(lr=self.lr, grad_norm=self.grad_norm, tokens_per_s=tokens / max(seconds, 1e-9))
        self._reset()
        return row
