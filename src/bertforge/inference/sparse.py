"""Sparse vectors from a SPLADE model: one weight per vocabulary word, kept as scipy CSR rows.

A SPLADE vector has the vocabulary's length (30,522 for BERT) but a few dozen to a few hundred
non-zero weights once trained; holding a corpus dense would cost 120 KB a text, so each batch is
turned into CSR rows (column = word id) as soon as it leaves the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..interop.sparse_dir import SparseSpec
from ..models.splade import SpladeEncoder
from ..tokenization.base import Tokenizer
from .loop import device_of, evaluating, run_sorted


def static_features(tokenizer: Tokenizer, texts: list[str | list[int]], max_length: int,
                    truncation_side: str = "right") -> list[dict]:
    """An inference-free model's query inputs: ids without special tokens (SparseStaticEmbedding's tokenisation), cut
    to `max_length`; a list of ids is used as given, cut the same way."""
    features: list = []
    for text in texts:
        if isinstance(text, str):
            ids = tokenizer(text, add_special_tokens=False, truncation=True, max_length=max_length,
                            truncation_side=truncation_side)["input_ids"]
        else:
            ids = [int(t) for t in text]
            ids = ids[-max_length:] if truncation_side == "left" else ids[:max_length]
        features.append({"input_ids": ids, "token_type_ids": [0] * len(ids)})
    return features


@torch.no_grad()
def sparse_embed(model: SpladeEncoder, tokenizer: Tokenizer, texts: list[str | list[int]], batch_size: int = 32,
                 max_length: int | None = None, prompt: str = "", lowercase: bool = False, progress: bool = False,
                 truncation_side: str = "right", query: bool = False):
    """Sparse vectors of `texts` (each with `prompt` before it; a list of token ids is used as given): scipy.sparse
    csr_matrix float32 [len(texts), V], in input order, exactly the weights `SparseEncoder.encode` gives (its
    max_active_dims pruning included). A long input is cut on `truncation_side`.

    query: for an inference-free model, encode the texts as its query route does (`tokenizer` is then the query
    tokenizer and `max_length` defaults to its model_max_length; `lowercase` belongs to the document Transformer and
    is not applied); a plain SPLADE model encodes queries and documents alike."""
    from scipy import sparse

    from .pipelines import _features

    evaluating(model)
    static = query and model.inference_free
    inputs = [prompt + t if isinstance(t, str) else t for t in texts]
    if static:
        features = static_features(tokenizer, inputs, max_length or tokenizer.model_max_length, truncation_side)
    else:
        if lowercase:
            tokenizer = tokenizer.lowercased()
        limit = min(max_length or tokenizer.model_max_length, model.config.max_sequence_length)
        features = _features(tokenizer, inputs, limit, truncation_side)

    def step(batch: dict, rows: list[int]) -> list:
        flags = torch.full((batch["input_ids"].shape[0],), static, dtype=torch.bool, device=batch["input_ids"].device)
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"], is_query=flags).float().cpu()
        return [sparse.csr_matrix(row.numpy()[None, :]) for row in out]

    rows = run_sorted(features, tokenizer.pad_token_id, batch_size, step, device=device_of(model), progress=progress)
    if not rows:
        return sparse.csr_matrix((0, model.dimension), dtype=np.float32)
    return sparse.vstack(rows, format="csr").astype(np.float32)


def sparse_items(vectors) -> list[list[dict]]:
    """Each row of a CSR matrix as TEI's /embed_sparse gives it: [{"index": word id, "value": weight}], by index."""
    out = []
    for n in range(vectors.shape[0]):
        row = vectors.getrow(n)
        order = np.argsort(row.indices, kind="stable")
        out.append([{"index": int(row.indices[i]), "value": float(row.data[i])} for i in order])
    return out


def readable(items: list[dict], tokenizer: Tokenizer) -> dict[str, float]:
    """One row of `sparse_items` as {token: weight}, heaviest first (what `predict embed` prints for a SPLADE model)."""
    heaviest = sorted(items, key=lambda item: -item["value"])
    words = tokenizer.convert_ids_to_tokens([item["index"] for item in heaviest])
    return {word: round(item["value"], 7) for word, item in zip(words, heaviest)}


@dataclass
class SparseModel:
    """A SparseEncoder directory ready to encode: the SPLADE module, the directory's settings, the encoder's
    tokenizer and the queries' (an inference-free model's own; else the encoder's)."""

    model: SpladeEncoder
    spec: SparseSpec
    tokenizer: Tokenizer
    query_tokenizer: Tokenizer

    @classmethod
    def load(cls, model_dir: str | Path) -> "SparseModel":
        from ..interop.sparse_dir import load_sparse
        from ..tokenization.kinds import load_tokenizer

        model, spec = load_sparse(model_dir)
        return cls.of(model.eval(), spec, load_tokenizer(spec.encoder))

    @classmethod
    def of(cls, model: SpladeEncoder, spec: SparseSpec, tokenizer: Tokenizer) -> "SparseModel":
        """With the encoder's `tokenizer`; the queries' is an inference-free directory's own, else the same."""
        from ..tokenization.kinds import load_tokenizer

        return cls(model, spec, tokenizer, load_tokenizer(spec.query_dir) if spec.query_dir is not None else tokenizer)

    def encode(self, texts: list[str | list[int]], query: bool | None = None, prompt: str | None = None,
               batch_size: int = 32, max_length: int | None = None, progress: bool = False,
               truncation_side: str = "right"):
        """CSR float32 [len(texts), V] as `SparseEncoder.encode` gives them: as queries, as documents, or (None) by
        the directory's default route. `prompt` None: the directory's default prompt. `max_length` None: the
        directory's max_seq_length (an inference-free model's queries: its query tokenizer's model_max_length)."""
        query = self.spec.default_side == "query" if query is None else query
        static = query and self.model.inference_free
        return sparse_embed(self.model, self.query_tokenizer if static else self.tokenizer, texts, batch_size,
                            max_length or (None if static else self.spec.max_length),
                            self.spec.prompt if prompt is None else prompt, self.spec.lowercase, progress,
                            truncation_side, query=query)
