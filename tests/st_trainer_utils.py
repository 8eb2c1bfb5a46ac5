"""sentence-transformers' trainers run as the step-by-step references for `finetune embed` and `finetune rerank`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch


def without_dropout(source: Path, out: Path) -> Path:
    """A copy of a model directory with dropout off, so that two trainers' steps are deterministic."""
    shutil.copytree(source, out)
    config = json.loads((out / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (out / "config.json").write_text(json.dumps(config))
    return out


def reference_losses(trainer_cls, args_cls, model, loss, train, out: Path, batch_size: int, lr: float, epochs: int,
                     weight_decay: float) -> list[float]:
    """Train `model` with sentence-transformers' trainer (bertforge's recipe: AdamW eps 1e-6, 10% warmup, linear
    decay, clipping 1.0, no duplicate texts per batch) and return its per-step losses."""
    from sentence_transformers.training_args import BatchSamplers

    args = args_cls(
        output_dir=str(out), per_device_train_batch_size=batch_size, learning_rate=lr, num_train_epochs=epochs,
        warmup_ratio=0.1, weight_decay=weight_decay, adam_epsilon=1e-6, max_grad_norm=1.0,
        lr_scheduler_type="linear", seed=0, batch_sampler=BatchSamplers.NO_DUPLICATES, save_strategy="no",
        eval_strategy="no", logging_strategy="steps", logging_steps=1, report_to=[], use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True)
    trainer = trainer_cls(model=model, args=args, train_dataset=train, loss=loss)
    grad = torch.is_grad_enabled()  # the trainer leaves grad mode as it found it only on success
    try:
        trainer.train()
    finally:
        torch.set_grad_enabled(grad)
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]
