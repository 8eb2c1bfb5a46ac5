"""What every fine-tuning task shares: the task protocol with its defaults (`Task`, `CardTask`), shuffled
training batches and length-sorted prediction over feature dicts (`FeatureTask`), and the model a task starts from
(`new_model`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..data.batching import collate
from ..errors import InputError
from ..inference.loop import device_of, run_sorted
from ..interop.hf import family_of, load_pretrained, read_config, save_pretrained
from ..models.config import BertConfig
from ..models.registry import HEADS
from ..settings import FinetuneConfig, run_length
from ..tokenization.base import Tokenizer
from ..training.model_card import Card, write_model_card


class Task:
    """A fine-tuning task object: the loop's `trainer.Task` (batches, loss, evaluation) plus what `finetune` does
    with the trained model, each with the default a task overrides only where it differs."""

    main_metric = "loss"  # the evaluation figure that selects the model
    greater_is_better = True
    seq_len: int | None = None  # the run's length in tokens, worked out once by the task's build (`length`)

    def save(self, model: torch.nn.Module, out: Path, tokenizer: Tokenizer) -> None:
        """Write the trained model to `out`: by default the Hugging Face layout with its tokenizer."""
        save_pretrained(model, out, tokenizer=tokenizer)

    def write_card(self, out: Path, cfg: Any, results: dict[str, Any]) -> None:
        """Write a README.md model card beside the model (the table's `card` tasks); by default none."""

    def prediction_rows(self, model: torch.nn.Module) -> list[dict] | dict:
        """`evaluate --predictions`: the model's predictions on the dev data, one JSON object each (a list), or one
        object for the whole file (a dict: SQuAD's question id -> answer)."""
        raise NotImplementedError(f"{type(self).__name__} writes no predictions")


def length(cfg: Any, config: Any, default: int | None = None) -> int:
    """The run's length for a task's model (`config`): --seq-len as given, honoured or refused, else `default` (the
    task's table row's when None) cut to the model's positions. The settings are left as the user gave them."""
    from .table import task_spec

    return run_length(cfg.seq_len, default or task_spec(cfg.task).seq_len, config)


class CardTask(Task):
    """A task whose output carries a README.md model card (the retrieval trainers: their users' libraries write
    one beside every model they save)."""

    card: Card  # what the card says of the model's kind (its library, tags, usage, serving)

    def card_settings(self, cfg: Any) -> dict[str, Any]:
        """The card's training-settings rows this task adds to the loop's (None: left out)."""
        return {}

    def card_prompts(self) -> dict[str, str]:
        """The named prompts the card's usage example passes (`prompt_name`)."""
        return {}

    def write_card(self, out: Path, cfg: Any, results: dict[str, Any]) -> None:
        write_model_card(out, cfg, self, results)


class FeatureTask(Task):
    """Shuffled training batches and length-sorted prediction over feature dicts."""

    def __init__(self, train: list[dict], dev: list[dict], batch_size: int, seed: int, pad_id: int,
                 pack_to: int | None = None) -> None:
        self.train, self.dev = train, dev
        self.batch_size, self.seed, self.pad_id = batch_size, seed, pad_id
        self.pack_to = pack_to  # training batches keep batch_size examples, packed into rows of this many tokens
        self._order: tuple[int, np.ndarray] | None = None

    def micro_batches_per_epoch(self, epoch: int) -> int:
        # The last, smaller batch is kept, as transformers' Trainer keeps it: every example counts.
        return -(-len(self.train) // self.batch_size)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The training features' order in an epoch: a permutation fixed by (seed, epoch), so resume needs no state."""
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, np.random.default_rng([self.seed, 23, epoch]).permutation(len(self.train)))
        return self._order[1]

    def micro_batch(self, epoch: int, index: int) -> dict[str, torch.Tensor]:
        rows = self.epoch_order(epoch)[index * self.batch_size:(index + 1) * self.batch_size]
        return collate([self.train[int(r)] for r in rows], self.pad_id, self.pack_to)

    def loss(self, model, batch):
        return model(**batch).loss, {}

    @torch.no_grad()
    def predict(self, model, features: list[dict], take: Callable) -> list:
        """`take(output, batch)` -> one item per row; batches sorted by length, results in input order."""
        def step(batch: dict, rows: list[int]) -> list:
            inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
            return take(model(**inputs), batch)

        return run_sorted(features, self.pad_id, self.batch_size * 2, step, device=device_of(model))


def new_model(cfg: FinetuneConfig, cls: type, labels: list[str] | None, tokenizer: Tokenizer):
    """The model with a head for `labels` (`cls`, BERT's class of that head, or the same head of a checkpoint's
    family); a checkpoint's own label set must match the data's."""
    id2label = {i: name for i, name in enumerate(labels)} if labels else None
    num_labels = len(labels) if labels else (2 if cfg.task == "qa" else 1)
    problem = "regression" if cfg.task == "regress" else None
    if Path(cfg.model).is_dir():
        # The same head of the checkpoint's own family (a RoBERTa directory gets RobertaForSequenceClassification).
        cls = family_of(cfg.model).head(HEADS[cls.hf_architecture].kind)
        existing = read_config(cfg.model)
        named = existing.id2label and not all(v.startswith("LABEL_") for v in existing.id2label.values())
        archs = json.loads((Path(cfg.model) / "config.json").read_text(encoding="utf-8")).get("architectures") or []
        if named and cls.hf_architecture in archs and labels:
            if set(existing.id2label.values()) != set(labels):
                raise InputError(f"{cfg.model}: the model's labels ({', '.join(existing.id2label.values())}) differ "
                                 f"from the data's ({', '.join(labels)}); start from a backbone checkpoint instead")
            id2label = existing.id2label  # keep the checkpoint's label order
        return load_pretrained(cls, cfg.model, num_labels=num_labels, id2label=id2label,
                               label2id={v: k for k, v in id2label.items()} if id2label else None,
                               problem_type=problem)
    config = BertConfig.from_preset(cfg.model, vocab_size=len(tokenizer), num_labels=num_labels,
                                    id2label=id2label, problem_type=problem)
    return cls(config)
