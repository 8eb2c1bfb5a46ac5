"""DeBERTa-v2 and -v3 (He et al., 2021): BERT's post-LN encoder with disentangled attention.

DeBERTa keeps a token's content and its position apart. Attention scores add, to BERT's
content-to-content term q_i . k_j, a content-to-position term (c2p: q_i against the key
projection of the embedding of the relative distance i - j) and a position-to-content term (p2c:
k_j against the query projection of the distance's embedding), all divided by sqrt(d * (1 + the
number of extra terms)). DeBERTa-v3 is the same network pretrained as ELECTRA is; its checkpoints
are `model_type: deberta-v2`. What a checkpoint reader must know:
1. Relative distances: i - j, put into `position_buckets` buckets when that is set (exact up to
   half the bucket count, log-spaced beyond, out to `max_relative_positions`; -1 means
   `max_position_embeddings`). One table of 2 x buckets embeddings (`encoder.rel_embeddings`),
   LayerNorm-ed once per forward when `norm_rel_ebd` says `layer_norm`, serves every layer; with
   `share_att_key` each layer projects it with its own query and key matrices, else with separate
   `pos_query_proj` / `pos_key_proj`. `pos_att_type` lists the terms used ("p2c|c2p" in v3).
2. Embeddings: word (+ absolute positions only when `position_biased_input`, off in v3) (+
   segments when `type_vocab_size` > 0, 0 in v3), then a bias-free projection when
   `embedding_size` differs from the hidden size, then LayerNorm: the norm is after the projection,
   unlike ALBERT's and ELECTRA's.
3. An optional convolution (`conv_kernel_size` > 0, DeBERTa-v2-xlarge's): after the first layer, a
   1-D convolution over the embeddings' sequence, through `conv_act`, is added to that layer's output
   and LayerNorm-ed.
4. Heads: the sentence classifier reads the first token through `pooler` (dropout `pooler_dropout`
   -> dense -> `pooler_hidden_act`), then dropout `cls_dropout` -> `classifier`; the tagger's dropout
   is `hidden_dropout_prob` whatever `cls_dropout` says. The masked-LM head is BERT's
   (`cls.predictions.*`, dense to `embedding_size`) when `legacy` is true, transformers' default,
   else `lm_predictions.lm_head.*` (dense H -> H, the decoder always the word embeddings).
The arithmetic is transformers' (`modeling_deberta_v2.py`), written on bertforge's unpadded layout:
relative distances are taken inside each sequence, so padding and packing change no real token.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .. import kernels
from ..errors import ConfigError
from ..kernels.dropout import dropout
from .base import NameTable
from .bert import BertModel
from .config import HIDDEN_ACT, RenamedConfig
from .heads import (BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification,
                    BertForTokenClassification)
from .layers import BertLayer, Dropout, activation
from .padding import Packing, from_sequences, to_sequences, varlen
from .tied import TiedEmbedding

POSITION_TERMS = ("c2p", "p2c")


@dataclass
class DebertaV2Config(RenamedConfig):
    """transformers' DebertaV2Config: BERT's fields (its defaults, DeBERTa-v2-xlarge's sizes) plus the
    relative-position settings of point 1, the embedding settings of point 2 and the heads' of point 4."""

    model_type = "deberta-v2"
    segments = False  # type_vocab_size may be 0: no segment embeddings (DeBERTa-v3)
    renamed = {"cls_dropout": "classifier_dropout"}
    vocab_size: int = 128100
    hidden_size: int = 1536
    num_hidden_layers: int = 24
    num_attention_heads: int = 24
    intermediate_size: int = 6144
    type_vocab_size: int = 0
    layer_norm_eps: float = 1e-7
    relative_attention: bool = False
    max_relative_positions: int = -1
    position_buckets: int = -1
    position_biased_input: bool = True
    pos_att_type: Any = None  # a list, or a "p2c|c2p" string, of POSITION_TERMS
    share_att_key: bool = False
    norm_rel_ebd: str = "none"
    conv_kernel_size: int = 0
    conv_groups: int = 1
    conv_act: str = "tanh"
    embedding_size: int | None = None  # None: the hidden size
    pooler_hidden_size: int | None = None  # None: the hidden size (nothing else is computable)
    pooler_dropout: float = 0.0
    pooler_hidden_act: str = "gelu"
    legacy: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("relative_attention", "position_biased_input", "share_att_key", "legacy"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"config key '{name}' must be true or false, got {getattr(self, name)!r}")
        for name in ("max_relative_positions", "position_buckets", "conv_kernel_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"config key '{name}' must be an integer, got {value!r}")
        terms = self.pos_att_type
        if isinstance(terms, str):  # transformers' older spelling, as v3's config.json has it
            terms = terms.lower().split("|")
        if terms is None:
            terms = []
        if not isinstance(terms, list) or not all(isinstance(t, str) for t in terms):
            raise ConfigError(f"config key 'pos_att_type' must be a list of {POSITION_TERMS}, got {self.pos_att_type!r}")
        self.pos_att_type = [t.strip().lower() for t in terms]
        unknown = [t for t in self.pos_att_type if t not in POSITION_TERMS]
        if unknown:
            raise ConfigError(f"config key 'pos_att_type' holds {unknown}; DeBERTa-v2 computes only {POSITION_TERMS}")
        norms = [x.strip() for x in str(self.norm_rel_ebd).lower().split("|")]
        if not isinstance(self.norm_rel_ebd, str) or not set(norms) <= {"none", "layer_norm"}:
            raise ConfigError(f"config key 'norm_rel_ebd' is {self.norm_rel_ebd!r}; supported: 'none', 'layer_norm'")
        if self.conv_kernel_size < 0 or (self.conv_kernel_size and self.conv_kernel_size % 2 == 0):
            # An even kernel with transformers' padding shortens the sequence by one, which it cannot add back.
            raise ConfigError(f"config key 'conv_kernel_size' must be 0 or odd, got {self.conv_kernel_size}")
        if self.conv_kernel_size:
            self.check_sizes("conv_groups")
            if self.hidden_size % self.conv_groups:
                raise ConfigError(f"config key 'conv_groups' ({self.conv_groups}) must divide 'hidden_size'")
        for name in ("conv_act", "pooler_hidden_act"):
            if getattr(self, name) not in HIDDEN_ACT:
                raise ConfigError(f"config key '{name}' is {getattr(self, name)!r}; supported: {', '.join(HIDDEN_ACT)}")
        if not isinstance(self.pooler_dropout, (int, float)) or not 0.0 <= self.pooler_dropout < 1.0:
            raise ConfigError(f"config key 'pooler_dropout' must be in [0, 1), got {self.pooler_dropout!r}")
        if self.embedding_size is None:
            self.embedding_size = self.hidden_size
        self.check_sizes("embedding_size")
        if self.pooler_hidden_size is None:
            self.pooler_hidden_size = self.hidden_size
        if self.pooler_hidden_size != self.hidden_size:
            raise ConfigError(f"config key 'pooler_hidden_size' ({self.pooler_hidden_size}) must equal 'hidden_size' "
                              f"({self.hidden_size}): transformers' classifier reads a hidden-size vector")
        if not self.legacy and self.embedding_size != self.hidden_size:
            raise ConfigError("config key 'legacy' is false, whose masked-LM head multiplies hidden-size vectors "
                              "by the word embeddings: 'embedding_size' must then equal 'hidden_size'")

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "DebertaV2Config":
        if isinstance(data, dict) and "attention_head_size" in data:
            heads = data.get("num_attention_heads", cls.num_attention_heads)
            hidden = data.get("hidden_size", cls.hidden_size)
            if isinstance(heads, int) and heads and data["attention_head_size"] != hidden // heads:
                raise ConfigError(f"{source}: key 'attention_head_size' is {data['attention_head_size']!r}; bertforge "
                                  "computes heads of hidden_size / num_attention_heads only")
        return super().from_dict(data, source)

    @property
    def embedding_width(self) -> int:
        return self.embedding_size

    @property
    def relative_span(self) -> int:
        """k: relative distances are embedded in 2k rows (the bucket count, else the longest distance)."""
        return self.position_buckets if self.position_buckets > 0 else self.max_distance

    @property
    def max_distance(self) -> int:
        return self.max_relative_positions if self.max_relative_positions >= 1 else self.max_position_embeddings

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "DebertaV2Config":
        """A preset size shaped as DeBERTa-v3: relative positions in 256 buckets, shared keys, both terms,
        normalised distance embeddings, no absolute positions and no segments."""
        v3 = dict(relative_attention=True, position_buckets=256, share_att_key=True, pos_att_type=["p2c", "c2p"],
                  norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0, layer_norm_eps=1e-7,
                  max_position_embeddings=512)
        return super().from_preset(name, **{**v3, **overrides})


def log_buckets(distance: torch.Tensor, buckets: int, max_position: int) -> torch.Tensor:
    """Distances i - j (long) -> their buckets (long): themselves within half the bucket count, then
    log-spaced out to max_position, sign kept. The float32 steps are transformers', so every
    distance falls in the same bucket as there."""
    mid = buckets // 2
    sign = torch.sign(distance)
    near = (distance < mid) & (distance > -mid)
    magnitude = torch.where(near, torch.full_like(distance, mid - 1), distance.abs())
    log_step = torch.log(torch.tensor((max_position - 1) / mid))
    far = torch.ceil(torch.log(magnitude / mid) / log_step * (mid - 1)) + mid
    return torch.where(magnitude <= mid, distance.to(far.dtype), far * sign).long()


@dataclass
class RelativePositions:
    """What every layer's position terms share, built once per forward.

    table: float [2k', H], the rows of the distance embeddings a row of T tokens can reach (normalised
    when the config says so); rows: long [2T - 1], the table row of distance d = i - j (query i, key
    j) at d + T - 1, nondecreasing in d; index: long [T, T], the same read for every (i, j).
    Both terms read it: c2p scores query i against row index[i, j], p2c scores key j against the same
    row (transformers indexes p2c by the distance from j to i, negated: the same row, as the buckets
    are odd in the distance).
    """

    table: torch.Tensor
    rows: torch.Tensor
    index: torch.Tensor


class DisentangledAttention(nn.Module):
    """Self-attention with DeBERTa's content-to-position and position-to-content terms (point 1),
    followed by its output projection. The same arguments as `SelfAttention`, plus `positions`."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        h = config.hidden_size
        self.query, self.key, self.value, self.out = (nn.Linear(h, h) for _ in range(4))
        self.c2p, self.p2c = "c2p" in config.pos_att_type, "p2c" in config.pos_att_type
        # Every term counts in the scale whether or not relative_attention is on, as in transformers.
        self.scale = math.sqrt(self.head_dim * (1 + self.c2p + self.p2c))
        separate = config.relative_attention and not config.share_att_key
        self.pos_key = nn.Linear(h, h) if separate and self.c2p else None
        self.pos_query = nn.Linear(h, h) if separate and self.p2c else None
        self.position_dropout = Dropout(config.hidden_dropout_prob)
        self.dropout_p = config.attention_probs_dropout_prob

    def heads(self, t: torch.Tensor) -> torch.Tensor:
        """float [..., L, H] -> [..., nh, L, hd]."""
        return t.view(*t.shape[:-1], self.num_heads, self.head_dim).transpose(-3, -2)

    def table_projections(self, table: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The distance table float [2k, H] -> its query projection (for p2c) and key projection (for c2p),
        each float [2k, H], or None for a term the config leaves out."""
        table = self.position_dropout(table)
        pos_query = (self.query if self.pos_query is None else self.pos_query)(table) if self.p2c else None
        pos_key = (self.key if self.pos_key is None else self.pos_key)(table) if self.c2p else None
        return pos_query, pos_key

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               positions: RelativePositions | None, projections: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention itself, on rows of whole sequences.

        q, k, v: float [B, T, H]; mask: bool [B, 1, 1|T, T] or None; projections: `table_projections`'
        pair. Returns the context float [B, T, H] and the probabilities [B, nh, T, T].
        """
        B, T, H = q.shape
        q, k, v = self.heads(q), self.heads(k), self.heads(v)
        q = q / self.scale  # divided once here, not in each of three [B, nh, T, T] score terms
        scores = q @ k.transpose(-1, -2)  # (B, nh, T, T)
        if positions is not None:
            pos_query, pos_key = projections
            index = positions.index.expand(B, self.num_heads, T, T)
            if self.c2p:  # each query against every distance, then the distance to each key picked
                by_distance = q @ self.heads(pos_key).transpose(-1, -2)  # (B, nh, T, 2k)
                scores.add_(torch.gather(by_distance, -1, index))
            if self.p2c:  # every distance against each key, then the distance from each query picked
                pos_query = self.heads(pos_query)
                by_distance = (pos_query / self.scale) @ k.transpose(-1, -2)  # (B, nh, 2k, T)
                scores.add_(torch.gather(by_distance, -2, index))
        if mask is not None:
            # The float minimum, not -inf, as transformers: a padding row of the masked path stays finite.
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = scores.softmax(dim=-1)
        context = dropout(probs, self.dropout_p, self.training) @ v  # (B, nh, T, hd)
        return context.transpose(1, 2).reshape(B, T, H), probs

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, output_attentions: bool = False,
                packed: Packing | None = None,
                positions: RelativePositions | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: float [B, T, H], or [N, H] with `packed`; mask: bool [B, 1, 1|T, T] or None.
        Returns the projected context, shaped like x, and the probabilities [B, nh, T, T] when asked."""
        q, k, v = self.query(x), self.key(x), self.value(x)
        projections = self.table_projections(positions.table) if positions is not None else (None, None)
        attend = native_attention(self, (q, k, v, *projections)) if not output_attentions else None
        if attend is not None and (packed is not None or mask is None):
            # Inference on CPU: the native kernel, straight on the real tokens (no [B, nh, T, T] tensors).
            (q, k, v), cu_seqlens = varlen((q, k, v), packed)
            rows = positions.rows if positions is not None else torch.zeros(1, dtype=torch.long)
            context = attend(q, k, v, cu_seqlens, self.num_heads, projections[1], projections[0], rows, 1.0 / self.scale)
            return self.out(context.view(x.shape)), None
        if packed is not None:
            q, k, v = to_sequences(q, packed), to_sequences(k, packed), to_sequences(v, packed)
            mask = packed.key_mask
        context, probs = self.attend(q, k, v, mask, positions, projections)
        if packed is not None:
            context = from_sequences(context, packed)
        return self.out(context), probs if output_attentions else None


def native_attention(module: DisentangledAttention, tensors: tuple) -> Callable[..., torch.Tensor] | None:
    """The native disentangled attention op (`kernels/disentangled_attention.cpp`) when it can take this
    call, else None: inference (nothing needs a gradient, no attention dropout) in eager mode on CPU,
    q, k, v and the table's projections (None where a term is off) all float32 or all bf16."""
    given = [t for t in tensors if t is not None]
    dtype = given[0].dtype
    if (torch.compiler.is_compiling() or torch.jit.is_tracing() or (module.training and module.dropout_p > 0.0)
            or dtype not in (torch.float32, torch.bfloat16)
            or any(t.requires_grad or t.device.type != "cpu" or t.dtype != dtype for t in given)):
        return None
    return kernels.disentangled_attention()


class DebertaEmbeddings(nn.Module):
    """Word (+ absolute position) (+ segment) lookups, E wide, projected to H without a bias when E != H,
    then LayerNorm and dropout (point 2)."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        E, H = config.embedding_width, config.hidden_size
        self.word = TiedEmbedding(config.vocab_size, E, padding_idx=config.pad_token_id)
        self.position = nn.Embedding(config.max_position_embeddings, E) if config.position_biased_input else None
        self.segment = nn.Embedding(config.type_vocab_size, E) if config.type_vocab_size else None
        self.project = nn.Linear(E, H, bias=False) if E != H else None
        self.norm = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                position_ids: torch.Tensor) -> torch.Tensor:
        """long [B, T] each (or [N] unpadded) -> float [..., H]."""
        x = self.word(input_ids)
        if self.position is not None:
            x = x + self.position(position_ids)
        if self.segment is not None:
            x = x + self.segment(token_type_ids)
        if self.project is not None:
            x = self.project(x)
        return self.dropout(self.norm(x))


class Convolution(nn.Module):
    """Point 3: LN(layer-0 output + act(conv1d(embeddings))), zero at padding, over each sequence."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        H, k = config.hidden_size, config.conv_kernel_size
        self.conv = nn.Conv1d(H, H, k, padding=(k - 1) // 2, groups=config.conv_groups)
        self.act = activation(config.conv_act)
        self.norm = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, embedded: torch.Tensor, residual: torch.Tensor, real: torch.Tensor | None) -> torch.Tensor:
        """embedded, residual: float [B, T, H] (zeros at padding); real: bool [B, T] or None -> float [B, T, H]."""
        out = self.conv(embedded.transpose(1, 2)).transpose(1, 2)
        if real is not None:
            out = out.masked_fill(~real[..., None], 0.0)
        out = self.norm(residual + self.act(self.dropout(out)))
        return out * real[..., None] if real is not None else out


class ContextPooler(nn.Module):
    """DeBERTa's `pooler_output`: dropout -> dense -> `pooler_hidden_act` on the first token's state."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        self.dropout = Dropout(config.pooler_dropout)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.pooler_hidden_act)

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        """float [S, H] -> float [S, H]."""
        return self.act(self.dense(self.dropout(first)))


class DebertaV2Model(BertModel):
    """The DeBERTa-v2/v3 encoder: its embeddings, BERT's post-LN blocks around disentangled attention,
    one shared table of distance embeddings and the optional convolution. No pooler unless a
    sentence classifier asks for its `ContextPooler`."""

    model_type = "deberta-v2"
    hf_architecture = "DebertaV2Model"
    pads_like_transformers = False  # transformers' DeBERTa zeroes padding embeddings and masks padding queries

    def __init__(self, config: DebertaV2Config, add_pooling_layer: bool = False) -> None:
        super().__init__(config, add_pooling_layer=add_pooling_layer)
        if config.relative_attention:
            self.rel_embeddings = nn.Embedding(2 * config.relative_span, config.hidden_size)
        # The distance table's LayerNorm exists whenever the config names it, as in transformers, even where no
        # table is built (relative_attention off): unused then, but part of the checkpoint, so a directory saved
        # here loads there without missing keys (and one saved there keeps its tensor here).
        norms = [x.strip() for x in config.norm_rel_ebd.lower().split("|")]
        self.rel_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if "layer_norm" in norms else None
        self.conv = Convolution(config) if config.conv_kernel_size else None
        self.init_weights()

    def build_embeddings(self, config: DebertaV2Config) -> nn.Module:
        return DebertaEmbeddings(config)

    def build_pooler(self, config: DebertaV2Config) -> nn.Module:
        return ContextPooler(config)

    def projects(self, config: DebertaV2Config) -> bool:
        return False  # the embeddings project before their LayerNorm

    def build_layers(self, config: DebertaV2Config) -> nn.ModuleList:
        return nn.ModuleList(BertLayer(config, DisentangledAttention(config)) for _ in range(config.num_hidden_layers))

    def relative_positions(self, T: int, device: torch.device) -> RelativePositions | None:
        """The distance table and its indices for rows of T tokens, or None without relative attention."""
        c = self.config
        if not c.relative_attention:
            return None
        distance = torch.arange(1 - T, T, device=device)  # (2T - 1,): every i - j of rows of T tokens
        if c.position_buckets > 0:
            distance = log_buckets(distance, c.position_buckets, c.max_distance)
        k = c.relative_span
        rows = (distance + k).clamp(0, 2 * k - 1)
        table = self.rel_embeddings.weight
        if not torch.compiler.is_compiling():
            # Rows of T tokens use only the distances -(T-1)..T-1: a contiguous slice of the 2k-row table
            # (49 of DeBERTa-v3's 512 rows for a 25-token sentence). Every layer projects the table twice
            # and scores each query against every row, so the slice saves that work 12 times over; the
            # numbers are the same, row by row. (An export keeps the whole table: no data-dependent shapes.)
            lo, hi = int(rows[0]), int(rows[-1])  # the buckets grow with the distance
            table, rows = table[lo:hi + 1], rows - lo
        if self.rel_norm is not None:
            table = self.rel_norm(table)
        i = torch.arange(T, device=device)
        return RelativePositions(table, rows, rows[i[:, None] - i[None, :] + (T - 1)])

    def encode(self, x: torch.Tensor, mask: torch.Tensor | None, packed: Packing | None,
               output_attentions: bool, position_ids: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        T = packed.max_seqlen if packed is not None else x.shape[-2]
        positions = self.relative_positions(T, x.device)
        embedded = x
        for i, layer in enumerate(self.blocks()):
            x, probs = layer(x, mask, output_attentions, packed, positions=positions)
            if i == 0 and self.conv is not None:
                x = self.convolve(embedded, x, mask, packed)
            yield x, probs

    def convolve(self, embedded: torch.Tensor, residual: torch.Tensor, mask: torch.Tensor | None,
                 packed: Packing | None) -> torch.Tensor:
        """Point 3 on any of the three layouts: per sequence, with padding zero on both sides."""
        if packed is not None:  # one row per sequence, zeros after its end
            real = packed.key_mask[:, 0, 0] if packed.key_mask is not None else None
            out = self.conv(to_sequences(embedded, packed), to_sequences(residual, packed), real)
            return from_sequences(out, packed)
        real = mask.any(dim=2)[:, 0] if mask is not None else None  # (B, T) from [B, 1, 1|T, T]
        if real is not None:
            embedded = embedded * real[..., None]  # transformers zeroes the padding's embeddings
        return self.conv(embedded, residual, real)


class DebertaHead:
    """What every DeBERTa head says of its family: its model_type, and its backbone and that backbone's name."""

    model_type, base_model_prefix, backbone_class = "deberta-v2", "deberta", DebertaV2Model


# bertforge module -> transformers module: the backbone, then the heads (point 4).
HF_NAMES = NameTable(
    backbone=(
        ("embeddings.word", "embeddings.word_embeddings"),
        ("embeddings.position", "embeddings.position_embeddings"),
        ("embeddings.segment", "embeddings.token_type_embeddings"),
        ("embeddings.project", "embeddings.embed_proj"),
        ("embeddings.norm", "embeddings.LayerNorm"),
        ("layers.{i}.attention.query", "encoder.layer.{i}.attention.self.query_proj"),
        ("layers.{i}.attention.key", "encoder.layer.{i}.attention.self.key_proj"),
        ("layers.{i}.attention.value", "encoder.layer.{i}.attention.self.value_proj"),
        ("layers.{i}.attention.pos_key", "encoder.layer.{i}.attention.self.pos_key_proj"),
        ("layers.{i}.attention.pos_query", "encoder.layer.{i}.attention.self.pos_query_proj"),
        ("layers.{i}.attention.out", "encoder.layer.{i}.attention.output.dense"),
        ("layers.{i}.attention_norm", "encoder.layer.{i}.attention.output.LayerNorm"),
        ("layers.{i}.ffn.up", "encoder.layer.{i}.intermediate.dense"),
        ("layers.{i}.ffn.down", "encoder.layer.{i}.output.dense"),
        ("layers.{i}.ffn_norm", "encoder.layer.{i}.output.LayerNorm"),
        ("rel_embeddings", "encoder.rel_embeddings"),
        ("rel_norm", "encoder.LayerNorm"),
        ("conv.conv", "encoder.conv.conv"),
        ("conv.norm", "encoder.conv.LayerNorm"),
    ),
    heads=(
        ("mlm.transform.dense", "cls.predictions.transform.dense"),
        ("mlm.transform.norm", "cls.predictions.transform.LayerNorm"),
        ("mlm.bias", "cls.predictions.bias"),
        ("mlm.decoder", "cls.predictions.decoder"),  # only with tie_word_embeddings: false
        ("deberta.pooler.dense", "pooler.dense"),
        ("classifier", "classifier"),
        ("qa_outputs", "qa_outputs"),
    ),
    prefix="deberta",
    derived=r"(^|\.)embeddings\.position_ids$|^cls\.predictions\.decoder\.bias$",
    tied_decoder="cls.predictions.decoder.weight",
)
# The masked-LM head when `legacy` is false (point 4): transformers' own names, the decoder always tied.
CURRENT_LM_NAMES = dataclasses.replace(HF_NAMES, heads=(
    ("mlm.transform.dense", "lm_predictions.lm_head.dense"),
    ("mlm.transform.norm", "lm_predictions.lm_head.LayerNorm"),
    ("mlm.bias", "lm_predictions.lm_head.bias"),
) + HF_NAMES.heads[4:], tied_decoder="lm_predictions.lm_head.decoder.weight")


class DebertaV2ForMaskedLM(DebertaHead, BertForMaskedLM):
    """BERT's masked-LM head on DeBERTa (its transform follows `hidden_act`), named by `legacy` (point 4)."""

    hf_architecture = "DebertaV2ForMaskedLM"

    def __init__(self, config: DebertaV2Config) -> None:
        if not config.legacy and not config.tie_word_embeddings:
            # transformers' current head multiplies by the word embeddings whatever tie_word_embeddings says
            config = dataclasses.replace(config, tie_word_embeddings=True)
        super().__init__(config)

    def checkpoint_names(self, table: NameTable) -> NameTable:
        return table if self.config.legacy else CURRENT_LM_NAMES


class DebertaV2ForSequenceClassification(DebertaHead, BertForSequenceClassification):
    """`pooler` (the ContextPooler) -> dropout(`cls_dropout`, else hidden_dropout_prob) -> `classifier`."""

    hf_architecture = "DebertaV2ForSequenceClassification"
    flat_regression_logits = True
    records_problem_type = False


class DebertaV2ForTokenClassification(DebertaHead, BertForTokenClassification):
    """A tagger whose dropout is `hidden_dropout_prob`, as transformers' (`cls_dropout` is the classifier's)."""

    hf_architecture = "DebertaV2ForTokenClassification"

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__(config)
        self.dropout = Dropout(config.hidden_dropout_prob)


class DebertaV2ForQuestionAnswering(DebertaHead, BertForQuestionAnswering):
    hf_architecture = "DebertaV2ForQuestionAnswering"
