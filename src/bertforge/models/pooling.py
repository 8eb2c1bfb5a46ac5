"""Pooling token vectors into one sentence vector, and comparing sentence vectors.

sentence-transformers' pooling modes and similarity functions, as plain tensor functions: the
sentence-transformers directory reader (`interop/sentence_dir.py`), inference and the retrieval
encoder (`models/sentence_encoder.py`) all call these, so a vector is pooled one way everywhere.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# sentence-transformers' pooling modes, in the order its legacy `pooling_mode_*` flags concatenate them.
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
SIMILARITIES = ("cosine", "dot", "euclidean", "manhattan")


def pool(hidden: torch.Tensor, mask: torch.Tensor, modes: tuple[str, ...]) -> torch.Tensor:
    """Token vectors float [B, T, H] and attention mask [B, T] (1 = real token, right-padded)
    -> float [B, len(modes) * H]: each mode's sentence vector, concatenated in the given order.

    cls: the first token; max: the largest value of each dimension over real tokens; mean: their
    average; mean_sqrt_len_tokens: their sum over sqrt(count); weightedmean: the average weighted
    by position 1..T; lasttoken: the last real token.
    """
    m = mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
    count = m.sum(1).clamp(min=1e-9)  # (B, 1)
    out = []
    for mode in modes:
        if mode == "cls":
            out.append(hidden[:, 0])
        elif mode == "max":
            out.append(hidden.masked_fill(m == 0, float("-inf")).max(1).values)
        elif mode == "mean":
            out.append((hidden * m).sum(1) / count)
        elif mode == "mean_sqrt_len_tokens":
            out.append((hidden * m).sum(1) / count.sqrt())
        elif mode == "weightedmean":
            w = m * torch.arange(1, hidden.shape[1] + 1, dtype=hidden.dtype, device=hidden.device).view(1, -1, 1)
            out.append((hidden * w).sum(1) / w.sum(1).clamp(min=1e-9))
        elif mode == "lasttoken":
            last = (mask.sum(1).long() - 1).clamp(min=0)  # (B,) right padding: the last real token
            out.append(hidden[torch.arange(hidden.shape[0], device=hidden.device), last])
        elif mode == "pooler":
            raise ValueError("the pooler is not a token pooling mode; use the backbone's pooler_output")
        else:
            raise ValueError(f"unknown pooling mode {mode!r}")
    return torch.cat(out, dim=-1)


def similarity(a: torch.Tensor, b: torch.Tensor, kind: str = "cosine") -> torch.Tensor:
    """Scores float [N, M] between rows of a [N, D] and b [M, D], as sentence-transformers' similarity
    functions: cosine, dot product, or the negative euclidean / manhattan distance (higher is closer)."""
    if kind == "cosine":
        return F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T
    if kind == "dot":
        return a @ b.T
    if kind == "euclidean":
        return -torch.cdist(a, b, p=2)
    if kind == "manhattan":
        return -torch.cdist(a, b, p=1)
    raise ValueError(f"unknown similarity {kind!r}")
