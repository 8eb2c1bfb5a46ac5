"""The transformers side of the Trainer comparisons, shared by tests/test_trainer_parity.py and
benchmarks/finetune_vs_trainer.py: the matching transformers model and TrainingArguments, a Trainer
that scores QA with bertforge's span loss, and `trace`, which runs both libraries step by step with
the noise taken out (dropout off, one start, bertforge's data order given to the Trainer) so that
what is left, the loss, clipping, AdamW with its decay groups and the schedule, must agree to
round-off. The script that ran `trace` on whole datasets is retired; its conclusions are in
docs/results.md.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import torch
import transformers

from bertforge.training.finetune import FinetuneConfig, build
from bertforge.models.heads import span_loss
from bertforge.interop.hf import to_hf_state_dict
from bertforge.data.batching import collate
from bertforge.tasks.base import FeatureTask
from bertforge import Tokenizer
from bertforge.training.trainer import TrainConfig, Trainer


HF_HEADS = {"classify": "BertForSequenceClassification", "regress": "BertForSequenceClassification",
            "ner": "BertForTokenClassification", "qa": "BertForQuestionAnswering"}
FEATURE_KEYS = ("input_ids", "token_type_ids", "labels", "start_positions", "end_positions")


def hf_model(kind: str, path: str, config, **overrides):
    """transformers' `BertFor…` for a task, from `path`, with bertforge's label set and problem type."""
    kwargs = {"num_labels": config.num_labels, **overrides}
    if kind in ("classify", "ner"):
        kwargs.update(id2label=config.id2label, label2id=config.label2id)
    if kind == "regress":
        kwargs["problem_type"] = "regression"
    return getattr(transformers, HF_HEADS[kind]).from_pretrained(path, **kwargs)


class SpanLossTrainer(transformers.Trainer):
    """The Trainer, its QA models scored with bertforge's span loss (padding left out of the softmax).

    QA is the one task where bertforge's loss differs from transformers' by design (see
    `bertforge.models.heads.span_loss`); this Trainer takes that difference out, for the step trace
    and for the `--trainer-loss bertforge` ablation. Other tasks keep transformers' own loss.
    """

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if "start_positions" not in inputs:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inputs = dict(inputs)
        start, end = inputs.pop("start_positions"), inputs.pop("end_positions")
        outputs = model(**inputs)
        loss = span_loss(outputs.start_logits, outputs.end_logits, start, end, inputs["attention_mask"])
        return (loss, outputs) if return_outputs else loss


def trainer_rows(task) -> list[dict]:
    """bertforge's training features with only the keys the transformers model takes."""
    return [{k: f[k] for k in FEATURE_KEYS if k in f} for f in task.train]


def training_args(cfg: FinetuneConfig, out: Path) -> transformers.TrainingArguments:
    """The Trainer's settings matching a bertforge config: AdamW eps 1e-6, decay 0.01, clipping 1.0, linear warmup."""
    return transformers.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=cfg.batch_size, learning_rate=cfg.lr,
        num_train_epochs=cfg.epochs, warmup_steps=cfg.warmup, weight_decay=cfg.weight_decay, adam_epsilon=1e-6,
        max_grad_norm=cfg.max_grad_norm, lr_scheduler_type="linear", seed=cfg.seed, save_strategy="no",
        eval_strategy="no", logging_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0,
        disable_tqdm=True)


def no_dropout(model: torch.nn.Module) -> None:
    """Dropout off everywhere, including the attention-probability dropout inside SDPA."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if hasattr(module, "dropout_p"):
            module.dropout_p = 0.0


class EpochOrder(torch.utils.data.Sampler):
    """Yields a bertforge task's order for epoch 0, then epoch 1, …: one epoch per iteration."""

    def __init__(self, task: FeatureTask) -> None:
        self.task, self.epoch = task, 0

    def __len__(self) -> int:
        return len(self.task.train)

    def __iter__(self):
        order = self.task.epoch_order(self.epoch).tolist()
        self.epoch += 1
        return iter(order)


class AlignedTrainer(SpanLossTrainer):
    """The Trainer with bertforge's data order and span loss; it records each step's loss."""

    def __init__(self, *args, task: FeatureTask, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.task, self.losses = task, []

    def _get_train_sampler(self, train_dataset=None):
        return EpochOrder(self.task)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        result = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self.losses.append(float((result[0] if return_outputs else result).detach()))
        return result


def trace(cfg: FinetuneConfig, work: Path, dropout: bool = False) -> dict:
    """Both libraries from one start, on one data order, dropout off; losses and metrics of each.

    dropout: keep dropout on in both, each library drawing its own masks (the Trainer from
    another seed). The runs are then paired: one start, one order, one schedule, and only the
    dropout draws free, so their gap shows what the draws alone do to a run.
    """
    torch.manual_seed(cfg.seed)
    tokenizer = Tokenizer.from_pretrained(cfg.model)
    model, task = build(cfg, tokenizer, cfg.train, cfg.dev)
    if not dropout:
        no_dropout(model)
    start = work / "start"
    model.save_pretrained(start, tokenizer=tokenizer)  # the new head's initial weights go to the Trainer too

    train_cfg = TrainConfig(**{f.name: getattr(cfg, f.name) for f in fields(TrainConfig)})
    train_cfg.out, train_cfg.log_every, train_cfg.save_every = str(work / "bertforge"), 1, None
    train_cfg.precision = "fp32"  # the Trainer's default arithmetic: the step-by-step comparison is of the same maths
    ours = Trainer(model, task, train_cfg)
    summary = ours.fit()  # it ends with a dev evaluation of the final model
    rows = [json.loads(line) for line in (work / "bertforge" / "metrics.jsonl").read_text().splitlines()]
    bf_losses = [r["loss"] for r in rows if "loss" in r]

    overrides = {} if dropout else dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    theirs = hf_model(cfg.task, str(start), model.config, **overrides)
    args = training_args(cfg, work / "transformers")
    if dropout:  # the seed only drives the Trainer's dropout here (the order is bertforge's): other draws
        args.seed = cfg.seed + 10_000
    trainer = AlignedTrainer(model=theirs, args=args, train_dataset=trainer_rows(task),
                             data_collator=lambda rows: collate(rows, tokenizer.pad_token_id), task=task)
    trainer.train()
    hf_losses = trainer.losses

    gaps = [abs(a - b) for a, b in zip(bf_losses, hf_losses)]
    mapped = to_hf_state_dict(model)
    theirs_params = theirs.state_dict()
    weight_gap = max(float((mapped[k].float() - theirs_params[k].float()).abs().max()) for k in mapped if k in theirs_params)
    result = {"steps": [len(bf_losses), len(hf_losses)], "bertforge_loss": bf_losses, "transformers_loss": hf_losses,
              "max_loss_gap": max(gaps), "first_loss_gap": gaps[0], "last_loss_gap": gaps[-1],
              "mean_loss": [sum(bf_losses) / len(bf_losses), sum(hf_losses) / len(hf_losses)], "dropout": dropout,
              "max_weight_gap": weight_gap, "compared_weights": sum(k in theirs_params for k in mapped),
              "weights": len(model.state_dict())}
    theirs.eval()
    result["bertforge_eval"], result["transformers_eval"] = summary["eval"], task.evaluate(theirs)
    return result
