"""Sparse vectors from a SPLADE model: one weight per vocabulary word, kept as scipy CSR rows.

A SPLADE vector has the vocabulary's length (30,522 for BERT) but a few dozen to a few hundred
non-zero weights once trained; holding a corpus dense would cost 120 KB a text, so each batch is
turned into CSR rows (column = word id) as soon as it leaves the model.
"""

from __future__ import annotations

import numpy as np
import torch

from ..models.splade import SpladeEncoder
from ..tokenization.tokenizer import Tokenizer
from .loop import device_of, run_sorted


@torch.no_grad()
def sparse_embed(model: SpladeEncoder, tokenizer: Tokenizer, texts: list[str | list[int]], batch_size: int = 32,
                 max_length: int | None = None, prompt: str = "", lowercase: bool = False, progress: bool = False,
                 truncation_side: str = "right"):
    """Sparse vectors of `texts` (each with `prompt` before it; a list of token ids is used as given): scipy.sparse
    csr_matrix float32 [len(texts), V], in input order, exactly the weights `SparseEncoder.encode` gives (its
    max_active_dims pruning included). A long input is cut on `truncation_side`."""
    from scipy import sparse

    from .pipelines import _features

    model.eval()
    if lowercase:
        tokenizer = tokenizer.lowercased()
    limit = min(max_length or tokenizer.model_max_length, model.config.max_sequence_length)
    features = _features(tokenizer, [prompt + t if isinstance(t, str) else t for t in texts], limit, truncation_side)

    def step(batch: dict, rows: list[int]) -> list:
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"]).float().cpu()
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
