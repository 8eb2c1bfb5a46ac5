"""Fine-tuning benchmarks' shared parts: a task's first rows, and the transformers Trainer run against bertforge's."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import transformers

from bertforge import Tokenizer
from bertforge.training.finetune import FinetuneConfig, build

# The Trainer side shares its model, rows and arguments with tests/test_trainer_parity.py's harness.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from trainer_harness import SpanLossTrainer, hf_model, trainer_rows, training_args  # noqa: E402


def subset(src: Path, dst: Path, rows: int, conll: bool = False) -> Path:
    """The header and first `rows` rows of a TSV, or the first `rows` sentences of a CoNLL file."""
    lines = src.read_text(encoding="utf-8-sig").splitlines(keepends=True)
    if conll:
        out, sentences = [], 0
        for line in lines:
            out.append(line)
            if not line.strip():
                sentences += 1
                if sentences >= rows:
                    break
        lines = out
    else:
        lines = lines[: rows + 1]
    dst.write_text("".join(lines), encoding="utf-8")
    return dst


class EpochEval(transformers.TrainerCallback):
    """Evaluate the Trainer's model with the task's own metric code after every epoch."""

    def __init__(self, task) -> None:
        self.task, self.history = task, []

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        model.eval()
        self.history.append(self.task.evaluate(model))
        model.train()


def run_trainer(cfg: FinetuneConfig, train_path: str, eval_path: str, out: Path,
                span_loss_too: bool = False) -> tuple[dict, float]:
    """The transformers Trainer on bertforge's features for the same task; returns (best metrics, seconds).

    span_loss_too: score QA with bertforge's span loss instead of transformers' (an ablation).
    """
    torch.manual_seed(cfg.seed)
    tokenizer = Tokenizer.from_pretrained(cfg.model)
    ours, task = build(cfg, tokenizer, train_path, eval_path)
    model = hf_model(cfg.task, cfg.model, ours.config)
    from bertforge.data.batching import collate

    train = trainer_rows(task)
    args = training_args(cfg, out)
    callback = EpochEval(task)
    trainer_class = SpanLossTrainer if span_loss_too else transformers.Trainer
    trainer = trainer_class(model=model, args=args, train_dataset=train, callbacks=[callback],
                            data_collator=lambda rows: collate(rows, tokenizer.pad_token_id))
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    best = max(callback.history, key=lambda m: m[task.main_metric])
    return best, seconds
