"""SPLADE training: a bi-encoder whose vectors are a weight per vocabulary word, kept sparse by a FLOPS regulariser.

It is the embedder's task (`embedding.py`: rows by column shape, batches without duplicate texts, GradCache,
torchrun's gathered negatives) with a `SpladeEncoder` for the model, sentence-transformers' sparse losses,
and `SpladeLoss`'s regularisers added: FLOPS (Paria et al., 2020: the sum over words of the squared mean
weight, which penalises words active in many texts) on the queries and on the documents, each with its own
weight, both warmed up quadratically from 0 over the first third of the steps, as sentence-transformers'
SpladeRegularizerWeightSchedulerCallback does by default. Evaluation searches the dev corpus through an exact
inverted index and reports the vectors' non-zeros beside nDCG@10.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ..data.retrieval import read_tuples
from ..models.splade import SpladeEncoder
from ..retrieval.evaluate import read_retrieval_set
from ..retrieval.metrics import evaluate_run
from ..retrieval.search import as_run
from ..retrieval.sparse_index import InvertedIndex
from ..tokenization.tokenizer import Tokenizer
from .embedding import EmbeddingTask, Prompts
from .embedding_losses import (ROWS, SCORED_PAIRS, SCORED_TUPLES, cosent, distill_kl_div, gather, margin_mse,
                               multiple_negatives_ranking, resolve_loss)

# sentence-transformers' sparse losses: (function, rows, default scale, the similarity it compares with).
SPARSE_LOSSES: dict[str, tuple[Callable[..., torch.Tensor], str, float, str]] = {
    "SparseMultipleNegativesRankingLoss": (multiple_negatives_ranking, ROWS, 1.0, "dot"),
    "SparseCoSENTLoss": (cosent, SCORED_PAIRS, 20.0, "cosine"),
    "SparseMarginMSELoss": (margin_mse, SCORED_TUPLES, 1.0, "dot"),
    "SparseDistillKLDivLoss": (distill_kl_div, SCORED_TUPLES, 2.0, "dot"),  # its "scale" is the temperature
}
SPARSE_ALIASES = {"mnrl": "SparseMultipleNegativesRankingLoss", "in-batch": "SparseMultipleNegativesRankingLoss",
                  "cosent": "SparseCoSENTLoss", "margin-mse": "SparseMarginMSELoss", "kl": "SparseDistillKLDivLoss"}
SPARSE_DEFAULTS = {ROWS: "SparseMultipleNegativesRankingLoss", SCORED_PAIRS: "SparseCoSENTLoss",
                   SCORED_TUPLES: "SparseMarginMSELoss"}


def flops(vectors: torch.Tensor) -> torch.Tensor:
    """FLOPS regulariser of sparse vectors float [B, V]: sum over words of (mean weight over the batch)^2."""
    return vectors.mean(dim=0).pow(2).sum()


class SparseTask(EmbeddingTask):
    """The Trainer's task for a `SpladeEncoder`: an embedder's rows and losses plus SpladeLoss's regularisers."""

    losses = {name: (fn, rows, scale) for name, (fn, rows, scale, _) in SPARSE_LOSSES.items()}

    def __init__(self, *args, query_weight: float | None, document_weight: float, warmup_ratio: float = 1 / 3,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.query_weight, self.document_weight, self.warmup_ratio = query_weight, document_weight, warmup_ratio
        self.factor = 0.0  # the regularisers' warm-up: 0 at step 0, quadratic to 1 at warmup_ratio of the steps

    def begin_step(self, step: int, total_steps: int | None) -> None:
        if total_steps is None:  # a time budget whose length is not measured yet: full weights, as ST's fallback
            self.factor = 1.0
            return
        warmup = max(1, int(total_steps * self.warmup_ratio))
        self.factor = 1.0 if step >= warmup else (step / warmup) ** 2

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

        return sparse_embed(model, self.tokenizer, texts, self.eval_batch_size, self.seq_len,
                            self.prompts.query if query else self.prompts.document)

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

        save_sparse_dir(model, out, tokenizer, self.seq_len, self.prompts.named())


def build(cfg, tokenizer: Tokenizer, train_path: str, dev_path: str, model: SpladeEncoder | None = None):
    """(SPLADE encoder, task) for `finetune sparse` (`cfg`: a `SparseConfig`)."""
    from ..interop.sparse_dir import load_splade

    data = read_tuples(train_path, cfg.train_split)
    loss = resolve_loss(cfg.loss, data, {n: rows for n, (_, rows, _, _) in SPARSE_LOSSES.items()}, SPARSE_ALIASES,
                        SPARSE_DEFAULTS)
    if model is None:
        model = load_splade(cfg.model, cfg.pooling, cfg.activation)
    if cfg.max_active_dims is not None:
        model.max_active_dims = cfg.max_active_dims
    task = SparseTask(data, read_retrieval_set(dev_path, cfg.dev_split), tokenizer, cfg.seq_len, cfg.batch_size,
                      cfg.seed, loss, cfg.scale, SPARSE_LOSSES[loss][3], Prompts(cfg.query_prompt, cfg.document_prompt),
                      mini_batch_size=cfg.mini_batch_size, query_weight=cfg.query_regularizer_weight,
                      document_weight=cfg.document_regularizer_weight)
    task.head = f"{model.pooling} over the tokens of {'log(1 + log(1 + relu))' if model.activation == 'log1p_relu' else 'log(1 + relu)'} of the masked-LM logits"
    return model, task
