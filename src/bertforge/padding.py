"""Unpadding: run a padded batch as one packed sequence of its real tokens.

A batch [B, T] with padding holds N < B*T real tokens. Every Linear, LayerNorm and GELU
acts on each token alone, so it can run on the [N, H] matrix of real tokens and skip the
padding's wasted FLOPs. Only attention needs the sequence structure; `cu_seqlens` (the
cumulative lengths, as flash-attention's varlen kernels take them) and `indices` (where
each real token sits in the flattened [B*T] batch) carry it. These helpers are kept apart
from the model's maths, as in MosaicBERT's `bert_padding.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Packing:
    """Where the N real tokens of a [B, T] batch are.

    indices:    long [N], positions in the flattened batch, row-major
    cu_seqlens: int32 [B + 1], cumulative sequence lengths (row b is packed[cu[b]:cu[b+1]])
    batch, seq_len: B and T of the padded batch
    """

    indices: torch.Tensor
    cu_seqlens: torch.Tensor
    batch: int
    seq_len: int

    @property
    def first_tokens(self) -> torch.Tensor:
        """Packed index of each row's first token ([CLS]): long [B]."""
        return self.cu_seqlens[:-1].long()


def packing(attention_mask: torch.Tensor) -> Packing:
    """attention_mask: [B, T] with 1 for real tokens. Rows must be left-aligned (padding at the end)."""
    B, T = attention_mask.shape
    mask = attention_mask.bool()
    lengths = mask.sum(1, dtype=torch.int32)
    cu = torch.zeros(B + 1, dtype=torch.int32, device=attention_mask.device)
    cu[1:] = torch.cumsum(lengths, 0)
    return Packing(mask.flatten().nonzero().squeeze(1), cu, B, T)


def unpad(x: torch.Tensor, p: Packing) -> torch.Tensor:
    """[B, T, ...] -> [N, ...]: keep the real tokens only."""
    return x.flatten(0, 1).index_select(0, p.indices)


def pad(x: torch.Tensor, p: Packing) -> torch.Tensor:
    """[N, ...] -> [B, T, ...] with zeros at the padding positions."""
    out = x.new_zeros((p.batch * p.seq_len, *x.shape[1:]))
    out.index_copy_(0, p.indices, x)
    return out.view(p.batch, p.seq_len, *x.shape[1:])
