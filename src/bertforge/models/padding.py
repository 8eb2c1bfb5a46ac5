"""Unpadding and packing: run a batch as one long list of its real tokens.

A batch [B, T] with padding holds N < B*T real tokens. Every Linear, LayerNorm and GELU
acts on each token alone, so it can run on the [N, H] matrix of real tokens and skip the
padding's wasted FLOPs. Only attention needs the sequence structure; `cu_seqlens` (the
cumulative lengths, as flash-attention's varlen kernels take them) and the index tensors
below carry it. These helpers are kept apart from the model's maths, as in MosaicBERT's
`bert_padding.py`.

A *packed* row holds several examples back to back, each starting at position id 0 (the
convention of transformers' `DataCollatorWithFlattening`). Here a "sequence" is one example,
not one row: attention scatters each example into its own row of an [S, max_seqlen] layout,
so examples sharing a row never see each other - the block-diagonal attention packing needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Packing:
    """Where the N real tokens of a [B, T] batch are, and which of the S sequences each belongs to.

    indices:     long [N], positions in the flattened [B*T] batch, row-major
    cu_seqlens:  int32 [S + 1], cumulative sequence lengths (sequence s is tokens cu[s]:cu[s+1])
    seq_indices: long [N], positions in the flattened [S*max_seqlen] attention layout
    key_mask:    bool [S, 1, 1, max_seqlen], True at real keys; None when all S have max_seqlen
    batch, seq_len, max_seqlen: B and T of the padded batch; the longest sequence
    """

    indices: torch.Tensor
    cu_seqlens: torch.Tensor
    seq_indices: torch.Tensor
    key_mask: torch.Tensor | None
    batch: int
    seq_len: int
    max_seqlen: int

    @property
    def num_seqs(self) -> int:
        return self.cu_seqlens.numel() - 1

    @property
    def first_tokens(self) -> torch.Tensor:
        """Index among the N real tokens of each sequence's first token ([CLS]): long [S]."""
        return self.cu_seqlens[:-1].long()


def bucket_rows(n: int) -> int:
    """n rounded up to one of 16 steps per octave (never more than 6.25% above n; steps of at least 8).

    oneDNN builds (JIT-compiles) a new bf16 matmul primitive for every shape it has not seen, about 1-20 ms
    each on a 2-core Xeon, far more than a bf16 matmul of a few thousand tokens takes. Unpadded batches
    have a new token count almost every time; rounded to these buckets they repeat after a few batches.
    """
    step = 1 << max(3, n.bit_length() - 5)
    return -(-n // step) * step


def pad_rows(x: torch.Tensor, rows: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [N, C] in the first N rows of a new [rows, C] tensor (of `dtype`, cast in the same pass),
    zeros below: how a matmul is handed a bucketed row count."""
    out = x.new_empty(rows, x.shape[1], dtype=dtype or x.dtype)
    out[:x.shape[0]].copy_(x)
    out[x.shape[0]:].zero_()
    return out


def example_starts(position_ids: torch.Tensor, real: torch.Tensor) -> torch.Tensor | None:
    """bool [B, T]: where each example begins, when some row holds several (position id 0
    after the first column); None when every row is one example.

    position_ids: long [B, T]; real: bool [B, T], True at real tokens.
    """
    restarts = (position_ids[:, 1:] == 0) & real[:, 1:]
    if not bool(restarts.any()):
        return None
    return torch.cat([real[:, :1], restarts], dim=1)


def packing(attention_mask: torch.Tensor, starts: torch.Tensor | None = None) -> Packing:
    """attention_mask: [B, T] with 1 for real tokens, padding at the end of each row;
    starts: bool [B, T] from `example_starts` when rows are packed, else each row is one sequence.
    """
    B, T = attention_mask.shape
    real = attention_mask.bool()
    indices = real.flatten().nonzero().squeeze(1)
    if starts is None:  # one sequence per non-empty row
        lengths = real.sum(1)
        lengths = lengths[lengths > 0]
        seq_of_token = torch.repeat_interleave(torch.arange(lengths.numel(), device=real.device), lengths)  # (N,)
    else:  # a new sequence at every example start
        seq_of_token = torch.cumsum(starts.flatten()[indices].long(), 0) - 1  # (N,)
        lengths = torch.bincount(seq_of_token)
    cu = torch.zeros(lengths.numel() + 1, dtype=torch.int32, device=attention_mask.device)
    cu[1:] = torch.cumsum(lengths, 0)
    max_seqlen = int(lengths.max())
    # Token j of sequence s sits at s * max_seqlen + (j - cu[s]) in the attention layout.
    offsets = torch.arange(indices.numel(), device=cu.device) - cu[:-1].long()[seq_of_token]
    key_mask = None
    if bool((lengths != max_seqlen).any()):
        key_mask = (torch.arange(max_seqlen, device=cu.device) < lengths[:, None])[:, None, None, :]
    return Packing(indices, cu, seq_of_token * max_seqlen + offsets, key_mask, B, T, max_seqlen)


def block_diagonal_mask(starts: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """bool [B, 1, T, T] for the padded path over packed rows: a query sees the keys of its own
    example only. Padding queries see every real key of their row, so no softmax row is empty.
    """
    example = torch.cumsum(starts.long(), dim=1)  # (B, T): which example of its row each token is
    same = (example[:, :, None] == example[:, None, :]) & real[:, :, None]
    allowed = (same | ~real[:, :, None]) & real[:, None, :]
    return allowed[:, None]


def unpad(x: torch.Tensor, p: Packing) -> torch.Tensor:
    """[B, T, ...] -> [N, ...]: keep the real tokens only."""
    return x.flatten(0, 1).index_select(0, p.indices)


def pad(x: torch.Tensor, p: Packing) -> torch.Tensor:
    """[N, ...] -> [B, T, ...] with zeros at the padding positions."""
    out = x.new_zeros((p.batch * p.seq_len, *x.shape[1:]))
    out.index_copy_(0, p.indices, x)
    return out.view(p.batch, p.seq_len, *x.shape[1:])


def varlen(tensors: tuple[torch.Tensor, ...], p: Packing | None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Tensors of the real tokens as the varlen attention kernels take them: float [N, H] each, and
    cu_seqlens [S + 1]. Unpadded inputs ([N, H], with `p`) pass as they are; without `p` every row
    is full, so [B, T, H] becomes B sequences of T tokens."""
    if p is not None:
        return list(tensors), p.cu_seqlens
    B, T, H = tensors[0].shape
    return [t.reshape(B * T, H) for t in tensors], torch.arange(0, (B + 1) * T, T, device=tensors[0].device)


def to_sequences(x: torch.Tensor, p: Packing) -> torch.Tensor:
    """[N, ...] -> [S, max_seqlen, ...]: one row per sequence, zeros after its end."""
    out = x.new_zeros((p.num_seqs * p.max_seqlen, *x.shape[1:]))
    out.index_copy_(0, p.seq_indices, x)
    return out.view(p.num_seqs, p.max_seqlen, *x.shape[1:])


def from_sequences(x: torch.Tensor, p: Packing) -> torch.Tensor:
    """[S, max_seqlen, ...] -> [N, ...]: the inverse of `to_sequences`."""
    return x.flatten(0, 1).index_select(0, p.seq_indices)


def refuse_left_padding(attention_mask: torch.Tensor | None, family: str) -> None:
    """Refuse a batch with a row whose first position is padding, for a family whose transformers class computes its
    padding positions in a way bertforge does not reproduce (DeBERTa-v2 zeroes and masks them, ModernBERT drops them),
    when a head is about to read that first position: its answer would not be transformers'."""
    if attention_mask is not None and not bool(attention_mask[:, 0].all()):
        row = int((attention_mask[:, 0] == 0).nonzero()[0, 0])
        from ..errors import InputError

        raise InputError(f"row {row} begins with padding (left padding): {family}'s first-token head would read a "
                         "padding position there, whose value bertforge does not compute as transformers does; pad on "
                         "the right (tokenizer.padding_side = 'right')")

