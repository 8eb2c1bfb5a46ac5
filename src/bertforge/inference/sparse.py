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
def sparse_embed(model: SpladeEncoder, tokenizer: Tokenizer, texts: list[str], batch_size: int = 32,
                 max_length: int | None = None, prompt: str = "", lowercase: bool = False,
                 progress: bool = False):
    """Sparse vectors of `texts` (each with `prompt` before it): scipy.sparse.csr_matrix float32 [len(texts), V], in
    input order, exactly the weights `SparseEncoder.encode` gives (its max_active_dims pruning included)."""
    from scipy import sparse

    model.eval()
    if lowercase:
        tokenizer = tokenizer.lowercased()
    limit = min(max_length or tokenizer.model_max_length, model.config.max_sequence_length)
    enc = tokenizer([prompt + t for t in texts], truncation=True, max_length=limit, return_token_type_ids=True)
    features = [{"input_ids": i, "token_type_ids": t} for i, t in zip(enc["input_ids"], enc["token_type_ids"])]

    def step(batch: dict, rows: list[int]) -> list:
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"]).float().cpu()
        return [sparse.csr_matrix(row.numpy()[None, :]) for row in out]

    rows = run_sorted(features, tokenizer.pad_token_id, batch_size, step, device=device_of(model), progress=progress)
    if not rows:
        return sparse.csr_matrix((0, model.dimension), dtype=np.float32)
    return sparse.vstack(rows, format="csr").astype(np.float32)
