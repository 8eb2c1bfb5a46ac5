"""ColBERT: late interaction over one small vector per token (Khattab and Zaharia, 2020).

Every token of a text keeps a vector: the encoder's last hidden state projected by a linear layer
(no bias, 128 dimensions by default) and L2-normalised. A query scores a document by MaxSim: for
each query vector, its best dot product with any of the document's vectors, summed over the
query's vectors. Queries are padded with [MASK] tokens to a fixed length ("query augmentation"):
those positions are not attended to by default, but their vectors are kept and take part in
MaxSim, a soft expansion of the query. This is PyLate's `ColBERT` stack (a Transformer, then a
Dense projection) as one trainable module; which tokens a text keeps, and the files, live in
`interop/colbert_dir.py`.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn


class ColbertEncoder(nn.Module):
    """Texts' token ids -> one L2-normalised vector per token.

    backbone: a family's bare encoder (`BertModel`, `ModernBertModel`, ...).
    projection: linear layers (nn.Sequential of nn.Linear) from the hidden size to the vectors' size (`--dim`,
    128 by default): PyLate's Dense modules, usually one.
    """

    def __init__(self, backbone: nn.Module, projection: nn.Sequential) -> None:
        super().__init__()
        self.backbone = backbone
        if getattr(backbone, "pooler", None) is not None:
            backbone.pooler.requires_grad_(False)  # unused by token vectors (see SentenceEncoder)
        self.config = backbone.config
        self.projection = projection
        self.log_scale = None  # the in-batch loss's scale is fixed (1 / temperature): nothing learned here

    @property
    def dimension(self) -> int:
        """The length of each token's vector."""
        return self.projection[-1].out_features

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None, keep_masked: bool = False,
                documents: dict[str, torch.Tensor] | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """input_ids, attention_mask (and token_type_ids): long [B, T], right-padded -> float [B, T, D], every
        position's normalised vector (the caller keeps the positions it needs).

        keep_masked: positions the mask hides are read (a query's unattended [MASK] expansion): they get the vectors
        transformers computes for them (attention masks keys, not queries), so the batch takes the padded path
        rather than the unpadded one, which leaves zeros there.
        documents: a second batch (its input_ids, attention_mask, token_type_ids) encoded in the same call, as
        documents; then (queries' vectors, documents' vectors). One call, so that a torchrun step has one forward."""
        vectors = self._encode(input_ids, attention_mask, token_type_ids, keep_masked)
        if documents is None:
            return vectors
        return vectors, self._encode(documents["input_ids"], documents["attention_mask"],
                                     documents.get("token_type_ids"), False)

    def _encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None,
                keep_masked: bool) -> torch.Tensor:
        with _computing_masked_positions(self.backbone, keep_masked):
            hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                                   token_type_ids=token_type_ids).last_hidden_state  # [B, T, H]
        return F.normalize(self.projection(hidden.float()), p=2, dim=-1)

    # A training checkpoint holds the backbone as a Hugging Face model and the projection as extra state.
    def checkpoint_parts(self) -> dict[str, nn.Module]:
        return {"": self.backbone}

    def extra_state(self) -> dict[str, torch.Tensor]:
        return {f"projection.{k}": v for k, v in self.projection.state_dict().items()}

    def load_extra_state(self, tensors: dict[str, torch.Tensor]) -> None:
        self.projection.load_state_dict({k[len("projection."):]: v for k, v in tensors.items()
                                         if k.startswith("projection.")}, strict=True)


@contextmanager
def _computing_masked_positions(backbone: nn.Module, wanted: bool) -> Iterator[None]:
    """When `wanted`, run `backbone` on the padded path: its unpadded path leaves zeros at masked positions, which
    ColBERT's unattended query expansion reads."""
    before = getattr(backbone, "unpad", None) if wanted else None
    if before is not None:
        backbone.unpad = False
    try:
        yield
    finally:
        if before is not None:
            backbone.unpad = before


def maxsim(queries: torch.Tensor, query_mask: torch.Tensor, documents: torch.Tensor,
           document_mask: torch.Tensor, dropped_as_zero: bool = False) -> torch.Tensor:
    """Late-interaction scores of every query against every document.

    queries: float [Q, Tq, D], query_mask: bool [Q, Tq] (the vectors that count);
    documents: float [N, Td, D], document_mask: bool [N, Td] -> float [Q, N]:
    sum over a query's kept vectors of the largest dot product with any kept document vector
    (a document with no kept vector scores 0).

    dropped_as_zero: PyLate's training scores, which multiply the dropped positions' similarities by 0 (so they
    compete as 0 in the max); otherwise MaxSim over the kept vectors alone, as search computes it."""
    sims = torch.einsum("qsd,ntd->qnst", queries, documents)  # [Q, N, Tq, Td]
    if dropped_as_zero:
        best = (sims * document_mask[None, :, None, :].to(sims.dtype)).amax(-1)
    else:
        sims = sims.masked_fill(~document_mask[None, :, None, :], float("-inf"))
        best = sims.amax(-1)  # [Q, N, Tq]
        best = torch.where(torch.isfinite(best), best, torch.zeros_like(best))
    return (best * query_mask[:, None, :].to(best.dtype)).sum(-1)
