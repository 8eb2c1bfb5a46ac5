"""The JAX engine of the one training loop: `bertforge pretrain --backend jax` and
`bertforge finetune classify --backend jax`.

`JaxTrainer` is the torch `Trainer` (`bertforge/training/trainer.py`: schedule, stopping rules, logging,
evaluation, best-model selection, atomic checkpoints, resume) with its engine swapped: the
optimizer is optax's, and one optimizer step is the jit-compiled `train_step` of `jax/train.py`.
It reads the same task unchanged (the corpus readers, shards, NSP pairs and the masking
collator, or the fine-tuning readers), and evaluates on a torch copy of the weights, so every
metric is computed by one piece of code.

Batches are padded to a multiple of 32 tokens (at most `seq_len`) and to the full batch size,
so the step compiles for a few shapes only; padded rows carry label -100 and add nothing to the
loss. Dropout draws are a pure function of (seed, step) (`nnx.reseed` before each step), like
the data order, so a checkpoint needs no random state: it holds the parameters and the
optimizer state (safetensors) beside the loop's own files. A run killed and resumed ends with
the same weights as one that was not (tests/test_jax.py states the extent).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import load_file, save_file

from ..constants import IGNORE_INDEX
from ..errors import BertforgeError, CheckpointError
from ..settings import TrainConfig
from ..training.checkpoint import read_trainer_state
from ..training.trainer import Trainer, _Window
from . import devices
from .checkpoint import load_torch_state, torch_state
from .train import make_optimizer, train_step

BUCKET = 32  # sequence widths are padded to a multiple of this: few shapes, little padding


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


def pad_batch(batch: dict, rows: int, width: int, pad_id: int) -> dict[str, np.ndarray]:
    """A collated torch batch as NumPy arrays of `rows` rows and `width` columns.

    Extra columns are padding (input_ids `pad_id`, mask 0, labels -100); extra rows are all
    padding with every label -100, so they add nothing to a loss that ignores -100.
    """
    out = {}
    for key, value in batch.items():
        array = value.numpy()
        fill = IGNORE_INDEX if key in ("labels", "next_sentence_label") else (pad_id if key == "input_ids" else 0)
        if array.ndim == 2 and array.shape[1] < width:
            array = np.pad(array, ((0, 0), (0, width - array.shape[1])), constant_values=fill)
        if array.shape[0] < rows:
            array = np.pad(array, ((0, rows - array.shape[0]),) + ((0, 0),) * (array.ndim - 1), constant_values=fill)
        out[key] = array
    return out


class JaxTrainer(Trainer):
    """The one training loop on an NNX model: `Trainer` with the JAX engine.

    jax_model: the NNX model that trains; model: the torch model of the same architecture,
    which the loop evaluates, selects and exports (it gets the JAX weights copied in).
    """

    def __init__(self, jax_model: nnx.Module, model, task, config: TrainConfig, run_info: dict[str, Any],
                 seq_len: int, pad_id: int) -> None:
        self.jax_model, self.seq_len, self.pad_id = jax_model, seq_len, pad_id
        self.compile_seconds: float | None = None
        self.mesh = devices.data_mesh(config.batch_size)
        super().__init__(model, task, config, {**run_info, "backend": "jax"})
        self._place()
        if self.mesh is not None:
            print(f"jax: data parallel over {self.mesh.size} devices", flush=True)

    def _set_precision(self, precision: str, why: str) -> None:
        # The JAX step computes in float32 (bf16 is refused for it by the run's settings): `auto` means fp32 here.
        super()._set_precision("fp32", "the JAX engine trains in fp32" if precision != "fp32" else why)

    def _place(self) -> None:
        """Data parallel: the model and optimizer state on every device (each batch is split over them)."""
        if self.mesh is not None:
            nnx.update((self.jax_model, self.optimizer),
                       devices.replicate(nnx.state((self.jax_model, self.optimizer)), self.mesh))

    # ------------------------------------------------------------------ the engine
    def _make_optimizer(self) -> nnx.Optimizer:
        return make_optimizer(self.jax_model, self.config.weight_decay)

    def _micro_batches(self) -> dict[str, jax.Array]:
        """The step's micro-batches, padded to one shape and stacked: arrays [accum, batch, ...]."""
        raw = [self.task.micro_batch(self.state["epoch"], self.state["position"] + a)
               for a in range(self.config.grad_accum)]
        longest = max(int(b["input_ids"].shape[1]) for b in raw)
        width = max(longest, min(-(-longest // BUCKET) * BUCKET, self.seq_len))
        batches = [pad_batch(b, self.config.batch_size, width, self.pad_id) for b in raw]
        k = getattr(self.jax_model, "max_predictions", None)
        if k is not None:  # the model would drop predictions: refuse, never train on less
            most = max(int((b["labels"] != IGNORE_INDEX).sum(1).max()) for b in batches)
            if most > k:
                raise BertforgeError(f"a batch has {most} masked tokens in one row, more than the {k} the JAX "
                                     "step projects; raise --max-predictions")
        stacked = {key: np.stack([b[key] for b in batches]) for key in batches[0]}
        if self.mesh is not None:
            return devices.split_batch(stacked, self.mesh)
        return {key: jnp.asarray(value) for key, value in stacked.items()}

    def _optimizer_step(self, step: int, window: _Window) -> tuple[float, float]:
        c = self.config
        batch = self._micro_batches()
        # Dropout masks are a function of (seed, step): nothing to save for an exact resume.
        nnx.reseed(self.jax_model, dropout=jax.random.fold_in(jax.random.key(c.seed), step))
        lr = c.lr * self._lr_factor(step)
        self.jax_model.train()
        started = time.perf_counter()
        out = train_step(self.jax_model, self.optimizer, batch, lr, max_grad_norm=c.max_grad_norm)
        loss = float(out["loss"])  # waits for the step
        if self.compile_seconds is None:
            self.compile_seconds = time.perf_counter() - started  # the first call traces and compiles
        window.add(loss, {k: v for k, v in out.items() if k not in ("loss", "grad_norm")},
                   int(np.asarray(batch["attention_mask"]).sum()))
        if not np.isfinite(loss):  # the jitted step has updated already; nothing is saved from here
            raise self._diverged(step, loss, lr)
        return float(out["grad_norm"]), lr

    def _checkpoint_files(self):
        def write(folder: Path) -> None:
            save_file(_flat(self.jax_model), folder / "params.safetensors")
            save_file(_flat(self.optimizer), folder / "optimizer.safetensors")
        return write

    def _load_checkpoint(self, path: Path) -> dict[str, Any]:
        state = read_trainer_state(path)
        try:
            params, optimizer = load_file(path / "params.safetensors"), load_file(path / "optimizer.safetensors")
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{path}: cannot read a JAX checkpoint ({exc}); was it written by --backend jax?") \
                from None
        _restore(self.jax_model, params, path)
        _restore(self.optimizer, optimizer, path)
        self._place()
        return state

    def _ready_kernels(self) -> None:
        """XLA compiles the step itself (`compile_seconds`); the native CPU kernels are torch's."""
        return None

    def _sync(self) -> None:
        """Copy the JAX weights into the torch model."""
        self.model.load_state_dict(torch_state(self.jax_model, self.model))

    def _weights(self) -> dict[str, Any]:
        return torch_state(self.jax_model, self.model)  # fresh CPU tensors

    def _evaluate(self) -> dict[str, float]:
        self._sync()
        return super()._evaluate()

    def restore_best(self) -> bool:
        if not super().restore_best():
            return False
        load_torch_state(self.jax_model, self.best_weights)
        return True

    def fit(self, resume: bool = False) -> dict[str, Any]:
        """As `Trainer.fit`; the torch model ends with the trained weights, and the summary has the
        step's compile time (`compile_seconds`)."""
        summary = super().fit(resume)
        self._sync()
        self.jax_model.eval()
        return {**summary, "compile_seconds": self.compile_seconds}


def jax_trainer(model, task, config: TrainConfig, run_info: dict[str, Any], seq_len: int, pad_id: int) -> JaxTrainer:
    """A `JaxTrainer` for `model` (torch): an NNX model of its architecture, from its weights."""
    from ..training import distributed as dist
    from .bert import MODELS, seeded

    if dist.world_size() > 1:
        raise BertforgeError("--backend jax runs in one process; launch it without torchrun")
    if model.hf_architecture not in MODELS:
        raise BertforgeError(f"--backend jax has no {model.hf_architecture} yet; JAX has {', '.join(MODELS)}")
    jax_model = MODELS[model.hf_architecture](model.config, seeded(config.seed))
    load_torch_state(jax_model, model.state_dict())
    collator = getattr(task, "collator", None)
    if collator is not None and hasattr(jax_model, "max_predictions"):
        # As many vocabulary projections per row as the collator can mask (its cap), not seq_len.
        jax_model.max_predictions = collator.cap
    return JaxTrainer(jax_model, model, task, config, run_info, seq_len, pad_id)
