"""SPLADE: a masked-LM model read as a sparse bag of weighted vocabulary words (Formal et al., 2021).

Each token's masked-LM logits say which vocabulary words it evokes; SPLADE keeps, for every word, the
largest (or the summed) log(1 + relu(logit)) over the text's real tokens: one weight per vocabulary
word, almost all of them zero once trained with a sparsity regulariser. Relevance is the dot product
of two such vectors, which an inverted index computes exactly. This is sentence-transformers'
SparseEncoder stack (a fill-mask Transformer, then SpladePooling) as one trainable module; the files
live in `interop/sparse_dir.py`.
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
    """

    def __init__(self, mlm: nn.Module, pooling: str = "max", activation: str = "relu",
                 max_active_dims: int | None = None) -> None:
        super().__init__()
        if pooling not in SPLADE_POOLING or activation not in SPLADE_ACTIVATIONS:
            raise ValueError(f"SPLADE pooling {pooling!r} / activation {activation!r}: use one of {SPLADE_POOLING} "
                             f"and one of {SPLADE_ACTIVATIONS}")
        self.mlm = mlm
        self.config = mlm.config
        self.pooling, self.activation, self.max_active_dims = pooling, activation, max_active_dims
        self.log_scale = None  # what `SentenceEncoder.learn_scale` sets: the in-batch losses' scale stays fixed here

    @property
    def dimension(self) -> int:
        """The vectors' length: the vocabulary size."""
        return self.config.vocab_size

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids, attention_mask (and token_type_ids): long [B, T], right-padded -> float [B, V].

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
        out = torch.stack([reduce(w) if len(w) else weights.new_zeros(weights.shape[1])
                           for w in weights.split(real.sum(1).tolist())])
        if self.max_active_dims is not None and not self.training:
            out = prune(out, self.max_active_dims)
        return out

    # A training checkpoint holds the masked-LM model in the Hugging Face layout (`checkpoint.py`).
    def checkpoint_parts(self) -> dict[str, nn.Module]:
        return {"": self.mlm}


def prune(vectors: torch.Tensor, k: int) -> torch.Tensor:
    """Keep each row's `k` largest weights, zero the rest (float [B, V] -> [B, V])."""
    if k >= vectors.shape[1]:
        return vectors
    values, indices = vectors.topk(k, dim=1)
    return torch.zeros_like(vectors).scatter(1, indices, values)
