"""Cross-encoder training: (query, passage) pairs scored by one logit, as sentence-transformers' CrossEncoder.

Rows are read by column shape (`data/retrieval.py`): scored pairs (query, passage, label) train with binary
cross-entropy; (query, positive[, negatives...]) rows with MultipleNegativesRankingLoss, where each query must
score its positive above its own negatives and `num_negatives` other rows' passages drawn from the batch; rows with
a teacher's scores (`mine --scores`) distil them with MarginMSELoss or ListNetLoss (listwise). Every
pair of a batch goes through the model in one forward. Evaluation reranks a first stage's candidates (a TREC run
file, e.g. from `evaluate retrieval --run`) and scores the new ranking as trec_eval does; nDCG@10 selects.
"""

from __future__ import annotations

import numpy as np
import torch

from ..data.batching import collate
from ..data.retrieval import TupleData, read_tuples
from ..errors import InputError
from ..losses import check_negatives, losses_of, resolve
from ..retrieval.beir import RetrievalSet, candidates_for
from ..retrieval.evaluate import read_dev_set
from ..retrieval.metrics import evaluate_run
from ..retrieval.rerank import rerank_run
from ..tokenization.base import Tokenizer
from ..training.distributed import world_size
from ..training.model_card import Card
from .base import CardTask, length
from .embedding import global_batches, rank_rows

def rerank_loss_name(name: str | None, data: TupleData) -> str:
    """`--loss` as a sentence-transformers cross-encoder loss name, checked against the data's shape."""
    return resolve("rerank", name, data).name


class RerankTask(CardTask):
    """The Trainer's task for a one-logit sequence classifier (see `trainer.Task` and `base.Task`)."""

    card = Card("sentence-transformers", "sentence-transformers, cross-encoder, text-ranking", "text-ranking",
                "A reranker", "a cross-encoder: one relevance score per (query, passage) pair", '''```python
from sentence_transformers import CrossEncoder

model = CrossEncoder("{path}")
print(model.predict([("how do tides work?", "Tides are caused by the moon's gravity.")]))
```''',
                "bertforge serves it as well: `bertforge serve --model {path}` (TEI `/rerank`).")

    main_metric = "ndcg@10"
    greater_is_better = True

    def __init__(self, data: TupleData, dev: RetrievalSet, candidates: dict, tokenizer: Tokenizer, seq_len: int,
                 batch_size: int, seed: int, loss: str, num_negatives: int, scale: float, pos_weight: float | None,
                 top_k: int) -> None:
        self.data, self.dev, self.candidates, self.tokenizer = data, dev, candidates, tokenizer
        self.seq_len, self.batch_size, self.seed, self.loss_name = seq_len, batch_size, seed, loss
        self.loss_fn = losses_of("rerank")[loss].fn  # fn(logits [pairs], batch, scale, pos_weight)
        self.num_negatives, self.scale, self.pos_weight, self.top_k = num_negatives, scale, pos_weight, top_k
        if loss == "BinaryCrossEntropyLoss":
            bad = [(line, y) for line, y in zip(data.lines, data.scores) if not 0 <= y <= 1]
            if bad:
                raise InputError(f"{data.source}:{bad[0][0]}: label {bad[0][1]} lies outside [0, 1], which binary "
                                 "cross-entropy reads as a probability")
        self._epoch: tuple[int, list[list[int]]] | None = None

    def _epoch_batches(self, epoch: int) -> list[list[int]]:
        """The epoch's global batches, split between torchrun's processes (`rank_rows`): each query's in-batch
        negatives are drawn from the whole global batch, so N processes train as one on the global batch."""
        if self._epoch is None or self._epoch[0] != epoch:
            rows = self.data.rows if self.loss_name != "BinaryCrossEntropyLoss" else [(str(i),) for i in
                                                                                       range(len(self.data.rows))]
            self._epoch = (epoch, global_batches(rows, self.batch_size, self.seed, epoch))
        return self._epoch[1]

    def micro_batches_per_epoch(self, epoch: int) -> int:
        return len(self._epoch_batches(epoch)) * world_size()

    def activation_rows(self, batch_size: int) -> int:
        """(query, passage) pairs one forward holds (the loop's memory check): each row's candidates."""
        if self.loss_name == "BinaryCrossEntropyLoss":
            return batch_size
        passages = len(self.data.columns) - 1
        return batch_size * (passages + (0 if self.data.scores is not None else min(self.num_negatives,
                                                                                    batch_size * passages - 1)))

    def micro_batch(self, epoch: int, index: int) -> dict[str, torch.Tensor]:
        """All the batch's (query, passage) pairs, candidate by candidate: [B * C, T]; `scores` float [B] for
        binary cross-entropy. For ranking, candidate 0 is each row's positive, then the in-batch negatives (drawn
        with a generator seeded by (seed, epoch, index), so a resumed run draws the same), then its own negatives."""
        which, part = rank_rows(self._epoch_batches(epoch), index, self.batch_size)
        everyone = self._epoch_batches(epoch)[which]  # the global batch; this process trains on its `part`
        chosen = everyone[part]
        rows = [self.data.rows[i] for i in chosen]
        if self.loss_name == "BinaryCrossEntropyLoss":
            pairs = [(r[0], r[1]) for r in rows]
            batch = self._collate(pairs)
            batch["scores"] = torch.tensor([self.data.scores[i] for i in chosen], dtype=torch.float32)
            return batch
        columns = [[r[c] for r in rows] for c in range(1, len(self.data.columns))]
        if self.data.scores is not None:  # a teacher's scores: the row's own passages, positive first
            batch = self._collate([(rows[a][0], column[a]) for column in columns for a in range(len(rows))])
            batch["candidates"] = torch.tensor([len(columns)])
            batch["scores"] = torch.tensor([self.data.scores[i] for i in chosen], dtype=torch.float32)
            return batch
        # In-batch negatives: drawn for every row of the global batch from its other rows' passages (one draw per
        # global batch, seeded by (seed, epoch, batch)), then this process keeps its own rows' draws.
        every = [self.data.rows[i] for i in everyone]
        G, C = len(every), len(columns)
        flat = [r[c] for c in range(1, C + 1) for r in every]  # every passage of the global batch, column by column
        rng = np.random.default_rng([self.seed, 31, epoch, which])
        others = [[j * G + b for j in range(C) for b in range(G) if b != a] for a in range(G)]
        picks = min(self.num_negatives, len(others[0])) if others[0] else 0
        in_batch = [list(rng.choice(o, picks, replace=False)) if picks else [] for o in others][part]
        B = len(rows)
        candidates = [columns[0]] + [[flat[in_batch[a][k]] for a in range(B)] for k in range(picks)] + columns[1:]
        batch = self._collate([(rows[a][0], column[a]) for column in candidates for a in range(B)])
        batch["candidates"] = torch.tensor([len(candidates)])
        return batch

    def _collate(self, pairs: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
        enc = self.tokenizer([q for q, _ in pairs], [p for _, p in pairs], truncation=True, max_length=self.seq_len,
                             return_token_type_ids=True)
        return collate([{"input_ids": i, "token_type_ids": t} for i, t in zip(enc["input_ids"], enc["token_type_ids"])],
                       self.tokenizer.pad_token_id)

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        logits = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                       attention_mask=batch["attention_mask"]).logits.float().view(-1)
        return self.loss_fn(logits, batch, self.scale, self.pos_weight), {}

    def save(self, model, out, tokenizer: Tokenizer) -> None:
        """The Hugging Face directory, its tokenizer's model_max_length the training length: sentence-transformers'
        CrossEncoder reads that as its max_length (and Sigmoid as a one-logit model's activation)."""
        from ..interop.hf import save_pretrained

        tokenizer.model_max_length = self.seq_len
        save_pretrained(model, out, tokenizer=tokenizer)

    def card_settings(self, cfg) -> dict:
        return {"in-batch negatives per query": cfg.num_negatives if self.loss_name == "MultipleNegativesRankingLoss"
                else None, "positive weight": cfg.pos_weight, "candidates reranked": cfg.rerank_top_k}

    def evaluate(self, model) -> dict[str, float]:
        run = rerank_run(model, self.tokenizer, self.dev, self.candidates, self.top_k, self.batch_size * 2)
        return evaluate_run(run, self.dev.qrels)[0]


def build(cfg, tokenizer: Tokenizer, train_path: str, dev_path: str, model=None):
    """(cross-encoder, task) for `finetune rerank` (`cfg`: a `RerankConfig`)."""
    from pathlib import Path

    from ..interop.hf import family_of, load_pretrained, read_config

    data = read_tuples(train_path, cfg.train_split)
    row = resolve("rerank", cfg.loss, data)
    loss = row.name
    check_negatives(row, data, cfg.batch_size, world_size(), drawn=cfg.num_negatives)
    if model is None:
        cls = family_of(cfg.model).head("sequence-classification")
        if read_config(cfg.model).num_labels != 1 or cls.hf_architecture not in _architectures(Path(cfg.model)):
            model = load_pretrained(cls, cfg.model, num_labels=1, id2label=None, label2id=None)
        else:
            model = load_pretrained(cls, cfg.model)
    dev = read_dev_set(dev_path, cfg.dev_split)
    if dev is not None and not cfg.candidates:
        raise InputError("--candidates is required: the first stage's ranking of the --dev queries (a TREC run "
                         "file, e.g. from bertforge evaluate retrieval --run)")
    task = RerankTask(data, dev, candidates_for(dev, cfg.candidates) if dev is not None else {}, tokenizer,
                      length(cfg, model.config), cfg.batch_size, cfg.seed, loss,
                      cfg.num_negatives, cfg.scale if cfg.scale is not None else row.scale, cfg.pos_weight, cfg.rerank_top_k)
    return model, task


def _architectures(path) -> list[str]:
    import json

    return json.loads((path / "config.json").read_text(encoding="utf-8")).get("architectures") or []
