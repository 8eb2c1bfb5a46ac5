"""ColBERT training: queries and documents as token vectors, scored by MaxSim, with PyLate's losses.

It is the embedder's task (`embedding.py`: rows by column shape, batches without duplicate texts, torchrun's
global batches) with a `ColbertEncoder` for the model and PyLate's two losses (`losses/late_interaction.py`):
Contrastive over in-batch and hard negatives, and Distillation from a teacher's scores.

Queries are expanded with [MASK] to query_length and documents lose their skiplist tokens exactly as the
inference path (`inference/multi_vector.py`) does it, so training scores what `evaluate retrieval` will.
"""

from __future__ import annotations

import functools

import torch

from ..data.batching import collate
from ..data.retrieval import read_tuples
from ..errors import InputError
from ..interop.colbert_dir import ColbertSpec, skiplist_ids
from ..losses import check_negatives, resolve
from ..models.colbert import ColbertEncoder
from ..retrieval.evaluate import read_dev_set
from ..retrieval.late_interaction import maxsim_top_k
from ..retrieval.metrics import evaluate_run
from ..retrieval.search import as_run
from ..tokenization.base import Tokenizer
from ..training.model_card import Card
from .embedding import EmbeddingTask, Prompts
from ..training.distributed import world_size
from ..training.gradcache import cached_calls, embed_rows

class ColbertTask(EmbeddingTask):
    """The Trainer's task for a `ColbertEncoder`."""

    card = Card("PyLate", "PyLate, ColBERT, sentence-transformers, feature-extraction", "sentence-similarity",
                "A ColBERT model", "late interaction: one vector per token, scored by MaxSim", '''```python
from pylate import models

model = models.ColBERT("{path}")
queries = model.encode(["how do tides work?"], is_query=True)
documents = model.encode(["Tides are caused by the moon's gravity."], is_query=False)
```''',
                "`bertforge evaluate retrieval --model {path}` scores it by exact MaxSim; `bertforge predict embed "
                "--multi-vector` gives its token vectors.")

    kind = "colbert"  # its losses' rows in `losses/registry.py`

    def __init__(self, *args, spec: ColbertSpec, model_tokenizer: Tokenizer, **kwargs) -> None:
        self.spec = spec
        # The model's own tokenizer: it holds the prefix tokens the run's tokenizer (the checkpoint's) may lack.
        self.model_tokenizer = model_tokenizer
        self._real: dict[tuple[str, bool], int] = {}
        super().__init__(*args, **kwargs)
        self.tokenizer = model_tokenizer
        self.skiplist = torch.tensor(skiplist_ids(spec, model_tokenizer), dtype=torch.long)

    def _encode(self, texts: list[str], query: bool) -> None:
        from ..inference.multi_vector import colbert_features

        if not texts:
            return
        for text, feature in zip(texts, colbert_features(self.model_tokenizer, self.spec, texts, query)):
            self._ids[(text, query)] = feature["input_ids"]
            self._real[(text, query)] = feature["real"]

    def _side(self, texts: list[str], query: bool, length: int | None = None) -> dict[str, torch.Tensor]:
        """One side's collated batch: input_ids, token_type_ids, attention_mask (the attended tokens), kept (the
        vectors that count) [B, T], padded to `length` when given."""
        from ..inference.multi_vector import kept_positions

        features = self.features(texts, query)
        if length is not None:
            features.append({"input_ids": [0] * length, "token_type_ids": [0] * length})  # sets the width, dropped
        pad = self.model_tokenizer.mask_token_id if self.model_tokenizer.mask_token_id is not None \
            else self.model_tokenizer.pad_token_id
        batch = collate(features, pad)
        if length is not None:
            batch = {k: v[:-1] for k, v in batch.items()}
        real = torch.tensor([self._real[(t, query)] for t in texts], dtype=torch.long)
        batch["attention_mask"], batch["kept"] = kept_positions(batch, real, self.spec, query, self.skiplist)
        return batch

    def micro_batch(self, epoch: int, index: int) -> dict[str, torch.Tensor]:
        """The rows' queries (q_*: [B, Tq]) and documents column by column (d_*: [(C-1) * B, Td]); `scores` [B, N]
        for a teacher's scores."""
        chosen = self._rows_of(epoch, index)
        rows = [self.data.rows[i] for i in chosen]
        queries = self._side([r[0] for r in rows], True)
        # Documents padded to document_length, as PyLate's collator pads them: its scores count a dropped position as a
        # 0 in the max, so the width is part of the loss (and torchrun gathers equal shapes).
        documents = self._side([r[c] for c in range(1, len(self.data.columns)) for r in rows], False,
                               self.spec.document_length)
        batch = {**{f"q_{k}": v for k, v in queries.items()}, **{f"d_{k}": v for k, v in documents.items()}}
        batch["attention_mask"] = torch.cat([queries["attention_mask"].flatten(), documents["attention_mask"].flatten()])
        if self.data.scores is not None:
            batch["scores"] = torch.tensor([self.data.scores[i] for i in chosen], dtype=torch.float32)
        return batch

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        keep_masked = self.spec.do_query_expansion and not self.spec.attend_to_expansion_tokens
        queries = {k: batch[f"q_{k}"] for k in ("input_ids", "attention_mask", "token_type_ids")}
        documents = {k: batch[f"d_{k}"] for k in ("input_ids", "attention_mask", "token_type_ids")}
        if not self.mini_batch_size:
            q, d = model(**queries, keep_masked=keep_masked, documents=documents)
            return self.vectors_loss(q, d, batch), {}
        # GradCache: queries and then documents, `mini_batch_size` texts a call (PyLate's CachedContrastive embeds
        # each side in mini-batches too); the loss sees every vector of the batch.
        as_query = functools.partial(model, keep_masked=keep_masked)
        calls = [functools.partial(embed_rows, as_query, queries, slice(s, s + self.mini_batch_size))
                 for s in range(0, len(queries["input_ids"]), self.mini_batch_size)]
        split = len(calls)
        calls += [functools.partial(embed_rows, model, documents, slice(s, s + self.mini_batch_size))
                  for s in range(0, len(documents["input_ids"]), self.mini_batch_size)]
        return cached_calls(model, calls, lambda pieces: self.vectors_loss(torch.cat(pieces[:split]),
                                                                           torch.cat(pieces[split:]), batch)), {}

    def vectors_loss(self, q: torch.Tensor, d: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The loss of the batch's query vectors q [B, Tq, D] and document vectors d [(C-1) * B, Td, D] (column by
        column, as `micro_batch` lays them out)."""
        B, N = q.shape[0], len(self.data.columns) - 1
        # Column-major documents ([N * B]) as each row's own: [B, N, Td, D], the positive first.
        documents = d.float().view(N, B, *d.shape[1:]).transpose(0, 1)
        kept = batch["d_kept"].view(N, B, -1).transpose(0, 1)
        query_kept = None if self.spec.do_query_expansion else batch["q_kept"]
        return self.loss_fn(q.float(), query_kept, documents, kept, batch.get("scores"), self.scale)

    def vectors(self, model: ColbertEncoder, texts: list[str], query: bool) -> list:
        from ..inference.multi_vector import multi_vector_embed

        return multi_vector_embed(model, self.model_tokenizer, self.spec, texts, query, self.eval_batch_size)

    def card_settings(self, cfg) -> dict:
        spec = self.spec
        return {"similarity": "MaxSim", "vector size": cfg.dim, "query prefix": repr(spec.query_prefix),
                "document prefix": repr(spec.document_prefix), "query length": spec.query_length,
                "document length": spec.document_length, "query expansion": spec.do_query_expansion,
                "attend to expansion tokens": spec.attend_to_expansion_tokens,
                "temperature": cfg.temperature if self.loss_name == "Contrastive" else None,
                "GradCache mini-batch": self.mini_batch_size}

    def card_prompts(self) -> dict[str, str]:
        return {}  # PyLate's encode takes no prompt names

    def evaluate(self, model: ColbertEncoder) -> dict[str, float]:
        queries = self.dev.judged_queries()
        doc_ids = list(self.dev.corpus)
        q = self.vectors(model, list(queries.values()), query=True)
        d = self.vectors(model, [self.dev.corpus[i] for i in doc_ids], query=False)
        run = as_run(list(queries), doc_ids, *maxsim_top_k(q, d, 100, model.dimension))
        return evaluate_run(run, self.dev.qrels)[0]

    def save(self, model: ColbertEncoder, out, tokenizer: Tokenizer) -> None:
        """The trained model as a PyLate ColBERT directory (the model's tokenizer, with its prefix tokens)."""
        from ..interop.colbert_dir import save_colbert_dir

        save_colbert_dir(model, out, self.model_tokenizer, self.spec)


def build(cfg, tokenizer: Tokenizer, train_path: str, dev_path: str, model: ColbertEncoder | None = None):
    """(ColBERT encoder, task) for `finetune colbert` (`cfg`: a `ColbertConfig`)."""
    from ..interop.colbert_dir import check_expansion, load_colbert

    data = read_tuples(train_path, cfg.train_split)
    row = resolve("colbert", cfg.loss, data)
    loss = row.name
    check_negatives(row, data, cfg.batch_size, world_size())
    if loss == "Distillation" and len(data.columns) < 4:
        # Min-max normalised per row, two scores are 0 and 1 whatever the model: the loss would have no gradient
        # (PyLate trains nothing from such rows, silently).
        raise InputError(f"{data.source}: Distillation needs at least 3 passages a row, these rows have "
                         f"{len(data.columns) - 1}: with 2, the min-max normalisation of each row's scores leaves "
                         "them 0 and 1 whatever the model, so nothing would be trained")
    loaded, spec, model_tokenizer = load_colbert(cfg.model, cfg.dim)
    if model is None:
        model = loaded
    for key in ("query_length", "document_length"):
        if getattr(cfg, key) is not None:
            setattr(spec, key, getattr(cfg, key))
    if cfg.attend_to_expansion_tokens is not None:
        spec.attend_to_expansion_tokens = cfg.attend_to_expansion_tokens
    if cfg.no_query_expansion:
        spec.do_query_expansion, spec.attend_to_expansion_tokens = False, False
    longest = model.config.max_sequence_length
    if max(spec.query_length, spec.document_length) > longest:
        raise InputError(f"--query-length / --document-length: {max(spec.query_length, spec.document_length)} "
                         f"tokens; the model has {longest} positions")
    check_expansion(model.backbone, spec, "--attend-to-expansion-tokens")
    task = ColbertTask(data, read_dev_set(dev_path, cfg.dev_split), tokenizer, spec.document_length,
                       cfg.batch_size, cfg.seed, loss, cfg.temperature, "MaxSim", Prompts(),
                       mini_batch_size=cfg.mini_batch_size, spec=spec, model_tokenizer=model_tokenizer)
    return model, task
