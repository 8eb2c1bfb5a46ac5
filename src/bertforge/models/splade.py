"""SPLADE: a masked-LM model read as a sparse bag of weighted vocabulary words (Formal et al., 2021).

Each token's masked-LM logits say which vocabulary words it evokes; SPLADE keeps, for every word, the
largest (or the summed) log(1 + relu(logit)) over the text's real tokens: one weight per vocabulary
word, almost all of them zero once trained with a sparsity regulariser. Relevance is the dot product
of two such vectors, which an inverted index computes exactly. This is sentence-transformers'
SparseEncoder stack (a fill-mask Transformer, then SpladePooling) as one trainable module; the files
live in `interop/sparse_dir.py`.

The inference-free variant (Geng et al., 2024; OpenSearch's doc-v2/v3 models) encodes queries with no
encoder at all: a query's vector is one learned weight per vocabulary word it contains
(sentence-transformers' SparseStaticEmbedding behind a Router), documents go through SPLADE as above.
One module holds both, so a training batch of queries and documents is one call (one DDP forward).
"""

from __future__ import annotations

import torch
from torch import nn

SPLADE_POOLING = ("max", "sum")
SPLADE_ACTIVATIONS = ("relu", "log1p_relu")


class SpladeEncoder(nn.Module):
    """Texts' token ids -> one non-negative weight per vocabulary word.

    mlm: any family's masked-LM model (`BertForMaskedLM`, `ModernBertForMaskedLM`, ...).
    pooling: "max" (SPLADE v2 and later) or "sum" (the first SPLADE) over the text's tokens.
    activation: "relu" (log(1 + relu(x))) or "log1p_relu" (log(1 + log(1 + relu(x))), OpenSearch's models).
    max_active_dims: keep only this many largest weights per text at inference (None: all).
    query_weights: float [V]: make the model inference-free, queries weighted by these static per-word weights.
    """

    def __init__(self, mlm: nn.Module, pooling: str = "max", activation: str = "relu",
                 max_active_dims: int | None = None, query_weights: torch.Tensor | None = None) -> None:
        super().__init__()
        if pooling not in SPLADE_POOLING or activation not in SPLADE_ACTIVATIONS:
            raise ValueError(f"SPLADE pooling {pooling!r} / activation {activation!r}: use one of {SPLADE_POOLING} "
                             f"and one of {SPLADE_ACTIVATIONS}")
        self.mlm = mlm
        self.config = mlm.config
        self.pooling, self.activation, self.max_active_dims = pooling, activation, max_active_dims
        self.log_scale = None  # what `SentenceEncoder.learn_scale` sets: the in-batch losses' scale stays fixed here
        if query_weights is not None and query_weights.shape != (self.config.vocab_size,):
            raise ValueError(f"query weights of shape {tuple(query_weights.shape)}; the vocabulary has "
                             f"{self.config.vocab_size} words")
        self.query_weights = None if query_weights is None else nn.Parameter(query_weights.float().clone())

    @property
    def inference_free(self) -> bool:
        """Whether queries are encoded by static per-word weights instead of the masked-LM model."""
        return self.query_weights is not None

    @property
    def dimension(self) -> int:
        """The vectors' length: the vocabulary size."""
        return self.config.vocab_size

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None, is_query: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids, attention_mask (and token_type_ids): long [B, T], right-padded -> float [B, V].

        is_query: bool [B], for an inference-free model: these rows are queries, weighted by the static query weights
        (their ids tokenised without special tokens, as SparseStaticEmbedding reads them); the others go through
        SPLADE. Without it (or for a plain SPLADE model) every row goes through SPLADE."""
        if not self.inference_free or is_query is None:
            out = self._splade(input_ids, attention_mask, token_type_ids)
        else:
            # The query part always runs (on no rows, if need be), so that the query weights take part in every
            # call: DDP and GradCache's replay expect the same parameters used whatever the batch holds.
            queries, documents = is_query.nonzero(as_tuple=True)[0], (~is_query).nonzero(as_tuple=True)[0]
            out = input_ids.new_zeros((input_ids.shape[0], self.dimension), dtype=torch.float32).index_put(
                (queries,), self.static(input_ids[queries], attention_mask[queries]))
            if len(documents):
                out = out.index_put((documents,), self._splade(
                    input_ids[documents], attention_mask[documents],
                    None if token_type_ids is None else token_type_ids[documents]).float())
        if self.max_active_dims is not None and not self.training:
            out = prune(out, self.max_active_dims)
        return out

    def static(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Inference-free query vectors: long [B, T] ids (no special tokens) -> float [B, V], each word present in the
        text weighted once by its query weight, whatever its count (SparseStaticEmbedding's presence times weight)."""
        real = attention_mask.bool()
        rows = torch.arange(input_ids.shape[0], device=input_ids.device)[:, None].expand_as(input_ids)
        presence = torch.zeros(input_ids.shape[0], self.dimension, device=input_ids.device)
        presence = presence.index_put((rows[real], input_ids[real]), torch.ones((), device=input_ids.device))
        return presence * self.query_weights

    def _splade(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None) -> torch.Tensor:
        """SPLADE vectors float [B, V] of right-padded long [B, T] inputs.

        The head runs on the real tokens alone ([N, V] logits, N the batch's real tokens): a padded [B, T, V] tensor
        would be 30,522 floats for every padding position too."""
        backbone = self.mlm.backbone
        hidden = backbone(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids).last_hidden_state  # [B, T, H]
        real = attention_mask.bool()
        logits = self.mlm.mlm(hidden[real], backbone.embeddings.word.decoder_weight()).float()  # [N, V], row-major
        weights = torch.log1p(torch.relu(logits))
        if self.activation == "log1p_relu":
            weights = torch.log1p(weights)
        # Each text's tokens are a contiguous run of the N rows; an empty text (no real token) pools to zeros.
        reduce = (lambda w: w.amax(0)) if self.pooling == "max" else (lambda w: w.sum(0))
        return torch.stack([reduce(w) if len(w) else weights.new_zeros(weights.shape[1])
                            for w in weights.split(real.sum(1).tolist())])

    # A training checkpoint holds the masked-LM model in the Hugging Face layout (`checkpoint.py`), and an
    # inference-free model's query weights as extra state.
    def checkpoint_parts(self) -> dict[str, nn.Module]:
        return {"": self.mlm}

    def extra_state(self) -> dict[str, torch.Tensor]:
        return {} if self.query_weights is None else {"query_weights": self.query_weights.detach()}

    def load_extra_state(self, tensors: dict[str, torch.Tensor]) -> None:
        if ("query_weights" in tensors) != self.inference_free:
            raise RuntimeError("the checkpoint was written " + ("with" if "query_weights" in tensors else "without")
                               + " inference-free query weights; this model " + ("has" if self.inference_free else
                                                                                  "has none"))
        if self.query_weights is not None:
            with torch.no_grad():
                self.query_weights.copy_(tensors["query_weights"])


def prune(vectors: torch.Tensor, k: int) -> torch.Tensor:
    """Keep each row's `k` largest weights, zero the rest (float [B, V] -> [B, V])."""
    if k >= vectors.shape[1]:
        return vectors
    values, indices = vectors.topk(k, dim=1)
    return torch.zeros_like(vectors).scatter(1, indices, values)
