"""BERT, top to bottom: embeddings -> N x (self-attention, feed-forward) -> pooler.

This is the encoder of Devlin et al. (2019), laid out so it can be read in one
sitting. It produces the same numbers as `bert-base-uncased` in transformers;
`bertforge.interop.hf` maps checkpoint names both ways. Only torch is used here: data,
files, distribution and the CLI live elsewhere.

How this file differs from transformers' `modeling_bert.py`, and why:
1. No cross-attention, KV caches, head masks or relative positions: BERT never used them.
2. Attention runs through `F.scaled_dot_product_attention` (fused kernels) unless the
   caller asks for the attention probabilities, which needs the explicit softmax path.
3. A batch without padding passes no mask at all, so SDPA may pick its fastest kernel.
   A batch with padding is *unpadded* after the embedding lookup: every Linear, LayerNorm
   and GELU runs on the [N, H] matrix of its N real tokens, and only attention scatters
   them back into rows (`padding.py`). The output is padded again at the end. Same
   numbers, fewer FLOPs; `model.unpad = False` turns it off.
   Rows may also be *packed* with several examples, each restarting its position ids at 0
   (transformers' `DataCollatorWithFlattening` convention): attention is then per example
   (block-diagonal) and the pooler reads each example's own [CLS].
4. Module names are short and descriptive (`attention.query`, `ffn.up`); the checkpoint
   names everyone's weights use are kept in one table, `HF_NAMES` below.

Shapes: B = batch, T = sequence length, H = hidden size, nh = heads, hd = H / nh.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from ..errors import InputError
from .base import ModelOutput, NameTable, PreTrainedModel
from .config import BertConfig
from .layers import BertLayer, Embeddings, Pooler
from .padding import Packing, block_diagonal_mask, example_starts, packing, pad, refuse_left_padding, unpad


@dataclass
class BertOutput(ModelOutput):
    """What the backbone returns.

    last_hidden_state: float [B, T, H]
    pooler_output:     float [B, H], tanh(W h_CLS + b); None when the model has no pooler.
                       For packed rows, [S, H]: one per example, row by row, left to right
    hidden_states:     tuple of L+1 float [B, T, H] (embeddings, then each layer), when asked
    attentions:        tuple of L float [B, nh, T, T] attention probabilities, when asked
    """

    last_hidden_state: torch.Tensor
    pooler_output: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


# bertforge module name -> transformers module name, the one table both directions read.
HF_NAMES = NameTable(
    backbone=(
        ("embeddings.word", "embeddings.word_embeddings"),
        ("embeddings.position", "embeddings.position_embeddings"),
        ("embeddings.segment", "embeddings.token_type_embeddings"),
        ("embeddings.norm", "embeddings.LayerNorm"),
        ("layers.{i}.attention.query", "encoder.layer.{i}.attention.self.query"),
        ("layers.{i}.attention.key", "encoder.layer.{i}.attention.self.key"),
        ("layers.{i}.attention.value", "encoder.layer.{i}.attention.self.value"),
        ("layers.{i}.attention.out", "encoder.layer.{i}.attention.output.dense"),
        ("layers.{i}.attention_norm", "encoder.layer.{i}.attention.output.LayerNorm"),
        ("layers.{i}.ffn.up", "encoder.layer.{i}.intermediate.dense"),
        ("layers.{i}.ffn.down", "encoder.layer.{i}.output.dense"),
        ("layers.{i}.ffn_norm", "encoder.layer.{i}.output.LayerNorm"),
        ("pooler.dense", "pooler.dense"),
    ),
    heads=(
        ("mlm.transform.dense", "cls.predictions.transform.dense"),
        ("mlm.transform.norm", "cls.predictions.transform.LayerNorm"),
        ("mlm.bias", "cls.predictions.bias"),
        ("mlm.decoder", "cls.predictions.decoder"),  # only with tie_word_embeddings: false
        ("nsp", "cls.seq_relationship"),
        ("classifier", "classifier"),
        ("qa_outputs", "qa_outputs"),
    ),
    prefix="bert",
    # Buffers, and the MLM decoder's bias (the same tensor as cls.predictions.bias).
    derived=r"(^|\.)embeddings\.position_ids$|(^|\.)embeddings\.token_type_ids$|^cls\.predictions\.decoder\.bias$",
    # Derived too when tied to the word embeddings (transformers then ignores a stored copy).
    tied_decoder="cls.predictions.decoder.weight",
)


class BertPreTrainedModel(PreTrainedModel):
    """BERT's checkpoint layout: the transformers class each model reads and writes."""

    config: BertConfig
    model_type = "bert"
    hf_architecture = "BertModel"


class BertModel(BertPreTrainedModel):
    """The BERT encoder: embeddings, `num_hidden_layers` blocks and (optionally) the pooler."""

    # Whether the masked path computes padding positions as the family's transformers class does (BERT's masks keys
    # only, so a padding position's vector is that of a query attending to the real tokens): a left-padded batch then
    # gives transformers' pooler output. A family that differs there refuses left padding before a head reads it.
    pads_like_transformers: ClassVar[bool] = True

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__()
        self.config = config
        self.embeddings = self.build_embeddings(config)
        # Factorised embeddings (ALBERT, ELECTRA): E-wide vectors projected up to the hidden size.
        self.project = nn.Linear(config.embedding_width, config.hidden_size) if self.projects(config) else None
        self.layers = self.build_layers(config)
        self.pooler = self.build_pooler(config) if add_pooling_layer else None
        # Post-LN blocks end normalised; a pre-norm family (ModernBERT) sets its closing LayerNorm here.
        self.final_norm: nn.Module | None = None
        self.unpad = True  # run padded batches on their real tokens only (same numbers, less work)
        self.init_weights()

    # BERT counts positions from 0 and gives padding ordinary positions; RoBERTa overrides these two.
    pads_positions = False

    def build_embeddings(self, config: BertConfig) -> nn.Module:
        """Token, position and segment lookups, summed and normalised (DeBERTa's differ)."""
        return Embeddings(config, config.pad_token_id if self.pads_positions else None)

    def build_pooler(self, config: BertConfig) -> nn.Module:
        """What `pooler_output` is computed by from the first token's state: BERT's tanh(Linear)."""
        return Pooler(config)

    def projects(self, config: BertConfig) -> bool:
        """Whether the embeddings are projected up to the hidden size: when they are narrower (ELECTRA's rule)."""
        return config.embedding_width != config.hidden_size

    def build_layers(self, config: BertConfig) -> nn.ModuleList:
        """The transformer blocks, one per layer (ALBERT shares them across layers instead)."""
        return nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def blocks(self) -> Iterator[nn.Module]:
        """The blocks in the order they run, one per layer."""
        return iter(self.layers)

    def encode(self, x: torch.Tensor, mask: torch.Tensor | None, packed: Packing | None,
               output_attentions: bool, position_ids: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        """Each block's output and attention probabilities (or None), in order: the blocks one after
        another (a family whose blocks need more than the previous output overrides this).

        x: the embeddings, float [B, T, H] (or [N, H] when `packed`); mask as `SelfAttention` takes it;
        position_ids: long, laid out as x's tokens ([B, T] or [N]), for families with rotary positions."""
        for layer in self.blocks():
            x, probs = layer(x, mask, output_attentions, packed)
            yield x, probs

    @property
    def position_offset(self) -> int:
        """The position id of a row's first token (a packed example restarts at it): the config's."""
        return self.config.position_offset

    def default_position_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """long [B, T] -> long [B, T]: 0, 1, ..., T-1 in every row."""
        B, T = input_ids.shape
        return torch.arange(T, device=input_ids.device).expand(B, T)

    def check_inputs(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                     attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None = None) -> None:
        """Turn out-of-range inputs into a clear error instead of an IndexError deep in torch."""
        c = self.config
        if input_ids.dim() != 2:
            raise InputError(f"input_ids must have shape [batch, seq_len], got {tuple(input_ids.shape)}")
        longest = c.max_position_embeddings - self.position_offset
        if input_ids.shape[1] > longest:
            skipped = f" less the {self.position_offset} position ids before a row's first" if self.position_offset else ""
            raise InputError(
                f"sequence length {input_ids.shape[1]} exceeds max_position_embeddings ({c.max_position_embeddings})"
                f"{skipped}; truncate the input (e.g. max_length={longest})"
            )
        for name, t, limit in (("input_ids", input_ids, c.vocab_size), ("token_type_ids", token_type_ids, c.type_vocab_size),
                               ("position_ids", position_ids, c.max_position_embeddings)):
            if t is None or t.numel() == 0 or limit == 0:  # limit 0: no segments, token_type_ids unused
                continue
            if t.shape != input_ids.shape:
                raise InputError(f"{name} has shape {tuple(t.shape)}, but input_ids has {tuple(input_ids.shape)}")
            lo, hi = int(t.min()), int(t.max())
            if lo < 0 or hi >= limit:
                bad = hi if hi >= limit else lo
                size = {"input_ids": "vocab_size", "token_type_ids": "type_vocab_size"}.get(name, "max_position_embeddings")
                raise InputError(f"{name} contains {bad}, outside [0, {limit}) set by {size}; "
                                 "does the tokenizer match the model?")
        if attention_mask is not None and attention_mask.shape != input_ids.shape:
            raise InputError(f"attention_mask has shape {tuple(attention_mask.shape)}, "
                             f"but input_ids has {tuple(input_ids.shape)}")

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                output_attentions: bool = False, output_hidden_states: bool = False) -> BertOutput:
        """input_ids: long [B, T]; token_type_ids: long [B, T] (0 = segment A, 1 = segment B);
        attention_mask: [B, T], 1 for real tokens and 0 for padding; position_ids: long [B, T],
        where a 0 after the first column starts a new packed example in that row.
        """
        if position_ids is not None and position_ids.dim() == 2 and position_ids.shape[0] == 1:
            position_ids = position_ids.expand(input_ids.shape[0], -1)  # one row of positions for the batch
        if not torch.compiler.is_compiling():
            self.check_inputs(input_ids, token_type_ids, attention_mask, position_ids)
        B, T = input_ids.shape
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)

        mask = packed = starts = None
        if torch.compiler.is_compiling():
            # Under torch.compile / torch.export / ONNX export the graph must not depend on the
            # data, so the mask is always applied and nothing is unpadded or unpacked.
            if attention_mask is not None:
                mask = attention_mask.bool()[:, None, None, :]
        else:
            real = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
            if position_ids is not None:
                starts = example_starts(position_ids - self.position_offset, real)  # None unless some row holds several examples
            if starts is not None or not bool(real.all()):
                # Left padding (a row whose first token is padding): the pooler and every head that reads the first
                # position read a padding token there, whose vector transformers computes (it masks keys, not
                # queries). The masked path computes it too, so such a batch takes it: transformers' numbers, not
                # the constant tanh(pooler bias) the zeros of the unpadded path would give.
                left = starts is None and not bool(real[:, 0].all())
                if self.unpad and not output_attentions and not left:
                    packed = packing(real, starts)
                elif starts is not None:
                    mask = block_diagonal_mask(starts, real)  # (B, 1, T, T)
                else:
                    mask = real[:, None, None, :]  # (B, 1, 1, T): broadcast over heads and queries
        if position_ids is None:
            position_ids = self.default_position_ids(input_ids)

        if packed is not None:  # look up the real tokens only: x is (N, H) from here to the last layer
            input_ids, token_type_ids, position_ids = (unpad(t, packed) for t in (input_ids, token_type_ids, position_ids))
        x = self.embeddings(input_ids, token_type_ids, position_ids)  # (B, T, H), or (N, H)
        if self.project is not None:
            x = self.project(x)  # (..., E) -> (..., H)
        padded = (lambda t: pad(t, packed)) if packed is not None else (lambda t: t)
        all_hidden = [padded(x)] if output_hidden_states else None
        all_probs = [] if output_attentions else None
        for x, probs in self.encode(x, mask, packed, output_attentions, position_ids):
            if all_hidden is not None:
                all_hidden.append(padded(x))
            if all_probs is not None:
                all_probs.append(probs)
        if self.final_norm is not None:  # a pre-norm family's last LayerNorm, part of the last hidden state
            x = self.final_norm(x)
            if all_hidden is not None:
                all_hidden[-1] = padded(x)
        x = padded(x)  # (B, T, H), zeros at padding when unpadded

        pooled = None
        if self.pooler is not None and not self.pads_like_transformers and not torch.compiler.is_compiling():
            refuse_left_padding(attention_mask, self.model_type)
        if self.pooler is not None:
            # One [CLS] per example: column 0 of each row, or every example start of packed rows.
            first = x[:, 0] if starts is None else x.flatten(0, 1)[starts.flatten().nonzero().squeeze(1)]
            pooled = self.pooler(first)
        return BertOutput(
            last_hidden_state=x,
            pooler_output=pooled,
            hidden_states=tuple(all_hidden) if all_hidden is not None else None,
            attentions=tuple(all_probs) if all_probs is not None else None,
        )
