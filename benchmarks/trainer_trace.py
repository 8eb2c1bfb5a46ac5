"""bertforge's training loop against the transformers Trainer, step by step, with the noise taken out.

`finetune_vs_trainer` runs the two libraries as users run them. Each draws its own data
order and dropout masks. So two single runs differ by seed noise, and a gap between means
can be noise or a bug.

This script removes both sources and looks at what is left:
- dropout is off in both models;
- both start from the same weights, including the newly initialised head;
- the Trainer gets bertforge's per-epoch order (a sampler);
- for QA, the Trainer's model is scored with bertforge's span loss, which leaves padding out
  of the softmax where transformers keeps it in (see `bertforge.heads.span_loss`).

What remains is shared by neither library: the forward pass, the loss, backward, clipping,
AdamW with its decay groups, and the warmup/decay schedule (the Trainer builds its own
optimizer and scheduler from TrainingArguments). If both libraries
do the same thing, the losses agree at every step up to float round-off. A bug in either
shows up as a gap that grows.

    python -m benchmarks.trainer_trace [--tasks sst2,stsb,conll,squad] [--rows 512] [--epochs 2]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import fields
from pathlib import Path

import torch

from bertforge.finetune import FinetuneConfig, build
from bertforge.hf import to_hf_state_dict
from bertforge.tasks import FeatureTask, collate
from bertforge.tokenizer import Tokenizer
from bertforge.train import TrainConfig, Trainer

from .common import DATA, RESULTS, machine, minilm_dir, need, save
from .finetune_vs_trainer import TASKS, SpanLossTrainer, hf_model, squad_split, subset, trainer_rows, training_args


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", default="sst2,stsb,conll,squad")
    parser.add_argument("--rows", type=int, default=512, help="training rows (sentences for conll)")
    parser.add_argument("--squad-paragraphs", type=int, default=1)
    parser.add_argument("--epochs", type=float, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--model", help="a checkpoint directory (default: all-MiniLM-L6-v2)")
    parser.add_argument("--eval-articles", type=int, default=1, help="SQuAD: dev articles 39.. to evaluate on")
    parser.add_argument("--dropout", action="store_true",
                        help="keep dropout on, each library drawing its own masks (stored under KEY~dropout~seedN)")
    args = parser.parse_args()
    model_dir = str(Path(args.model) if args.model else minilm_dir())
    previous = RESULTS / "trainer_trace.json"  # tasks and checkpoints traced separately accumulate in one file
    results = json.loads(previous.read_text()) if previous.exists() else {}
    label = Path(args.model).name if args.model else "all-MiniLM-L6-v2"
    for name in args.tasks.split(","):
        kind, train_rel, eval_rel, hyper, metric = TASKS[name]
        work = Path(tempfile.mkdtemp(prefix=f"bf-trace-{name}-"))
        if kind == "qa":
            train_path, dev_path = squad_split(work, args.squad_paragraphs, eval_articles=args.eval_articles)
        else:
            train_path = subset(need(DATA / train_rel), work / f"train{Path(train_rel).suffix}", args.rows,
                                conll=kind == "ner")
            dev_path = need(DATA / eval_rel)
        cfg = FinetuneConfig(task=kind, model=model_dir, train=str(train_path), dev=str(dev_path), out=str(work / "out"),
                             seed=args.seed, warmup=0.1, progress=False, **{**hyper, "epochs": args.epochs})
        result = trace(cfg, work, dropout=args.dropout)
        key = f"{name}@{label}" + (f"~dropout~seed{args.seed}" if args.dropout else "")
        flags = [f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k, v in vars(args).items()
                 if v is not None and v is not False and k not in ("tasks", "model")]
        results[key] = {"command": " ".join(["python -m benchmarks.trainer_trace", *flags, f"--tasks {name}"]
                                            + (["--model DIR"] if args.model else [])),
                        "machine": machine(), **result}
        print(f"{name}: {result['steps'][0]} steps; loss gap first {result['first_loss_gap']:.2e}, "
              f"max {result['max_loss_gap']:.2e}, last {result['last_loss_gap']:.2e}; "
              f"max weight gap {result['max_weight_gap']:.2e}; {metric}: bertforge "
              f"{result['bertforge_eval'][metric]:.4f}, transformers {result['transformers_eval'][metric]:.4f}",
              flush=True)
        save("trainer_trace", results)


if __name__ == "__main__":
    main()
