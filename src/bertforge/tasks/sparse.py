"""SPLADE training: a bi-encoder whose vectors are a weight per vocabulary word, kept sparse by a FLOPS regulariser.

It is the embedder's task (`embedding.py`: rows by column shape, batches without duplicate texts, GradCache,
torchrun's gathered negatives) with a `SpladeEncoder` for the model, sentence-transformers' sparse losses,
and `SpladeLoss`'s regularisers added: FLOPS (Paria et al., 2020: the sum over words of the squared mean
weight, which penalises words active in many texts) on the queries and on the documents, each with its own
weight, both warmed up quadratically from 0 over the first third of the steps, as sentence-transformers'
SpladeRegularizerWeightSchedulerCallback does by default. Evaluation searches the dev corpus through an exact
inverted index and reports the vectors' non-zeros beside nDCG@10.

An inference-free model's queries are tokenised without special tokens (as SparseStaticEmbedding reads them)
and weighted by its query weights; the batch says which rows are queries (`is_query`), so queries and
documents still run as one module call, and GradCache splits that flag with the rows.
"""

from __future__ import annotations

import numpy as np
import torch

from ..data.retrieval import read_tuples
from ..losses import check_negatives, resolve
from ..models.splade import SpladeEncoder
from ..retrieval.evaluate import read_dev_set
from ..retrieval.metrics import evaluate_run
from ..retrieval.search import as_run
from ..retrieval.sparse_index import InvertedIndex
from ..tokenization.base import Tokenizer
from ..training.model_card import Card
from ..training.distributed import gather, world_size
from .base import length
from .embedding import EmbeddingTask, resolve_prompts


def flops(vectors: torch.Tensor) -> torch.Tensor:
    """FLOPS regulariser of sparse vectors float [B, V]: sum over words of (mean weight over the batch)^2."""
    return vectors.mean(dim=0).pow(2).sum()


class SparseTask(EmbeddingTask):
    """The Trainer's task for a `SpladeEncoder`: an embedder's rows and losses plus SpladeLoss's regularisers."""

    card = Card("sentence-transformers", "sentence-transformers, sparse-encoder, splade, feature-extraction",
                "feature-extraction", "A SPLADE sparse encoder",
                "one weight per vocabulary word, searched with an inverted index", '''```python
from sentence_transformers import SparseEncoder

model = SparseEncoder("{path}")
queries = model.encode_query(["how do tides work?"])
documents = model.encode_document(["Tides are caused by the moon's gravity."])
print(model.similarity(queries, documents))
```''',
                "`bertforge evaluate retrieval --model {path}` scores it through an exact inverted index.")

    kind = "sparse"  # its losses' rows in `losses/registry.py`

    def __init__(self, *args, query_weight: float | None, document_weight: float, warmup_ratio: float = 1 / 3,
                 static_queries: bool = False, query_tokenizer: Tokenizer | None = None,
                 query_length: int | None = None, **kwargs) -> None:
        # Read by `_encode`, which the base class calls while it starts.
        self.static_queries, self.query_tokenizer, self.query_length = static_queries, query_tokenizer, query_length
        super().__init__(*args, **kwargs)
        self.query_tokenizer = self.query_tokenizer or self.tokenizer
        self.query_length = self.query_length or self.seq_len
        self.query_weight, self.document_weight, self.warmup_ratio = query_weight, document_weight, warmup_ratio
        self.factor = 0.0  # the regularisers' warm-up: 0 at step 0, quadratic to 1 at warmup_ratio of the steps

    def begin_step(self, step: int, total_steps: int | None) -> None:
        if total_steps is None:  # a time budget whose length is not measured yet: full weights, as ST's fallback
            self.factor = 1.0
            return
        warmup = max(1, int(total_steps * self.warmup_ratio))
        self.factor = 1.0 if step >= warmup else (step / warmup) ** 2

    def _encode(self, texts: list[str], query: bool) -> None:
        if not (query and self.static_queries):
            return super()._encode(texts, query)
        from ..inference.sparse import static_features

        tokenizer = self.query_tokenizer or self.tokenizer
        limit = self.query_length or self.seq_len
        for text, feature in zip(texts, static_features(tokenizer, [self.prompts.query + t for t in texts], limit)):
            self._ids[(text, True)] = feature["input_ids"]

    def micro_batch(self, epoch: int, index: int) -> dict[str, torch.Tensor]:
        """The embedder's batch; for an inference-free model, `is_query` bool [C * B] marks the query rows."""
        batch = super().micro_batch(epoch, index)
        if self.static_queries:
            rows = batch["input_ids"].shape[0] // len(self.data.columns)
            batch["is_query"] = torch.arange(batch["input_ids"].shape[0]) < rows
        return batch

    def vectors_loss(self, vectors: torch.Tensor, scores: torch.Tensor | None,
                     scale: float | torch.Tensor) -> torch.Tensor:
        """The base loss of the batch's vectors float [C * B, V], plus the FLOPS terms on the queries (column 0)
        and on every other column, at their warmed-up weights."""
        base = super().vectors_loss(vectors, scores, scale)
        # Under torchrun the averages are over the global batch: every process's vectors, gathered with their
        # gradients, so that N processes regularise exactly as one.
        columns = [gather(c)[0] for c in vectors.float().chunk(len(self.data.columns))]
        document = flops(torch.cat(columns[1:])) * (self.document_weight * self.factor)
        query = flops(columns[0]) * (self.query_weight * self.factor) if self.query_weight is not None else 0.0
        return base + document + query

    def sparse(self, model: SpladeEncoder, texts: list[str], query: bool):
        """Sparse vectors (scipy CSR float32 [len(texts), V]) with the query or document prompt, in input order: the
        inference path's, so evaluation sees what `evaluate retrieval` will."""
        from ..inference.sparse import sparse_embed

        static = query and model.inference_free
        return sparse_embed(model, self.query_tokenizer if static else self.tokenizer, texts, self.eval_batch_size,
                            self.query_length if static else self.seq_len,
                            self.prompts.query if query else self.prompts.document, query=query)

    def card_settings(self, cfg) -> dict:
        return {"similarity": "dot (sparse vectors over the vocabulary)", "SPLADE head": self.head,
                "query FLOPS weight": cfg.query_regularizer_weight,
                "document FLOPS weight": cfg.document_regularizer_weight,
                "regulariser warm-up": "quadratic over the first third of the steps",
                "max active dims": cfg.max_active_dims, "GradCache mini-batch": self.mini_batch_size,
                "query prompt": self.prompts.query or None, "document prompt": self.prompts.document or None}

    def evaluate(self, model: SpladeEncoder) -> dict[str, float]:
        queries = self.dev.judged_queries()
        doc_ids = list(self.dev.corpus)
        q = self.sparse(model, list(queries.values()), query=True)
        d = self.sparse(model, [self.dev.corpus[i] for i in doc_ids], query=False)
        run = as_run(list(queries), doc_ids, *InvertedIndex(d).search(q, 100))
        metrics = evaluate_run(run, self.dev.qrels)[0]
        metrics["nonzero_per_query"] = float(np.mean(q.getnnz(axis=1)))
        metrics["nonzero_per_document"] = float(np.mean(d.getnnz(axis=1)))
        return metrics

    def save(self, model: SpladeEncoder, out, tokenizer: Tokenizer) -> None:
        """The trained model as a sentence-transformers SparseEncoder directory, prompts included."""
        from ..interop.sparse_dir import save_sparse_dir

        save_sparse_dir(model, out, tokenizer, self.seq_len, self.prompts.named(),
                        None if self.query_tokenizer is self.tokenizer else self.query_tokenizer,
                        self.prompts.default_name)


def build(cfg, tokenizer: Tokenizer, train_path: str, dev_path: str, model: SpladeEncoder | None = None):
    """(SPLADE encoder, task) for `finetune sparse` (`cfg`: a `SparseConfig`)."""
    from ..errors import ConfigError
    from ..interop.sparse_dir import is_sparse_dir, load_splade, read_sparse_dir
    from ..settings import flag
    from ..tokenization.kinds import load_tokenizer

    data = read_tuples(train_path, cfg.train_split)
    row = resolve("sparse", cfg.loss, data)
    check_negatives(row, data, cfg.batch_size, world_size())
    if model is None:
        model = load_splade(cfg.model, cfg.pooling, cfg.activation, cfg.inference_free)
    if cfg.max_active_dims is not None:
        model.max_active_dims = cfg.max_active_dims
    query_tokenizer, query_length = None, None
    spec = read_sparse_dir(cfg.model) if is_sparse_dir(cfg.model) else None
    # The directory's prompts (and default) are kept unless a flag changes one, as `finetune embed` keeps them.
    prompts = resolve_prompts(cfg.query_prompt, cfg.document_prompt, spec.prompts if spec else {},
                              spec.default_prompt_name if spec else None)
    if model.inference_free:
        if spec is not None and spec.query_dir is not None:  # the directory's own query tokenizer and its limit
            query_tokenizer = load_tokenizer(spec.query_dir)
            query_length = query_tokenizer.model_max_length
        if cfg.query_lr is not None:
            model.query_weights.lr_ratio = cfg.query_lr / cfg.lr  # read by `training.optim.parameter_groups`
    elif cfg.query_lr is not None:
        raise ConfigError(f"{flag('query_lr')} is the rate of an inference-free model's query weights; add "
                          f"{flag('inference_free')}")
    task = SparseTask(data, read_dev_set(dev_path, cfg.dev_split), tokenizer, length(cfg, model.config), cfg.batch_size,
                      cfg.seed, row.name, cfg.scale, row.similarity, prompts,
                      mini_batch_size=cfg.mini_batch_size, query_weight=cfg.query_regularizer_weight,
                      document_weight=cfg.document_regularizer_weight, static_queries=model.inference_free,
                      query_tokenizer=query_tokenizer, query_length=query_length)
    task.head = f"{model.pooling} over the tokens of {'log(1 + log(1 + relu))' if model.activation == 'log1p_relu' else 'log(1 + relu)'} of the masked-LM logits"
    if model.inference_free:
        task.head += ("; inference-free: queries weighted by a learned weight per vocabulary word "
                      "(SparseStaticEmbedding), no encoder at query time")
    return model, task
