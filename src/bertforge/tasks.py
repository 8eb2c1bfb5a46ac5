"""Fine-tuning task specs for the one training loop: how batches are made, and how a task is scored.

Every task works on pre-tokenised features (dicts of `input_ids`, `token_type_ids` and a
label). `FeatureTask` shuffles them per epoch by (seed, epoch), pads each batch to its
longest row (or packs it, see `data/batching.py`), and predicts in length-sorted batches; the subclasses only turn predictions
into their metric. QA's features and post-processing live in `data/qa.py`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from .data.batching import collate
from .heads import IGNORE_INDEX
from .inference import device_of, run_sorted
from .metrics import classification_metrics, entity_metrics, regression_metrics


class FeatureTask:
    """Shuffled training batches and length-sorted prediction over feature dicts."""

    main_metric = "loss"
    greater_is_better = True

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


class ClassificationTask(FeatureTask):
    """Single-label classification (accuracy selects the model) or, with `regression`, Pearson."""

    def __init__(self, *args, id2label: dict[int, str] | None = None, regression: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.id2label, self.regression = id2label, regression
        self.main_metric = "pearson" if regression else "accuracy"

    def predictions(self, model, features: list[dict]) -> list:
        if self.regression:
            return self.predict(model, features, lambda out, _: out.logits.squeeze(-1).float().tolist())
        return self.predict(model, features, lambda out, _: out.logits.argmax(-1).tolist())

    def evaluate(self, model) -> dict[str, float]:
        return self.score(self.predictions(model, self.dev), [f["labels"] for f in self.dev])

    def score(self, predicted: list, gold: list) -> dict[str, float]:
        if self.regression:
            return regression_metrics(gold, predicted)
        names = [self.id2label[i] for i in range(len(self.id2label))]
        return classification_metrics([names[g] for g in gold], [names[p] for p in predicted], labels=names)


class TokenClassificationTask(FeatureTask):
    """NER: predictions at each word's first sub-token, scored as entities (seqeval)."""

    main_metric = "f1"

    def __init__(self, *args, id2label: dict[int, str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.id2label = id2label

    def word_tags(self, model, features: list[dict]) -> list[list[str]]:
        """Predicted IOB2 tags per word; words cut off by truncation are tagged O."""

        def take(out, batch):
            best = out.logits.argmax(-1).cpu()
            return [best[i][batch["labels"][i] != IGNORE_INDEX].tolist() for i in range(best.shape[0])]

        tags = []
        for feature, ids in zip(features, self.predict(model, features, take)):
            words = [self.id2label[i] for i in ids]
            tags.append(words + ["O"] * (feature["num_words"] - len(words)))
        return tags

    def evaluate(self, model) -> dict[str, float]:
        result = entity_metrics([f["tags"] for f in self.dev], self.word_tags(model, self.dev))
        per_type = result.pop("per_type")
        result.update({f"{name}_f1": v["f1"] for name, v in per_type.items()})
        return result


class QuestionAnsweringTask(FeatureTask):
    """Extractive QA: start/end logits per window, answers merged across windows, SQuAD EM/F1."""

    main_metric = "f1"

    def __init__(self, *args, examples: list, raw: list[dict], n_best: int = 20, max_answer_len: int = 30,
                 null_threshold: float | None = None, tune_null_threshold: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.examples, self.raw = examples, raw
        self.n_best, self.max_answer_len = n_best, max_answer_len
        self.null_threshold, self.tune = null_threshold, tune_null_threshold
        self.has_impossible = any(e.impossible for e in examples)

    def answers(self, model, features: list[dict] | None = None,
                use_null: bool = True) -> tuple[dict[str, str], dict[str, float]]:
        """(question id -> answer, question id -> null-minus-best-span margin) over all windows."""
        from .data.qa import best_answers

        features = features if features is not None else self.dev

        def take(out, batch):
            lengths = batch["attention_mask"].sum(1).tolist()
            s, e = out.start_logits.float().cpu().numpy(), out.end_logits.float().cpu().numpy()
            return [(s[i, :n], e[i, :n]) for i, n in enumerate(lengths)]

        logits = self.predict(model, features, take)
        threshold = None
        if use_null and self.has_impossible:
            threshold = self.null_threshold if self.null_threshold is not None else 0.0
        return best_answers(self.examples, features, [x[0] for x in logits], [x[1] for x in logits],
                            self.n_best, self.max_answer_len, threshold)

    def evaluate(self, model) -> dict[str, float]:
        from .metrics import squad_metrics

        if self.has_impossible and self.tune:
            # Score every question with its best span, and let the v2 threshold search pick the cut.
            spans, margins = self.answers(model, use_null=False)
            result = squad_metrics(self.raw, spans, margins)
            self.null_threshold = result.get("best_f1_thresh", 0.0)
            result.update(squad_metrics(self.raw, spans, margins, threshold=self.null_threshold))
            result["null_threshold"] = self.null_threshold
            return result
        return squad_metrics(self.raw, self.answers(model)[0])
