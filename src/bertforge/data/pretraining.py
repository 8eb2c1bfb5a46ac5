"""Pretraining examples: sentence pairs for MLM + NSP, packed blocks for MLM-only, and dynamic masking.

Pairs follow google-research/bert `create_pretraining_data.py`:
- per document, a target length of max_seq_len - 3, or with probability short_seq_prob
  a random shorter one (chosen once per document, as there);
- sentences are accumulated into a chunk until it reaches the target; the chunk is split at
  a random sentence boundary into segment A;
- with probability 0.5 (always when the chunk is one sentence) segment B is taken from a
  random other document, starting at a random sentence, and the chunk's unused sentences
  are put back; otherwise B is the rest of the chunk (is_next);
- `truncate_seq_pair` trims the longer side, from the front or the back at random.

The builder works on sentence lengths only and records, per instance, which sentences make
A and B and how many tokens to trim from each end, so an epoch's instances are a small int
array and the tokens are read from the memory-mapped shards when a batch needs them.

`--objective mlm` is RoBERTa's FULL-SENTENCES: the corpus as one stream, documents joined
by [SEP], cut into blocks of max_seq_len - 2 tokens ([CLS] block [SEP]), without NSP.

Masking happens in the collator, freshly for every batch (RoBERTa's dynamic masking), from
a random generator keyed by (seed, epoch, micro-batch index): the same batch gets the same
masks in a resumed run, and a different epoch gets different ones.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch

from ..constants import IGNORE_INDEX
from ..settings import MaskingSettings as MaskingConfig  # noqa: F401  (the collator reads these settings)
from ..tokenization.base import Tokenizer
from .batching import collate
from .shards import TokenShards

# Columns of an NSP instance row.
A_START, A_END, B_START, B_END, A_FRONT, A_BACK, B_FRONT, B_BACK, IS_RANDOM = range(9)


def truncate_pair_lengths(len_a: int, len_b: int, max_tokens: int, rng: random.Random) -> tuple[int, int, int, int]:
    """google-research/bert's truncate_seq_pair on lengths: tokens to cut from (A front, A back, B front, B back).

    Repeatedly remove one token from the longer segment (B on a tie), from its front or its
    back with equal probability, until the pair fits.
    """
    cuts = [0, 0, 0, 0]
    while len_a + len_b > max_tokens:
        if len_a > len_b:
            len_a -= 1
            cuts[0 if rng.random() < 0.5 else 1] += 1
        else:
            len_b -= 1
            cuts[2 if rng.random() < 0.5 else 3] += 1
    return cuts[0], cuts[1], cuts[2], cuts[3]


def build_nsp_instances(sentence_lengths: np.ndarray, doc_bounds: np.ndarray, docs: np.ndarray, max_seq_len: int,
                        short_seq_prob: float, rng: random.Random, sentence_order: bool = False) -> np.ndarray:
    """Sentence-pair instances for the documents `docs` (int64 [N, 9], columns A_START..IS_RANDOM).

    sentence_lengths: int64 [num_sentences]; doc_bounds: int64 [num_documents + 1], the global
    sentence range of document d is doc_bounds[d]:doc_bounds[d + 1]. Random B segments come
    from other documents of `docs`.

    sentence_order: ALBERT's sentence-order pairs (google-research/albert's create_pretraining_data.py)
    instead of next-sentence ones: B is always the rest of the chunk, and with probability 0.5 the two
    are swapped (label 1: A is stored as the later span). As there, a chunk of one sentence still
    takes a random B from another document, labelled 1.
    """
    max_tokens = max_seq_len - 3  # [CLS] A [SEP] B [SEP]
    lengths = sentence_lengths.tolist()
    bounds = doc_bounds.tolist()
    doc_list = docs.tolist()
    rows: list[tuple[int, ...]] = []
    for position, doc in enumerate(doc_list):
        first, last = bounds[doc], bounds[doc + 1]
        target = max_tokens
        if rng.random() < short_seq_prob:
            target = rng.randint(2, max_tokens)
        chunk_start = first  # the chunk is sentences [chunk_start, i]
        chunk_len = 0
        i = first
        while i < last:
            chunk_len += lengths[i]
            if i == last - 1 or chunk_len >= target:
                n = i - chunk_start + 1
                a_end = chunk_start + (rng.randint(1, n - 1) if n >= 2 else 1)
                len_a = sum(lengths[chunk_start:a_end])
                if n == 1 or (not sentence_order and rng.random() < 0.5):
                    is_random = 1
                    target_b = target - len_a
                    other = doc
                    for _ in range(10):  # google's script tries 10 times to find another document
                        other = doc_list[rng.randint(0, len(doc_list) - 1)]
                        if other != doc:
                            break
                    o_first, o_last = bounds[other], bounds[other + 1]
                    b_start = o_first + rng.randint(0, o_last - o_first - 1)
                    b_end, len_b = b_start, 0
                    while b_end < o_last:
                        len_b += lengths[b_end]
                        b_end += 1
                        if len_b >= target_b:
                            break
                    i = a_end - 1  # put the chunk's unused sentences back
                else:
                    is_random = 0
                    b_start, b_end = a_end, i + 1
                    len_b = sum(lengths[b_start:b_end])
                a_start = chunk_start
                if sentence_order and not is_random and rng.random() < 0.5:  # swapped: B's sentences first
                    a_start, a_end, b_start, b_end, len_a, len_b = b_start, b_end, a_start, a_end, len_b, len_a
                    is_random = 1
                if len_a >= 1 and len_b >= 1:
                    cuts = truncate_pair_lengths(len_a, len_b, max_tokens, rng)
                    rows.append((a_start, a_end, b_start, b_end, *cuts, is_random))
                chunk_start, chunk_len = i + 1, 0
            i += 1
    return np.array(rows, dtype=np.int64).reshape(-1, 9)


def word_continuations(vocab: dict[str, int], vocab_size: int) -> np.ndarray:
    """bool [vocab_size]: the pieces that continue a word rather than start one, for whole-word and n-gram
    masking. WordPiece marks continuations (`##ing`); SentencePiece (`▁word`) and byte-level BPE (`Ġword`)
    mark word starts instead, so there every piece without the mark continues a word."""
    out = np.zeros(vocab_size, dtype=bool)
    marked = [m for m in ("\u2581", "\u0120") if sum(t.startswith(m) for t in vocab) > len(vocab) // 10]
    for token, index in vocab.items():
        if index >= vocab_size:
            continue
        out[index] = (not token.startswith(marked[0])) if marked else token.startswith("##")
    return out


def ngram_positions(words: list[np.ndarray], num: int, max_n: int, rng: np.random.Generator) -> np.ndarray:
    """ALBERT's n-gram masking: visit the words in a random order; at each, draw a span length n in 1..max_n with
    p(n) ~ 1/n (shortened where fewer words follow), take the n words from there, and fall back to shorter spans
    while the span would pass `num` predictions; spans never overlap. Returns sorted positions (int64)."""
    weights = 1.0 / np.arange(1, max_n + 1)
    covered = np.zeros(int(max(w[-1] for w in words)) + 1, dtype=bool)
    chosen: list[int] = []
    for start in rng.permutation(len(words)):
        if len(chosen) >= num:
            break
        longest = min(max_n, len(words) - start)
        p = weights[:longest] / weights[:longest].sum()
        n = int(rng.choice(np.arange(1, longest + 1), p=p))
        span = np.concatenate(words[start:start + n])
        while len(chosen) + len(span) > num and n > 1:  # try shorter spans before giving this start up
            n -= 1
            span = np.concatenate(words[start:start + n])
        if len(chosen) + len(span) > num or covered[span].any():
            continue
        covered[span] = True
        chosen.extend(span.tolist())
    return np.sort(np.array(chosen, dtype=np.int64))


class MaskingCollator:
    """Pads a list of examples and masks them, google-research/bert style.

    For each sequence, num_to_predict = min(cap, max(1, round(len * masked_lm_prob))) of its
    non-special tokens (or whole words) are chosen uniformly; each becomes [MASK] with
    mask_prob, a random vocabulary token with random_prob, and stays otherwise. Labels are
    the original ids there and -100 elsewhere.
    """

    def __init__(self, tokenizer: Tokenizer, max_seq_len: int, config: MaskingConfig | None = None,
                 pack_to: int | None = None) -> None:
        self.config = config or MaskingConfig()
        self.pack_to = pack_to  # pack the examples into rows of this many tokens (None: one per row)
        self.vocab_size = len(tokenizer)
        self.mask_id = tokenizer.mask_token_id
        self.pad_id = tokenizer.pad_token_id
        self.never_mask = np.array(sorted({tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id}))
        # The rate is the architecture's (`pretrain` fills it in); a collator built without one uses BERT's 15%.
        c = self.config
        self.rate = c.masked_lm_prob if c.masked_lm_prob is not None else 0.15
        self.mask_prob = c.mask_prob if c.mask_prob is not None else 0.8
        self.random_prob = c.random_prob if c.random_prob is not None else 0.1
        cap = self.config.max_predictions
        self.cap = cap if cap is not None else math.ceil(max_seq_len * self.rate)
        self.is_continuation = word_continuations(tokenizer.get_vocab(), self.vocab_size)

    def _choose(self, ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Positions to predict in one sequence (int64 [k])."""
        candidates = np.flatnonzero(~np.isin(ids, self.never_mask))
        num = min(self.cap, max(1, int(round(len(ids) * self.rate))))
        if len(candidates) == 0:
            return candidates
        if not self.config.wwm and self.config.ngram_mask == 1:
            return np.sort(rng.permutation(candidates)[:num])
        # Group each word's pieces (a piece that continues a word joins the one before it, if adjacent).
        starts = candidates[~self.is_continuation[ids[candidates]] | (np.diff(candidates, prepend=-2) != 1)]
        words = np.split(candidates, np.searchsorted(candidates, starts[1:]))
        if self.config.ngram_mask > 1:
            return ngram_positions(words, num, self.config.ngram_mask, rng)
        # Whole-word masking: shuffle the words, and take whole words while they fit.
        chosen: list[int] = []
        for g in rng.permutation(len(words)):
            if len(chosen) >= num:
                break
            if len(chosen) + len(words[g]) > num:
                continue
            chosen.extend(words[g].tolist())
        return np.sort(np.array(chosen, dtype=np.int64))

    def __call__(self, examples: list[dict], rng: np.random.Generator) -> dict[str, torch.Tensor]:
        """examples: dicts with `input_ids` (int array) and optionally `token_type_ids`, `next_sentence_label`.

        Returns a padded batch (or packed, with `pack_to`; see `batching.collate`) with MLM `labels`.
        """
        features = []
        for example in examples:
            ids = np.asarray(example["input_ids"], dtype=np.int64)
            positions = self._choose(ids, rng)
            labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int64)
            labels[positions] = ids[positions]
            roll = rng.random(len(positions))
            masked = ids.copy()
            masked[positions[roll < self.mask_prob]] = self.mask_id
            random_at = positions[(roll >= self.mask_prob) & (roll < self.mask_prob + self.random_prob)]
            masked[random_at] = rng.integers(0, self.vocab_size, len(random_at))
            feature = {"input_ids": masked, "labels": labels}
            for key in ("token_type_ids", "next_sentence_label", "sentence_order_label"):  # (missing segments: 0)
                if key in example:
                    feature[key] = example[key]
            features.append(feature)
        return collate(features, self.pad_id, self.pack_to)


class PretrainingExamples:
    """The instances of one split (a set of documents) for one epoch, read from shards on demand."""

    def __init__(self, shards: TokenShards, docs: np.ndarray, tokenizer: Tokenizer, max_seq_len: int,
                 objective: str = "mlm+nsp", short_seq_prob: float = 0.1, seed: int = 0) -> None:
        if objective not in ("mlm+nsp", "mlm+sop", "mlm"):
            raise ValueError(f"unknown objective {objective!r}")
        self.shards, self.docs, self.objective = shards, docs, objective
        self.max_seq_len, self.short_seq_prob, self.seed = max_seq_len, short_seq_prob, seed
        self.cls, self.sep = tokenizer.cls_token_id, tokenizer.sep_token_id
        self._epoch: int | None = None
        self._instances: np.ndarray | None = None
        self._lengths = shards.sentence_lengths()
        self._bounds = np.concatenate([[0], shards.document_boundaries()])
        if objective == "mlm":  # stream offsets of each document, with one [SEP] after each
            doc_tokens = np.add.reduceat(self._lengths, self._bounds[:-1])[docs] + 1
            self._doc_offsets = np.concatenate([[0], np.cumsum(doc_tokens)])

    def instances(self, epoch: int) -> np.ndarray:
        """This epoch's instances: pairs are re-drawn each epoch (like google's dupe_factor), blocks are fixed."""
        if self._epoch != epoch:
            if self.objective != "mlm":
                rng = random.Random(f"{self.seed}-pairs-{epoch}")
                self._instances = build_nsp_instances(self._lengths, self._bounds, self.docs, self.max_seq_len,
                                                      self.short_seq_prob, rng, self.objective == "mlm+sop")
            else:
                block = self.max_seq_len - 2
                total = int(self._doc_offsets[-1])
                starts = np.arange(0, total, block, dtype=np.int64)
                self._instances = np.stack([starts, np.minimum(starts + block, total)], axis=1)
            self._epoch = epoch
        return self._instances

    def example(self, epoch: int, index: int) -> dict:
        """One model input: `[CLS] A [SEP] B [SEP]` with segment ids and the NSP label, or a packed block."""
        row = self.instances(epoch)[index]
        if self.objective == "mlm":
            return {"input_ids": self._stream(int(row[0]), int(row[1]))}
        a = self.shards.sentence_tokens(int(row[A_START]), int(row[A_END]))
        b = self.shards.sentence_tokens(int(row[B_START]), int(row[B_END]))
        a = a[row[A_FRONT]: len(a) - row[A_BACK]]
        b = b[row[B_FRONT]: len(b) - row[B_BACK]]
        ids = np.concatenate([[self.cls], a, [self.sep], b, [self.sep]])
        types = np.concatenate([np.zeros(len(a) + 2, dtype=np.int64), np.ones(len(b) + 1, dtype=np.int64)])
        label = "sentence_order_label" if self.objective == "mlm+sop" else "next_sentence_label"
        return {"input_ids": ids, "token_type_ids": types, label: int(row[IS_RANDOM])}

    def _stream(self, start: int, end: int) -> np.ndarray:
        """[CLS] + stream[start:end] + [SEP], where the stream is the documents joined by [SEP]."""
        pieces = [np.array([self.cls])]
        d = int(np.searchsorted(self._doc_offsets, start, side="right") - 1)
        pos = start
        while pos < end:
            doc_start = int(self._doc_offsets[d])
            first, last = self.shards.document_sentences(int(self.docs[d]))
            tokens = np.concatenate([self.shards.sentence_tokens(first, last), [self.sep]])
            take = tokens[pos - doc_start: min(end, int(self._doc_offsets[d + 1])) - doc_start]
            pieces.append(take)
            pos += len(take)
            d += 1
        pieces.append(np.array([self.sep]))
        return np.concatenate(pieces).astype(np.int64)
