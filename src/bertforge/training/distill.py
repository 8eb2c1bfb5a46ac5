"""`bertforge distill classify|regress`: a smaller student learns a fine-tuned teacher's outputs.

Task-specific knowledge distillation (Hinton et al., 2015; DistilBERT's and TinyBERT's prediction-layer
loss): the student is trained on the same examples as fine-tuning, with the loss

    alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) * CE(student, gold)

for classification (T the temperature; the T^2 keeps the soft term's gradients at the scale of the hard
one as T changes, as in Hinton et al.), and alpha * MSE(student, teacher) + (1 - alpha) * MSE(student,
gold) for regression. The teacher's outputs are computed once, before training, on every training
example (sorted by length, on the fused backend), and kept with the examples: for classification they
are a few numbers per example, so they always fit.

The student is, by default, the teacher cut down to some of its layers (`--student-layers`; every
other layer, as DistilBERT initialised its student from BERT), keeping its embeddings, the chosen
blocks, its pooler and its classifier: it starts close to the teacher. `--model` takes any other
student instead (a checkpoint of the same vocabulary, or a preset). The run writes the student as a
fine-tuned model, like `finetune`, and reports both models' dev scores, sizes and speeds.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import BertforgeError
from ..inference.backends import load as load_backend
from ..interop.hf import load_for_task
from ..jsonfile import dumps
from ..models.distillation import cut_down, student_layers
from ..models.registry import TASK_ARCHITECTURES
from ..runconfig import DistillConfig
from ..tasks.classification import ClassificationTask
from ..tokenization.kinds import load_tokenizer
from .finetune import build, run_seeds, train_and_export


class DistillationTask(ClassificationTask):
    """Fine-tuning's classification task, each training batch carrying the teacher's outputs for its rows."""

    def __init__(self, task: ClassificationTask, teacher_outputs: torch.Tensor, temperature: float,
                 alpha: float) -> None:
        self.__dict__.update(task.__dict__)
        self.teacher_outputs = teacher_outputs  # float [N, C], one row per training feature
        self.temperature, self.alpha = temperature, alpha

    def micro_batch(self, epoch: int, index: int) -> dict[str, torch.Tensor]:
        batch = super().micro_batch(epoch, index)
        rows = self.epoch_order(epoch)[index * self.batch_size:(index + 1) * self.batch_size]
        batch["teacher_logits"] = self.teacher_outputs[torch.as_tensor(rows, dtype=torch.long)]
        return batch

    def loss(self, model, batch):
        teacher = batch.pop("teacher_logits").float()
        out = model(**batch)
        student = out.logits.float()
        if self.regression:
            soft = F.mse_loss(student, teacher)
        else:
            T = self.temperature
            soft = F.kl_div(F.log_softmax(student / T, dim=-1), F.log_softmax(teacher / T, dim=-1),
                            reduction="batchmean", log_target=True) * T * T
        loss = self.alpha * soft + (1 - self.alpha) * out.loss
        return loss, {"soft_loss": soft.detach(), "gold_loss": out.loss.detach()}


def teacher_outputs(teacher: torch.nn.Module, task: ClassificationTask) -> torch.Tensor:
    """The teacher's logits on every training feature, float [N, C], in the features' order."""
    fast = load_backend(teacher, "fused")
    return torch.tensor(task.predict(fast, task.train, lambda out, _: out.logits.float().tolist()))


def rows_per_second(models: dict[str, Any], task: ClassificationTask, repeats: int = 3) -> dict[str, float]:
    """Dev-set throughput of each model on the fused backend, passes interleaved; the median of `repeats`."""
    times: dict[str, list[float]] = {name: [] for name in models}
    for name, model in models.items():  # warm-up (and the fused weights' packing)
        task.predict(model, task.dev[:64], lambda out, _: [0] * out.logits.shape[0])
    for _ in range(repeats):
        for name, model in models.items():
            start = time.perf_counter()
            task.predict(model, task.dev, lambda out, _: [0] * out.logits.shape[0])
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
        student, task = build(cfg, tokenizer, cfg.train, cfg.dev)
        if student.config.num_labels != teacher.config.num_labels or (
                cfg.task == "classify" and student.config.id2label != teacher.config.id2label):
            raise BertforgeError(f"--model {cfg.model}: its labels ({student.config.label_names}) are not the "
                                 f"teacher's ({teacher.config.label_names}) in the same order")
    else:
        keep = student_layers(cfg.student_layers, teacher.config.num_hidden_layers)
        student = cut_down(teacher, keep)
        student, task = build(cfg, tokenizer, cfg.train, cfg.dev, model=student)
        print(f"student: the teacher's layers {', '.join(map(str, keep))} of {teacher.config.num_hidden_layers}",
              flush=True)
    teacher_scores = task.evaluate(teacher)
    distilled = DistillationTask(task, teacher_outputs(teacher, task), cfg.temperature, cfg.alpha)
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
        "student_of_teacher": round(results[task.main_metric] / teacher_scores[task.main_metric], 4),
        "speedup_fused": round(speed["student"] / speed["teacher"], 3),
    })
    (out / "eval_results.json").write_text(dumps(results, indent=2) + "\n", encoding="utf-8")
    return results


def run_distill(cfg: DistillConfig, as_json: bool = True) -> dict[str, Any]:
    """One distillation run, or one per --seeds with mean and std; results also in OUT/eval_results.json."""
    if not Path(cfg.teacher).is_dir():
        raise BertforgeError(f"--teacher {cfg.teacher}: no such checkpoint directory")
    load_for_task(cfg.task, cfg.teacher, TASK_ARCHITECTURES[cfg.task])  # the wrong head is refused before --out
    return run_seeds(cfg, _run_one, as_json, "distillation")
