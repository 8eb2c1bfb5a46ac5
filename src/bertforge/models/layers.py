"""The building blocks the family shares: embeddings, attention, feed-forward, the post-LN block, the pooler.

Each architecture module (`bert.py`, ...) composes these; a variant a family needs (relative or rotary
positions, a gated feed-forward, pre-norm) is added here once and chosen by the architecture's config,
so no two files hold the same layer. Only torch and bertforge's kernels are imported.

Shapes: B = batch, T = sequence length, N = real tokens of an unpadded batch, H = hidden size,
nh = heads, hd = H / nh.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import attention as training_attention
from ..kernels.dropout import dropout
from ..kernels.residual_norm import residual_layer_norm
from .config import HIDDEN_ACT, BertConfig
from .padding import Packing, from_sequences, to_sequences, varlen
from .tied import TiedEmbedding


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

class Dropout(nn.Dropout):
    """nn.Dropout (same contract, same state dict) whose training masks on CPU are hashed from each
    element's index by bertforge's kernel instead of drawn and stored: ~9x cheaper forward and
    backward on this project's CPUs, 10-20% of a training step before (kernels/dropout.py)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """float [...] -> float [...]."""
        return dropout(x, self.p, self.training)


class Embeddings(nn.Module):
    """Token + learned absolute position + segment embeddings, then LayerNorm and dropout, all
    `config.embedding_width` wide (the backbone projects a narrower width up to the hidden size).

    position_padding_idx: the position id padding tokens get, whose row is never trained (RoBERTa's
    `pad_token_id`); None for BERT, whose padding takes ordinary positions.
    positions: False for a family whose positions are rotary (GTE, NomicBERT): no position table.
    """

    def __init__(self, config: BertConfig, position_padding_idx: int | None = None, positions: bool = True) -> None:
        super().__init__()
        E = config.embedding_width  # the hidden size, or ALBERT's and ELECTRA's narrower embedding_size
        self.word = TiedEmbedding(config.vocab_size, E, padding_idx=config.pad_token_id)  # a tied decoder shares it
        self.position = (nn.Embedding(config.max_position_embeddings, E, padding_idx=position_padding_idx)
                         if positions else None)
        # DistilBERT has no segment embeddings (type_vocab_size 0): token_type_ids are then ignored.
        self.segment = nn.Embedding(config.type_vocab_size, E) if config.type_vocab_size else None
        self.norm = nn.LayerNorm(E, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                position_ids: torch.Tensor) -> torch.Tensor:
        """input_ids, token_type_ids, position_ids: long [B, T] -> float [B, T, E] (E = embedding_width)."""
        x = self.word(input_ids)
        if self.position is not None:
            x = x + self.position(position_ids)
        if self.segment is not None:
            x = x + self.segment(token_type_ids)
        return self.dropout(self.norm(x))


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention, followed by its output projection."""

    def __init__(self, config: BertConfig, bias: bool = True) -> None:
        """bias: whether the four projections have one (NomicBERT's have none)."""
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        h = config.hidden_size
        self.query = nn.Linear(h, h, bias=bias)
        self.key = nn.Linear(h, h, bias=bias)
        self.value = nn.Linear(h, h, bias=bias)
        self.out = nn.Linear(h, h, bias=bias)
        self.dropout_p = config.attention_probs_dropout_prob

    def project(self, x: torch.Tensor, **kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: float [B, T, H] or [N, H] -> the queries, keys and values, each shaped like x."""
        return self.query(x), self.key(x), self.value(x)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, output_attentions: bool = False,
                packed: Packing | None = None, bias: torch.Tensor | None = None,
                **project_args) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: float [B, T, H], or [N, H] real tokens when `packed` says where they sit;
        mask: bool [B, 1, 1, T] or [B, 1, T, T], True where a key may be attended to, or None;
        bias: float [1, nh, T, T] added to every row's scores after the 1/sqrt(hd) scaling (MPNet's relative
        positions), T the attention layout's length (`packed.max_seqlen` when packed), or None.

        project_args: what a family's `project` takes (RotarySelfAttention's `rotary`).

        Returns the projected context, shaped like x, and the attention probabilities
        float [B, nh, T, T] when `output_attentions`, else None.
        """
        q, k, v = self.project(x, **project_args)
        if (self.training and bias is None and not output_attentions and fused_training(self, q)
                and (packed is not None or mask is None)):
            # Training on CPU: attention straight on the real tokens, keeping no padded [B, nh, T, T] tensors.
            (q, k, v), cu_seqlens = varlen((q, k, v), packed)
            context = training_attention.attention(q, k, v, cu_seqlens, self.num_heads, self.dropout_p)
            return self.out(context.view(x.shape)), None
        if packed is not None:  # attention needs the sequences: scatter the real tokens into one row each
            q, k, v = to_sequences(q, packed), to_sequences(k, packed), to_sequences(v, packed)
            mask = packed.key_mask
        context, probs = self.attend(q, k, v, mask, output_attentions, bias)
        if packed is not None:
            context = from_sequences(context, packed)
        return self.out(context), probs

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               output_attentions: bool, bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q, k, v: float [B, T, H] -> context float [B, T, H] (and probabilities [B, nh, T, T])."""
        B, T, H = q.shape
        # (B, T, H) -> (B, nh, T, hd): each head attends in its own hd-dim subspace.
        q = q.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        context, probs = scaled_attention(q, k, v, mask, self.dropout_p, self.training, output_attentions, bias)
        return context.transpose(1, 2).reshape(B, T, H), probs  # re-join the heads


class RotarySelfAttention(SelfAttention):
    """BERT's attention with rotary positions (GTE, NomicBERT): queries and keys are rotated by their token's
    position after the projections; the rest, the native training kernel included, is BERT's. The fused inference
    path (`inference/fused.py`) fuses plain `SelfAttention` only, so these layers run eagerly there."""

    def project(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
                **kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: float [B, T, H] or [N, H]; rotary: (cos, sin), float32 [B, T, hd] or [N, hd], at x's tokens."""
        q, k, v = super().project(x)
        heads = (*x.shape[:-1], self.num_heads, self.head_dim)
        q = rotate(q.view(heads), *rotary).reshape(q.shape)
        k = rotate(k.view(heads), *rotary).reshape(k.shape)
        return q, k, v


def rotary_tables(position_ids: torch.Tensor, theta: float, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Position ids long [...] -> (cos, sin), each float32 [..., dim]: RoPE's angles position * theta^(-2i/dim),
    each frequency used for two dimensions (first half and second half), in transformers' float32 steps."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=position_ids.device) / dim))
    angles = position_ids[..., None].float() * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each head's pairs (i, i + hd/2) by the position's angles, in float32 (as transformers).

    x: [..., nh, hd]; cos, sin: float32 [..., hd] (the same leading shape, without heads)."""
    xf = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos[..., None, :] + rotated * sin[..., None, :]).to(x.dtype)


def fused_training(module: SelfAttention, q: torch.Tensor) -> bool:
    """Whether `module` trains with the native fused varlen attention (`kernels.attention`): eager on
    CPU, float32 or bf16, a head size the kernel is built for, and BERT's own `attend` (a family that
    changes the scores keeps its path). Elsewhere the explicit path below, with the hashed dropout."""
    return (not torch.compiler.is_compiling() and type(module).attend is SelfAttention.attend
            and training_attention.native(q, module.num_heads))


def scaled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dropout_p: float,
                     training: bool, output_attentions: bool,
                     bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(q k^T / sqrt(hd) + bias, where mask) v, by heads: q, k, v float [B, nh, T, hd]; mask bool,
    broadcast to [B, nh, T, T], True where a key may be attended to; bias float [1, nh, T, T] or None.
    Returns the context [B, nh, T, hd] and, when `output_attentions`, the probabilities [B, nh, T, T]."""
    dropout_p = dropout_p if training else 0.0
    probs = None
    if bias is not None:
        # A score bias: masked keys get the dtype's lowest value added, not -inf, as transformers' additive mask
        # (a padding query of the masked path then averages its keys instead of giving NaN).
        bias = bias.to(q.dtype)
        if mask is not None:
            bias = bias.masked_fill(~mask, torch.finfo(q.dtype).min)
        mask = None
    if torch.compiler.is_exporting() and not output_attentions and dropout_p == 0.0:
        return exported_attention(q, k, v, mask, bias), None
    # SDPA draws its attention dropout with torch's Bernoulli sampler, which cost more than the
    # attention itself on CPU; eager training there takes the explicit path and the hashed dropout.
    hashed = dropout_p > 0.0 and q.device.type == "cpu" and not torch.compiler.is_compiling()
    if output_attentions or hashed:
        # The explicit path: the same maths as SDPA, but the probabilities are kept.
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, nh, T, T)
        if bias is not None:
            scores = scores + bias
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = scores.softmax(dim=-1)
        context = dropout(probs, dropout_p, training) @ v  # (B, nh, T, hd)
        probs = probs if output_attentions else None
    else:
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask if bias is None else bias, dropout_p=dropout_p)
    return context, probs


def exported_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
    """`scaled_attention` as a graph being exported (ONNX) holds it: q, k, v float [B, nh, T, hd], mask bool
    (broadcast to [B, nh, T, T]) -> context [B, nh, T, hd].

    The mask is added to the scores as 0 or the dtype's lowest value, not applied by SDPA: torch lowers SDPA with a
    bool mask to ONNX with a NaN guard after the softmax (IsNaN, Where), a Shape/Slice/Concat/Reshape chain around the
    keys' transpose and two scalings, 11 more operators a layer than this, which ONNX Runtime runs measurably slower
    at one row (docs/notes/2026-11-latency-and-inference.md). The additive mask depends on the mask alone, so the
    exporter's optimiser builds it once for all the layers that share a mask. A row with no key to see (a query of a
    row with no real token) averages over all its keys, not NaN."""
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, nh, T, T)
    if bias is not None:  # a score bias with the mask in it already (scaled_attention)
        scores = scores + bias
    if mask is not None:
        scores = scores + torch.zeros((), dtype=scores.dtype).masked_fill(~mask, torch.finfo(scores.dtype).min)
    return scores.softmax(dim=-1) @ v


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


class GatedFeedForward(nn.Module):
    """GTE's and NomicBERT's gated feed-forward: down(dropout(act(gate(x)) * up(x))), gate and up their own
    matrices without bias, down with one where the family has it (`down_bias`). ModernBERT's GeGLU, one fused
    matrix for both halves, is its own (`modernbert.GatedFeedForward`)."""

    def __init__(self, config: BertConfig, down_bias: bool, dropout_p: float = 0.0) -> None:
        super().__init__()
        self.gate = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.act = activation(config.hidden_act)
        self.dropout = Dropout(dropout_p)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size, bias=down_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """float [..., H] -> float [..., H]."""
        return self.down(self.dropout(self.act(self.gate(x)) * self.up(x)))


class BertLayer(nn.Module):
    """One post-LN transformer block: x = LN(x + Attn(x)); x = LN(x + FFN(x)).

    attention: BERT's `SelfAttention` unless a family passes its own (DeBERTa's disentangled one, GTE's rotary
    one), which takes the same arguments plus any keywords `forward` is given for it; ffn: BERT's `FeedForward`
    unless a family passes its own (GTE's gated one)."""

    def __init__(self, config: BertConfig, attention: nn.Module | None = None, ffn: nn.Module | None = None) -> None:
        super().__init__()
        self.attention = attention if attention is not None else SelfAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ffn = ffn if ffn is not None else FeedForward(config)
        self.ffn_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, output_attentions: bool = False,
                packed: Packing | None = None, **attention_args) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: float [B, T, H] (or [N, H] packed) -> (the same shape, attention probabilities or None)."""
        attended, probs = self.attention(x, mask, output_attentions, packed, **attention_args)
        # norm(x + y), in one pass each way when training on the CPU (kernels/residual_norm.py)
        x = residual_layer_norm(self.attention_norm, x, self.dropout(attended))
        x = residual_layer_norm(self.ffn_norm, x, self.dropout(self.ffn(x)))
        return x, probs


class Pooler(nn.Module):
    """tanh(Linear(h_CLS)): the sentence vector NSP and sequence classification read."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        """The [CLS] vectors, float [S, H] (one per example) -> float [S, H]."""
        return torch.tanh(self.dense(first))
