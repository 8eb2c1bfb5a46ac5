"""The JAX training loop for `bertforge pretrain --backend jax`: the torch loop's contract, with the
jit-compiled step of `jax/train.py`.

It reads the same task (`tasks/pretraining.py`: the corpus readers, shards, NSP pairs and the
masking collator, unchanged), follows the same schedule and stopping rules, writes the same
`metrics.jsonl` rows and progress lines, and evaluates with the same held-out metric (on a
torch copy of the weights, so the numbers are computed by one piece of code).

Batches are padded to `seq_len`, so the step compiles once. Dropout draws are a pure function
of (seed, step) (`nnx.reseed` before each step), like the data order, so a checkpoint needs no
random state: it holds the parameters and the optimizer state (safetensors) and the loop's
position (JSON), written to a hidden folder and renamed into place. A run killed and resumed
ends with the same weights as one that was not (tests/test_jax.py states the extent).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import load_file, save_file

from ..checkpoint import latest_checkpoint, list_checkpoints
from ..constants import IGNORE_INDEX
from ..errors import BertforgeError, CheckpointError
from ..optim import warmup_linear, warmup_steps_for
from ..runconfig import TrainConfig
from ..train import REPORT_EVERY_S, TrainingDiverged, progress_line
from .checkpoint import torch_state
from .train import make_optimizer, train_step

_RESUME_FREE = {"time_budget", "max_steps", "epochs", "log_every", "eval_every", "save_every", "keep_last", "progress",
                "patience"}


def _flat(node: Any) -> dict[str, np.ndarray]:
    """An NNX object's state as {dotted path: array}."""
    return {".".join(map(str, path)): np.asarray(variable[...])
            for path, variable in nnx.to_flat_state(nnx.state(node))
            if not isinstance(variable, nnx.RngState)}


def _restore(node: Any, arrays: dict[str, np.ndarray], source: Path) -> None:
    flat = {".".join(map(str, path)): variable for path, variable in nnx.to_flat_state(nnx.state(node))
            if not isinstance(variable, nnx.RngState)}
    if set(flat) != set(arrays):
        raise CheckpointError(f"{source}: holds {len(arrays)} arrays; this run has {len(flat)}")
    for key, variable in flat.items():
        variable.set_value(jnp.asarray(arrays[key]))


def _pad(batch: dict, seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
    """A collated torch batch as NumPy arrays padded to `seq_len` (labels with -100)."""
    out = {}
    for key, value in batch.items():
        array = value.numpy()
        if array.ndim == 2 and array.shape[1] < seq_len:
            fill = IGNORE_INDEX if key == "labels" else (pad_id if key == "input_ids" else 0)
            array = np.pad(array, ((0, 0), (0, seq_len - array.shape[1])), constant_values=fill)
        out[key] = array
    return out


class JaxTrainer:
    """Runs a pretraining task on an NNX model to the stopping rule, checkpointing and logging."""

    def __init__(self, model: nnx.Module, torch_model, task, config: TrainConfig, run_info: dict[str, Any],
                 seq_len: int, pad_id: int) -> None:
        self.model, self.torch_model, self.task, self.config = model, torch_model, task, config
        self.run_info, self.seq_len, self.pad_id = run_info, seq_len, pad_id
        self.out = Path(config.out)
        self.checkpoints = self.out / "checkpoints"
        self.metrics_file = self.out / "metrics.jsonl"
        self.optimizer = make_optimizer(model, config.weight_decay)
        self.state: dict[str, Any] = {"epoch": 0, "position": 0, "horizon": None, "elapsed": 0.0}

    # ------------------------------------------------------------------ schedule and data
    def _steps_per_epoch(self, epoch: int) -> int:
        return self.task.micro_batches_per_epoch(epoch) // self.config.grad_accum

    def _initial_horizon(self) -> int | None:
        c = self.config
        candidates = [c.max_steps] if c.max_steps is not None else []
        if c.epochs is not None:
            candidates.append(max(1, int(np.ceil(c.epochs * self._steps_per_epoch(0)))))
        return min(candidates) if candidates else None

    def _lr(self, step: int) -> float:
        horizon = self.state["horizon"]
        if horizon is None:  # a time budget, before the schedule's length is measured
            return self.config.lr * min(1.0, step / 100)
        return self.config.lr * warmup_linear(warmup_steps_for(self.config.warmup, horizon), horizon)(step)

    def _micro_batches(self) -> dict[str, jax.Array]:
        batches = [_pad(self.task.micro_batch(self.state["epoch"], self.state["position"] + a), self.seq_len,
                        self.pad_id) for a in range(self.config.grad_accum)]
        k = getattr(self.model, "max_predictions", None)
        most = max(int((b["labels"] != IGNORE_INDEX).sum(1).max()) for b in batches)
        if k is not None and most > k:  # the model would drop predictions: refuse, never train on less
            raise BertforgeError(f"a batch has {most} masked tokens in one row, more than the {k} the JAX step "
                                 "projects; raise --max-predictions")
        return {k: jnp.stack([jnp.asarray(b[k]) for b in batches]) for k in batches[0]}

    def _advance(self) -> bool:
        self.state["position"] += self.config.grad_accum
        if self.state["position"] + self.config.grad_accum > self.task.micro_batches_per_epoch(self.state["epoch"]):
            self.state["epoch"] += 1
            self.state["position"] = 0
            return True
        return False

    # ------------------------------------------------------------------ checkpoints
    def _save(self, step: int) -> None:
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        final, tmp = self.checkpoints / f"step-{step:08d}", self.checkpoints / f".tmp-step-{step:08d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        save_file(_flat(self.model), tmp / "params.safetensors")
        save_file(_flat(self.optimizer), tmp / "optimizer.safetensors")
        state = dict(self.state, step=step, run=self.run_info, backend="jax")
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in list_checkpoints(self.checkpoints)[:-self.config.keep_last]:
            shutil.rmtree(old, ignore_errors=True)

    def _resume(self) -> int:
        path = latest_checkpoint(self.checkpoints)
        if path is None:
            raise BertforgeError(f"{self.checkpoints}: no checkpoint to resume from")
        try:
            state = json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
            params, optimizer = load_file(path / "params.safetensors"), load_file(path / "optimizer.safetensors")
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{path}: cannot read a JAX checkpoint ({exc}); was it written by --backend jax?") \
                from None
        saved = state.get("run", {})
        for key in sorted(set(saved) | set(self.run_info)):
            if key not in _RESUME_FREE and saved.get(key) != self.run_info.get(key):
                raise BertforgeError(f"{path}: cannot resume: '{key}' was {saved.get(key)!r} and is now "
                                     f"{self.run_info.get(key)!r}; resume with the same settings, or start a new --out")
        _restore(self.model, params, path)
        _restore(self.optimizer, optimizer, path)
        self.state.update({k: state[k] for k in ("epoch", "position", "horizon", "elapsed")})
        if self.metrics_file.exists():  # drop rows logged after the checkpoint
            rows = [line for line in self.metrics_file.read_text(encoding="utf-8").splitlines()
                    if line.strip() and json.loads(line)["step"] <= state["step"]]
            self.metrics_file.write_text("".join(r + "\n" for r in rows), encoding="utf-8")
        return int(state["step"])

    # ------------------------------------------------------------------ the loop
    def _evaluate(self) -> dict[str, float]:
        import torch

        self.torch_model.load_state_dict(torch_state(self.model, self.torch_model))
        self.torch_model.eval()
        with torch.no_grad():
            return self.task.evaluate(self.torch_model)

    def _log(self, row: dict[str, Any]) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.metrics_file, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def fit(self, resume: bool = False) -> dict[str, Any]:
        c = self.config
        step = self._resume() if resume else 0
        if not resume:
            self.state["horizon"] = self._initial_horizon()
            if self.metrics_file.exists():
                self.metrics_file.unlink()
        if self._steps_per_epoch(self.state["epoch"]) < 1:
            raise BertforgeError("the data gives fewer micro-batches than one optimizer step needs; "
                                 "use more text or a smaller --batch-size")
        self.model.train()
        started = time.perf_counter() - self.state["elapsed"]
        reported_at, ten_steps_at, compile_s = time.perf_counter(), 0.0, None
        sums: dict[str, float] = {}
        window_steps, window_tokens, window_start = 0, 0, time.perf_counter()
        last_eval: dict[str, float] = {}
        stop = None
        saved_at = step if resume else -1
        while stop is None:
            batch = self._micro_batches()
            # Dropout masks are a function of (seed, step): nothing to save for an exact resume.
            nnx.reseed(self.model, dropout=jax.random.fold_in(jax.random.key(c.seed), step))
            lr = self._lr(step)
            t0 = time.perf_counter()
            out = {k: float(v) for k, v in train_step(self.model, self.optimizer, batch, lr,
                                                       max_grad_norm=c.max_grad_norm).items()}
            if compile_s is None:
                compile_s = time.perf_counter() - t0  # the first call traces and compiles the step
            if not np.isfinite(out["loss"]):
                raise TrainingDiverged(f"loss became {out['loss']:.4g} at step {step + 1}; stopped without saving. "
                                       f"Last good checkpoint: {latest_checkpoint(self.checkpoints) or 'none'}.")
            step += 1
            self._advance()
            self.state["elapsed"] = time.perf_counter() - started
            window_steps += 1
            window_tokens += int(np.asarray(batch["attention_mask"]).sum())
            for k, v in out.items():
                sums[k] = sums.get(k, 0.0) + v
            if step == 10:
                ten_steps_at = self.state["elapsed"]
            if self.state["horizon"] is None and c.time_budget and step >= 30:  # as the torch loop does
                per_step = (self.state["elapsed"] - ten_steps_at) / 20
                self.state["horizon"] = step + max(1, int(0.95 * (c.time_budget - self.state["elapsed"]) / per_step))
            stop = self._stop_reason(step)
            evaluate_now = bool(c.eval_every and (step % c.eval_every == 0 or stop))
            if step % c.log_every == 0 or stop or evaluate_now:
                seconds = time.perf_counter() - window_start
                row = {"step": step, "epoch": self.state["epoch"],
                       **{k: v / window_steps for k, v in sums.items() if k != "grad_norm"},
                       "lr": lr, "grad_norm": out["grad_norm"], "tokens_per_s": window_tokens / max(seconds, 1e-9)}
                if evaluate_now:
                    last_eval = self._evaluate()
                    row.update({f"eval_{k}": v for k, v in last_eval.items()})
                self._log(row)
                now = time.perf_counter()
                if evaluate_now or stop or now - reported_at >= REPORT_EVERY_S:
                    print(progress_line(step, self.state["horizon"], row), file=sys.stderr, flush=True)
                    reported_at = now
                sums, window_steps, window_tokens, window_start = {}, 0, 0, time.perf_counter()
            if (c.save_every and step % c.save_every == 0) or stop:
                self._save(step)
                saved_at = step
        if saved_at != step:
            self._save(step)
        if not c.eval_every:
            last_eval = self._evaluate()
            self._log({"step": step, **{f"eval_{k}": v for k, v in last_eval.items()}})
        self.model.eval()
        return {"step": step, "stop": stop, "eval": last_eval, "elapsed": self.state["elapsed"],
                "compile_seconds": compile_s}

    def _stop_reason(self, step: int) -> str | None:
        c = self.config
        if c.max_steps is not None and step >= c.max_steps:
            return "max_steps"
        if self.state["horizon"] is not None and step >= self.state["horizon"]:
            return "schedule"
        if c.epochs is not None and self.state["epoch"] + self.state["position"] / max(
                1, self.task.micro_batches_per_epoch(self.state["epoch"])) >= c.epochs - 1e-9:
            return "epochs"
        if c.time_budget is not None and self.state["elapsed"] >= c.time_budget:
            return "time_budget"
        return None
