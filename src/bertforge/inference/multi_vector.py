"""Token vectors from a ColBERT model: each text becomes a [n, D] matrix, as PyLate's `ColBERT.encode` gives it.

A query is cut to query_length - 1 tokens, its prefix token is inserted after [CLS], and with query
expansion it is padded to query_length with [MASK] tokens whose vectors are kept (the encoder does
not attend to them unless attend_to_expansion_tokens). A document is cut to document_length - 1,
gets its prefix the same way, and loses the vectors of its skiplist tokens (punctuation).
"""

from __future__ import annotations

import numpy as np
import torch

from ..interop.colbert_dir import ColbertSpec, check_expansion, prefix_ids, skiplist_ids
from ..models.colbert import ColbertEncoder
from ..tokenization.base import Tokenizer
from .loop import device_of, evaluating, run_sorted


def colbert_features(tokenizer: Tokenizer, spec: ColbertSpec, texts: list[str], is_query: bool) -> list[dict]:
    """Model inputs of `texts` as queries or documents: input_ids and token_type_ids (lists) with the prefix inserted
    and, for expanded queries, the [MASK] padding; `real` counts the tokens the encoder attends to."""
    prefix = prefix_ids(spec, tokenizer)[0 if is_query else 1]
    length = spec.query_length if is_query else spec.document_length
    budget = length - 1 if prefix is not None else length
    if spec.lowercase:
        tokenizer = tokenizer.lowercased()
    enc = tokenizer(texts, truncation=True, max_length=budget, return_token_type_ids=True)
    expand = is_query and spec.do_query_expansion
    features = []
    for ids, types in zip(enc["input_ids"], enc["token_type_ids"]):
        ids, types = list(ids), list(types)
        if prefix is not None:
            ids, types = ids[:1] + [prefix] + ids[1:], types[:1] + [0] + types[1:]
        real = len(ids)
        if expand:
            ids += [tokenizer.mask_token_id] * (length - len(ids))
            types += [0] * (length - len(types))
            if spec.attend_to_expansion_tokens:
                real = len(ids)
        features.append({"input_ids": ids, "token_type_ids": types, "real": real})
    return features


def kept_positions(batch: dict, real: torch.Tensor, spec: ColbertSpec, is_query: bool, skiplist: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(attention_mask long [B, T], kept bool [B, T]) of a collated batch whose rows attend to their first `real`
    tokens (long [B]): an expanded query keeps every position; a document drops padding and skiplist tokens."""
    ids = batch["input_ids"]
    attention = (torch.arange(ids.shape[1], device=ids.device)[None, :] < real[:, None]).long()
    if is_query:
        kept = torch.ones_like(ids, dtype=torch.bool) if spec.do_query_expansion else attention.bool()
    else:
        kept = attention.bool() & ~torch.isin(ids, skiplist)
    return attention, kept


@torch.no_grad()
def multi_vector_embed(model: ColbertEncoder, tokenizer: Tokenizer, spec: ColbertSpec, texts: list[str],
                       is_query: bool, batch_size: int = 32, progress: bool = False) -> list[np.ndarray]:
    """Each text's kept token vectors: float32 [n_i, D] arrays, in input order."""
    evaluating(model)
    if is_query:
        check_expansion(model.backbone, spec, "the ColBERT settings")
    features = colbert_features(tokenizer, spec, texts, is_query)
    skiplist = torch.tensor(skiplist_ids(spec, tokenizer), dtype=torch.long, device=device_of(model))
    real_of = torch.tensor([f["real"] for f in features], dtype=torch.long)
    masked = is_query and spec.do_query_expansion and not spec.attend_to_expansion_tokens

    def step(batch: dict, rows: list[int]) -> list:
        attention, kept = kept_positions(batch, real_of[rows].to(batch["input_ids"].device), spec, is_query, skiplist)
        out = model(batch["input_ids"], attention, batch["token_type_ids"], keep_masked=masked).float().cpu()
        kept = kept.cpu()
        return [out[b][kept[b]].numpy() for b in range(len(rows))]

    pad = tokenizer.mask_token_id if tokenizer.mask_token_id is not None else tokenizer.pad_token_id
    return run_sorted(features, pad, batch_size, step, device=device_of(model), progress=progress)
