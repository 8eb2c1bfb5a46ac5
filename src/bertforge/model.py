"""BERT, top to bottom: embeddings -> N x (self-attention, feed-forward) -> pooler.

This is the encoder of Devlin et al. (2019), laid out so it can be read in one
sitting. It produces the same numbers as `bert-base-uncased` in transformers;
`bertforge.hf` maps checkpoint names both ways. Only torch is used here: data,
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
   names everyone's weights use are kept in one table in `hf.py`.

Shapes: B = batch, T = sequence length, H = hidden size, nh = heads, hd = H / nh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import HIDDEN_ACT, BertConfig
from .errors import InputError
from .padding import Packing, block_diagonal_mask, example_starts, from_sequences, pad, packing, to_sequences, unpad


def activation(name: str) -> nn.Module:
    """The feed-forward non-linearity named by `config.hidden_act` (see `config.HIDDEN_ACT` for the aliases)."""
    kind = HIDDEN_ACT.get(name)
    if kind == "gelu":  # BERT's exact GELU: x * Phi(x), with the erf form of the normal CDF
        return nn.GELU()
    if kind == "gelu_tanh":  # the tanh approximation some checkpoints used
        return nn.GELU(approximate="tanh")
    modules = {"relu": nn.ReLU, "silu": nn.SiLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "mish": nn.Mish,
               "relu6": nn.ReLU6, "leaky_relu": nn.LeakyReLU, "hardswish": nn.Hardswish, "identity": nn.Identity}
    if kind not in modules:
        raise ValueError(f"unknown activation {name!r}")
    return modules[kind]()


@dataclass
class BertOutput:
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


class Embeddings(nn.Module):
    """Token + learned absolute position + segment embeddings, then LayerNorm and dropout."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.segment = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                position_ids: torch.Tensor) -> torch.Tensor:
        """input_ids, token_type_ids, position_ids: long [B, T] -> float [B, T, H]."""
        x = self.word(input_ids) + self.position(position_ids) + self.segment(token_type_ids)
        return self.dropout(self.norm(x))


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention, followed by its output projection."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        h = config.hidden_size
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(h, h)
        self.value = nn.Linear(h, h)
        self.out = nn.Linear(h, h)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, output_attentions: bool = False,
                packed: Packing | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: float [B, T, H], or [N, H] real tokens when `packed` says where they sit;
        mask: bool [B, 1, 1, T] or [B, 1, T, T], True where a key may be attended to, or None.

        Returns the projected context, shaped like x, and the attention probabilities
        float [B, nh, T, T] when `output_attentions`, else None.
        """
        q, k, v = self.query(x), self.key(x), self.value(x)
        if packed is not None:  # attention needs the sequences: scatter the real tokens into one row each
            q, k, v = to_sequences(q, packed), to_sequences(k, packed), to_sequences(v, packed)
            mask = packed.key_mask
        context, probs = self.attend(q, k, v, mask, output_attentions)
        if packed is not None:
            context = from_sequences(context, packed)
        return self.out(context), probs

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               output_attentions: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q, k, v: float [B, T, H] -> context float [B, T, H] (and probabilities [B, nh, T, T])."""
        B, T, H = q.shape
        # (B, T, H) -> (B, nh, T, hd): each head attends in its own hd-dim subspace.
        q = q.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        dropout_p = self.dropout_p if self.training else 0.0

        probs = None
        if output_attentions:
            # The explicit path: the same maths as SDPA, but the probabilities are kept.
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (B, nh, T, T)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            probs = scores.softmax(dim=-1)
            context = F.dropout(probs, dropout_p, self.training) @ v  # (B, nh, T, hd)
        else:
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)

        return context.transpose(1, 2).reshape(B, T, H), probs  # re-join the heads


class FeedForward(nn.Module):
    """Position-wise Linear(H -> 4H) -> GELU -> Linear(4H -> H)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.up = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """float [..., H] -> float [..., H]."""
        return self.down(self.act(self.up(x)))


class BertLayer(nn.Module):
    """One post-LN transformer block: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = SelfAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ffn = FeedForward(config)
        self.ffn_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, output_attentions: bool = False,
                packed: Packing | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: float [B, T, H] (or [N, H] packed) -> (the same shape, attention probabilities or None)."""
        attended, probs = self.attention(x, mask, output_attentions, packed)
        x = self.attention_norm(x + self.dropout(attended))
        x = self.ffn_norm(x + self.dropout(self.ffn(x)))
        return x, probs


class Pooler(nn.Module):
    """tanh(Linear(h_CLS)): the sentence vector NSP and sequence classification read."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        """The [CLS] vectors, float [S, H] (one per example) -> float [S, H]."""
        return torch.tanh(self.dense(first))


class BertPreTrainedModel(nn.Module):
    """Shared by the backbone and every head: BERT's initialisation and checkpoint I/O."""

    config: BertConfig
    # The transformers class whose checkpoint layout this model reads and writes.
    hf_architecture = "BertModel"

    def init_weights(self) -> None:
        """BERT's initialisation: N(0, initializer_range) weights, zero biases, unit LayerNorm."""
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
            if isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    @classmethod
    def from_pretrained(cls, path, **config_overrides):
        """Load a Hugging Face style directory (config.json + model.safetensors or pytorch_model.bin).

        Keyword arguments override config fields, e.g. `num_labels=3` for a new head.
        """
        from . import hf  # file I/O lives in hf.py; the model itself needs only torch

        return hf.load_pretrained(cls, path, **config_overrides)

    def save_pretrained(self, path, tokenizer=None) -> None:
        """Write config.json and model.safetensors in the transformers layout (and the tokenizer, if given)."""
        from . import hf

        hf.save_pretrained(self, path, tokenizer=tokenizer)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


class BertModel(BertPreTrainedModel):
    """The BERT encoder: embeddings, `num_hidden_layers` blocks and (optionally) the pooler."""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.pooler = Pooler(config) if add_pooling_layer else None
        self.unpad = True  # run padded batches on their real tokens only (same numbers, less work)
        self.init_weights()

    def check_inputs(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                     attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None = None) -> None:
        """Turn out-of-range inputs into a clear error instead of an IndexError deep in torch."""
        c = self.config
        if input_ids.dim() != 2:
            raise InputError(f"input_ids must have shape [batch, seq_len], got {tuple(input_ids.shape)}")
        if input_ids.shape[1] > c.max_position_embeddings:
            raise InputError(
                f"sequence length {input_ids.shape[1]} exceeds max_position_embeddings "
                f"({c.max_position_embeddings}); truncate the input (e.g. max_length={c.max_position_embeddings})"
            )
        for name, t, limit in (("input_ids", input_ids, c.vocab_size), ("token_type_ids", token_type_ids, c.type_vocab_size),
                               ("position_ids", position_ids, c.max_position_embeddings)):
            if t is None or t.numel() == 0:
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
                starts = example_starts(position_ids, real)  # None unless some row holds several examples
            if starts is not None or not bool(real.all()):
                if self.unpad and not output_attentions:
                    packed = packing(real, starts)
                elif starts is not None:
                    mask = block_diagonal_mask(starts, real)  # (B, 1, T, T)
                else:
                    mask = real[:, None, None, :]  # (B, 1, 1, T): broadcast over heads and queries
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device).expand(B, T)

        if packed is None:
            x = self.embeddings(input_ids, token_type_ids, position_ids)  # (B, T, H)
        else:  # look up the real tokens only: x is (N, H) from here to the last layer
            x = self.embeddings(unpad(input_ids, packed), unpad(token_type_ids, packed), unpad(position_ids, packed))
        padded = (lambda t: pad(t, packed)) if packed is not None else (lambda t: t)
        all_hidden = [padded(x)] if output_hidden_states else None
        all_probs = [] if output_attentions else None
        for layer in self.layers:
            x, probs = layer(x, mask, output_attentions, packed)
            if all_hidden is not None:
                all_hidden.append(padded(x))
            if all_probs is not None:
                all_probs.append(probs)
        x = padded(x)  # (B, T, H), zeros at padding when unpadded

        pooled = None
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
