"""Feature dicts -> model batches: padded to the longest row, or packed several to a row.

A feature is a dict with `input_ids` and `token_type_ids` (int sequences of one length)
and optional labels: a per-token sequence (NER tags, MLM targets; -100 where no loss) or
a per-example scalar (class, score, NSP). Padding and packing both keep every example's
tokens and labels; only the layout differs, so a packed batch gives the same loss.

Packing puts several examples in one row of at most `capacity` tokens, chosen first-fit
by decreasing length. Each example's position ids restart at 0, which is how the model
knows where it starts; attention never crosses examples (see `padding.py`). Per-example
labels are ordered row by row, left to right: the order of the model's pooled outputs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..constants import IGNORE_INDEX
from ..errors import InputError

LABEL_KEYS = ("labels", "next_sentence_label", "sentence_order_label", "start_positions", "end_positions")


def pack_bins(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """First-fit decreasing: indices grouped so each group's lengths sum to <= capacity.

    Deterministic (ties keep input order); each group lists its indices in input order.
    """
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        n = lengths[i]
        if n > capacity:
            raise InputError(f"an example of {n} tokens does not fit a packed row of {capacity}")
        for b, free in enumerate(room):
            if free >= n:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(capacity - n)
    return [sorted(b) for b in bins]


def _labels(features: list[dict], rows: list[list[tuple[int, int]]], B: int, T: int) -> dict[str, torch.Tensor]:
    """Per-token labels laid out like the tokens; per-example labels in row-major example order.

    rows[r] lists (feature index, start column) of the examples in row r.
    """
    out = {}
    for key in LABEL_KEYS:
        if key not in features[0] or features[0][key] is None:
            continue
        if np.ndim(features[0][key]) == 1:  # one label per token
            grid = np.full((B, T), IGNORE_INDEX, dtype=np.int64)
            for r, row in enumerate(rows):
                for i, start in row:
                    v = features[i][key]
                    grid[r, start:start + len(v)] = v
            out[key] = torch.from_numpy(grid)
        else:
            values = [features[i][key] for row in rows for i, _ in row]
            out[key] = torch.tensor(values, dtype=torch.float32 if isinstance(values[0], float) else torch.long)
    return out


def collate(features: list[dict], pad_id: int, pack_to: int | None = None) -> dict[str, torch.Tensor]:
    """Batch `features`: one per row padded to the longest, or packed into rows of <= `pack_to` tokens.

    Returns input_ids, token_type_ids, attention_mask: long [R, T] (R = B unpacked) and the
    labels present; packed batches add position_ids long [R, T], restarting at each example.
    """
    lengths = [len(f["input_ids"]) for f in features]
    if pack_to is None:
        groups = [[i] for i in range(len(features))]
    else:
        if "start_positions" in features[0]:
            raise InputError("packing is not supported for question answering: its windows already fill --seq-len")
        groups = pack_bins(lengths, pack_to)
    B = len(groups)
    T = max(sum(lengths[i] for i in g) for g in groups)
    ids = np.full((B, T), pad_id, dtype=np.int64)
    types = np.zeros((B, T), dtype=np.int64)
    mask = np.zeros((B, T), dtype=np.int64)
    positions = np.zeros((B, T), dtype=np.int64)
    rows: list[list[tuple[int, int]]] = []
    for r, group in enumerate(groups):
        start, row = 0, []
        for i in group:
            f, n = features[i], lengths[i]
            ids[r, start:start + n] = f["input_ids"]
            types[r, start:start + n] = f["token_type_ids"] if "token_type_ids" in f else 0
            positions[r, start:start + n] = np.arange(n)
            mask[r, start:start + n] = 1
            row.append((i, start))
            start += n
        rows.append(row)
    batch = {"input_ids": torch.from_numpy(ids), "token_type_ids": torch.from_numpy(types),
             "attention_mask": torch.from_numpy(mask)}
    if pack_to is not None:
        batch["position_ids"] = torch.from_numpy(positions)
    batch.update(_labels(features, rows, B, T))
    return batch
