"""Sliding-window (local) self-attention that costs O(T * w), not O(T^2) masked.

A query at position i of a sequence sees the keys at positions j with |i - j| <= w (ModernBERT's
local layers, w = local_attention / 2). Masking a full [T, T] score matrix gives the same numbers
but spends T^2 work and memory on scores that are thrown away: at 8,192 tokens and w = 64 that is
64 times the work the window needs. Here the queries are cut into blocks of c = w consecutive
positions, and block b attends only to the keys [b*c - w, b*c + c + w): a [c, c + 2w] score matrix
per block, so the work and memory grow linearly with T. Inside a block, the band is the same
pattern for every block (query s sees key t when 0 <= t - s <= 2w); keys past a sequence's end, or
padding, are masked as well.

Shapes: B = sequences, T = their (padded) length, nh = heads, hd = head width.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..kernels.dropout import dropout


def windowed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                       real: torch.Tensor | None, dropout_p: float = 0.0, training: bool = False) -> torch.Tensor:
    """Local attention over rows of whole sequences.

    q, k, v: float [B, T, nh, hd]; window: w, the largest |i - j| a query sees; real: bool [B, T], True at
    real tokens (None: all are). Returns the context float [B, T, nh, hd]; a padding query's row is
    finite and meaningless (the caller drops it).
    """
    B, T, nh, hd = q.shape
    c = max(window, 1)  # queries per block
    blocks = -(-T // c)
    span = c + 2 * window  # the keys one block can see
    Tq = blocks * c
    # Queries: pad to whole blocks, then [B, blocks, c, nh, hd] -> [B*blocks, nh, c, hd].
    qb = F.pad(q, (0, 0, 0, 0, 0, Tq - T)).view(B, blocks, c, nh, hd).permute(0, 1, 3, 2, 4).reshape(-1, nh, c, hd)

    def windows(t: torch.Tensor) -> torch.Tensor:
        """[B, T, nh, hd] -> the keys (or values) each block sees, [B*blocks, nh, span, hd]."""
        padded = F.pad(t, (0, 0, 0, 0, window, Tq - T + window))  # w before, the block remainder + w after
        return padded.unfold(1, span, c).permute(0, 1, 2, 4, 3).reshape(-1, nh, span, hd)

    kb, vb = windows(k), windows(v)
    valid = torch.ones(B, T, dtype=torch.bool, device=q.device) if real is None else real
    key_valid = F.pad(valid, (window, Tq - T + window)).unfold(1, span, c)  # (B, blocks, span)
    s = torch.arange(c, device=q.device)
    offset = torch.arange(span, device=q.device)[None, :] - s[:, None]
    band = (offset >= 0) & (offset <= 2 * window)  # (c, span), the same for every block
    mask = band & key_valid[:, :, None, :]  # (B, blocks, c, span)
    # A padding query (or one past the end) may see no real key at all: let it see its whole span, so
    # its softmax stays finite instead of NaN (which would reach the gradients through 0 * NaN).
    query_pad = ~F.pad(valid, (0, Tq - T)).view(B, blocks, c, 1)
    mask = (mask | query_pad).reshape(-1, 1, c, span)
    if dropout_p > 0.0 and training and q.device.type == "cpu" and not torch.compiler.is_compiling():
        # As `scaled_attention` (where the fused kernel does not apply): eager CPU training takes the explicit
        # path and bertforge's hashed dropout.
        scores = (qb @ kb.transpose(-2, -1)) / math.sqrt(hd)
        probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        context = dropout(probs, dropout_p, training) @ vb
    else:
        context = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask,
                                                 dropout_p=dropout_p if training else 0.0)
    # [B*blocks, nh, c, hd] -> [B, T, nh, hd]
    return context.view(B, blocks, nh, c, hd).permute(0, 1, 3, 2, 4).reshape(B, Tq, nh, hd)[:, :T]


def band_mask(T: int, window: int, device: torch.device) -> torch.Tensor:
    """bool [T, T]: query i may see key j when |i - j| <= window (the explicit path's, for attention maps)."""
    i = torch.arange(T, device=device)
    return (i[:, None] - i[None, :]).abs() <= window
