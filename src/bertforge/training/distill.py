"""`bertforge distill classify|regress|ner|qa`: a smaller student learns a fine-tuned teacher's outputs.

Task-specific knowledge distillation (Hinton et al., 2015; DistilBERT's and TinyBERT's prediction-layer
loss): the student is trained on the same examples as fine-tuning, with the loss

    alpha * soft + (1 - alpha) * the task's own loss on the gold labels

where `soft` compares the student's outputs with the teacher's on the same batch:

- classify: T^2 * KL(softmax(teacher / T) || softmax(student / T)) per example (T the temperature; the
  T^2 keeps the soft term's gradients at the scale of the hard one as T changes, as in Hinton et al.);
- regress: the mean squared error between the two scores;
- ner: the same T^2 * KL per token, at the tokens the task labels and scores (each word's first
  sub-token), averaged over them; the other sub-tokens' outputs are never read;
- qa: T^2 * KL between the start distributions over a window's real tokens, and the same for the ends,
  averaged (the DistilBERT authors' SQuAD recipe, with padding left out of both softmaxes).

The teacher's outputs are computed once, before training, on every training example (sorted by length,
on the fused backend), and kept with the examples when they take at most `--teacher-cache-mb`: a few
numbers per example for classification, one row per token for ner and qa. Past that (or with 0) the
teacher runs on each training batch instead, in eval mode and fp32, without gradients.

The student is, by default, the teacher cut down to some of its layers (`--student-layers`; every
other layer, as DistilBERT initialised its student from BERT), keeping its embeddings, the chosen
blocks, its pooler and its head: it starts close to the teacher. `--model` takes any other student
instead (a checkpoint of the same vocabulary, or a preset). The run writes the student as a fine-tuned
model, like `finetune`, and reports both models' dev scores, sizes and speeds.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..constants import IGNORE_INDEX
from ..errors import BertforgeError
from ..inference.backends import load as load_backend
from ..interop.hf import heads_from_checkpoint, load_for_task, read_config
from ..jsonfile import dumps
from ..safefiles import write_text
from ..models.distillation import cut_down, student_layers
from ..models.registry import TASK_ARCHITECTURES
from ..settings import DistillConfig, check_seq_len
from ..tokenization.kinds import load_tokenizer
from .finetune import build, retire_checkpoints, run_seeds, train_and_export

PER_TOKEN = ("ner", "qa")  # tasks whose outputs are one row per token, not one per example


def outputs_of(task: str, out: Any) -> torch.Tensor:
    """A model's outputs for distillation, float: [B, C] (classify, regress), [B, T, C] (ner), [B, T, 2] (qa:
    start and end logits)."""
    if task == "qa":
        return torch.stack([out.start_logits, out.end_logits], dim=-1).float()
    return out.logits.float()


def _kl(student: torch.Tensor, teacher: torch.Tensor, T: float, dim: int = -1) -> torch.Tensor:
    """T^2 * KL(softmax(teacher / T) || softmax(student / T)) along `dim`; the other dims kept."""
    return F.kl_div(F.log_softmax(student / T, dim=dim), F.log_softmax(teacher / T, dim=dim), reduction="none",
                    log_target=True).sum(dim) * T * T


def soft_loss(task: str, student: torch.Tensor, teacher: torch.Tensor, batch: dict[str, torch.Tensor],
              T: float) -> torch.Tensor:
    """The loss between student and teacher outputs (as `outputs_of` lays them out) of one batch."""
    if task == "regress":
        return F.mse_loss(student, teacher)
    if task == "classify":
        return _kl(student, teacher, T).mean()
    if task == "ner":  # the scored positions only
        scored = batch["labels"] != IGNORE_INDEX
        return _kl(student[scored], teacher[scored], T).sum() / scored.sum().clamp(min=1)
    # qa: a softmax over each window's real tokens, for the starts and for the ends
    padding = ~batch["attention_mask"].bool().unsqueeze(-1)
    student, teacher = student.masked_fill(padding, -1e9), teacher.masked_fill(padding, -1e9)
    return _kl(student, teacher, T, dim=1).mean()


def teacher_outputs(teacher: torch.nn.Module, task: Any, kind: str) -> list[torch.Tensor]:
    """The teacher's outputs on every training feature, in the features' order: float [C] per example
    (classify, regress), [n, C] (ner) or [n, 2] (qa) per feature of n tokens."""
    fast = load_backend(teacher, "fused")

    def take(out, batch):
        values = outputs_of(kind, out).cpu()
        if kind not in PER_TOKEN:
            return list(values)
        return [values[i, :n].clone() for i, n in enumerate(batch["attention_mask"].sum(1).tolist())]

    return task.predict(fast, task.train, take)


def cache_mib(features: list[dict], kind: str, num_labels: int) -> float:
    """What the teacher's outputs on `features` take in memory, MiB (float32)."""
    width = 2 if kind == "qa" else num_labels
    rows = sum(len(f["input_ids"]) for f in features) if kind in PER_TOKEN else len(features)
    return rows * width * 4 / 2**20


class DistillationTask:
    """A fine-tuning task whose loss also compares the student with its teacher, batch by batch.

    Everything but the batches and the loss is the wrapped task's (evaluation, the main metric, the epoch
    order). Each training batch carries `teacher_logits` (laid out as `outputs_of` gives them) from the cache
    when there is one; else `loss` runs the teacher on the batch.
    """

    def __init__(self, task: Any, kind: str, temperature: float, alpha: float,
                 cached: list[torch.Tensor] | None = None, teacher: torch.nn.Module | None = None) -> None:
        if (cached is None) == (teacher is None):
            raise ValueError("give the teacher's cached outputs or the teacher, one of the two")
        self.task, self.kind, self.temperature, self.alpha = task, kind, temperature, alpha
        self.cached, self.teacher = cached, teacher
        self._fast: dict[str, Any] = {}  # the teacher as it runs on each device

    def __getattr__(self, name: str) -> Any:  # evaluation, metrics, the epoch order: the task's own
        if name == "task":
            raise AttributeError(name)
        return getattr(self.task, name)

    def micro_batch(self, epoch: int, index: int) -> dict[str, torch.Tensor]:
        batch = self.task.micro_batch(epoch, index)
        if self.cached is not None:
            rows = self.task.epoch_order(epoch)[index * self.batch_size:(index + 1) * self.batch_size]
            values = [self.cached[int(r)] for r in rows]
            if self.kind in PER_TOKEN:  # zeros at the padding, which soft_loss never reads
                grid = torch.zeros(len(values), batch["input_ids"].shape[1], values[0].shape[-1])
                for i, v in enumerate(values):
                    grid[i, :v.shape[0]] = v
                batch["teacher_logits"] = grid
            else:
                batch["teacher_logits"] = torch.stack(values)
        return batch

    def _teacher_on(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        device = batch["input_ids"].device
        if device.type not in self._fast:
            model = self.teacher.to(device).eval()
            self._fast[device.type] = load_backend(model, "fused") if device.type == "cpu" else model
        inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask", "position_ids") if k in batch}
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            return outputs_of(self.kind, self._fast[device.type](**inputs))

    def loss(self, model, batch):
        teacher = batch.pop("teacher_logits").float() if "teacher_logits" in batch else self._teacher_on(batch)
        out = model(**batch)
        soft = soft_loss(self.kind, outputs_of(self.kind, out), teacher, batch, self.temperature)
        loss = self.alpha * soft + (1 - self.alpha) * out.loss
        return loss, {"soft_loss": soft.detach(), "gold_loss": out.loss.detach()}


def rows_per_second(models: dict[str, Any], task: Any, repeats: int = 3) -> dict[str, float]:
    """Dev-set throughput of each model on the fused backend, passes interleaved; the median of `repeats`."""
    times: dict[str, list[float]] = {name: [] for name in models}
    for name, model in models.items():  # warm-up (and the fused weights' packing)
        task.predict(model, task.dev[:64], lambda _, batch: [0] * batch["input_ids"].shape[0])
    for _ in range(repeats):
        for name, model in models.items():
            start = time.perf_counter()
            task.predict(model, task.dev, lambda _, batch: [0] * batch["input_ids"].shape[0])
            times[name].append(time.perf_counter() - start)
    return {name: round(len(task.dev) / statistics.median(t), 1) for name, t in times.items()}


def _run_one(cfg: DistillConfig, out: Path) -> dict[str, Any]:
    if cfg.resume and (out / "eval_results.json").is_file() and not (out / "checkpoints").is_dir():
        return json.loads((out / "eval_results.json").read_text(encoding="utf-8"))  # this seed had finished
    torch.manual_seed(cfg.seed)
    teacher = load_for_task(cfg.task, cfg.teacher, TASK_ARCHITECTURES[cfg.task]).eval()
    tokenizer = load_tokenizer(cfg.teacher)
    if cfg.model:  # another student: it must read the teacher's tokens
        if Path(cfg.model).is_dir() and load_tokenizer(cfg.model).get_vocab() != tokenizer.get_vocab():
            raise BertforgeError(f"--model {cfg.model}: its vocabulary is not the teacher's; the student must read "
                                 f"the same tokens as {cfg.teacher}")
        with heads_from_checkpoint(cfg.resume and (out / "checkpoints").is_dir()):
            student, task = build(cfg, tokenizer, cfg.train, cfg.dev)
        if student.config.num_labels != teacher.config.num_labels or (
                cfg.task in ("classify", "ner") and student.config.id2label != teacher.config.id2label):
            raise BertforgeError(f"--model {cfg.model}: its labels ({student.config.label_names}) are not the "
                                 f"teacher's ({teacher.config.label_names}) in the same order")
    else:
        keep = student_layers(cfg.student_layers, teacher.config.num_hidden_layers)
        student = cut_down(teacher, keep)
        student, task = build(cfg, tokenizer, cfg.train, cfg.dev, model=student)
        print(f"student: the teacher's layers {', '.join(map(str, keep))} of {teacher.config.num_hidden_layers}",
              flush=True)
    teacher_scores = task.evaluate(teacher)
    size = cache_mib(task.train, cfg.task, teacher.config.num_labels)
    if size <= cfg.teacher_cache_mb:
        print(f"teacher's outputs: {size:,.1f} MiB, computed once and kept", flush=True)
        distilled = DistillationTask(task, cfg.task, cfg.temperature, cfg.alpha,
                                     cached=teacher_outputs(teacher, task, cfg.task))
    else:
        print(f"teacher's outputs: {size:,.1f} MiB, over --teacher-cache-mb {cfg.teacher_cache_mb:g}: the teacher runs "
              "on each training batch", flush=True)
        distilled = DistillationTask(task, cfg.task, cfg.temperature, cfg.alpha, teacher=teacher)
    results = train_and_export(cfg, out, student, distilled, tokenizer, title=f"distillation ({cfg.task})")
    student = load_for_task(cfg.task, str(out), TASK_ARCHITECTURES[cfg.task]).eval()
    speed = rows_per_second({"teacher": load_backend(teacher, "fused"), "student": load_backend(student, "fused")},
                            task)
    results.update({
        "teacher": {task.main_metric: teacher_scores[task.main_metric],
                    "parameters": teacher.num_parameters(), "layers": teacher.config.num_hidden_layers,
                    "dev_rows_per_s": speed["teacher"]},
        "student_parameters": student.num_parameters(), "student_layers": student.config.num_hidden_layers,
        "student_dev_rows_per_s": speed["student"],
        # (no ratio to a teacher that scores 0: an untrained one, say)
        "student_of_teacher": round(results[task.main_metric] / teacher_scores[task.main_metric], 4)
        if teacher_scores[task.main_metric] else None,
        "speedup_fused": round(speed["student"] / speed["teacher"], 3),
    })
    write_text(out / "eval_results.json", dumps(results, indent=2) + "\n")
    retire_checkpoints(out)
    return results


def run_distill(cfg: DistillConfig, as_json: bool = True) -> dict[str, Any]:
    """One distillation run, or one per --seeds with mean and std; results also in OUT/eval_results.json."""
    if not Path(cfg.teacher).is_dir():
        raise BertforgeError(f"--teacher {cfg.teacher}: no such checkpoint directory")
    teacher = load_for_task(cfg.task, cfg.teacher, TASK_ARCHITECTURES[cfg.task])  # the wrong head: before --out
    if cfg.seq_len is not None:  # refused before --out is touched; the task works out a length left to it
        check_seq_len(cfg.seq_len, read_config(cfg.model) if cfg.model and Path(cfg.model).is_dir() else teacher.config)
    return run_seeds(cfg, _run_one, as_json, "distillation")
