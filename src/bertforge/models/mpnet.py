"""MPNet (Song et al., 2020): BERT's post-LN encoder with one relative-position bias shared by every layer.

MPNet was pretrained with permuted language modelling (XLNet's objective, with the positions of the
predicted tokens made visible); the network a checkpoint holds is BERT's, with four differences a
checkpoint reader must know:
1. Positions as RoBERTa's: token t of a row sits at `1 + 1 + t` and padding at 1 (transformers counts
   from the padding id 1 whatever `pad_token_id` says, so another padding id is refused), and no
   segment embeddings: the config has no `type_vocab_size` and the tokenizer sends no token_type_ids.
2. A relative-position bias: every layer adds to its scaled attention scores b[h, bucket(j - i)] for
   query i and key j, one table of `relative_attention_num_buckets` x heads (`encoder.relative_attention_bias`)
   shared by all layers. The distance is bucketed as T5 does: 16 buckets a direction, the first 8 exact,
   the other 8 log-spaced out to 128 tokens, farther ones in the last bucket. transformers computes 32
   buckets whatever the config says, so a table of fewer rows is refused and the rows past 32 are unused.
3. The layer names differ from BERT's (`attention.attn.q|k|v|o`, `attention.LayerNorm`); the maths does not.
4. Heads as RoBERTa's: `lm_head` (dense -> exact GELU -> LayerNorm -> tied decoder) and a sentence classifier
   on the `<s>` state (`dense -> tanh -> out_proj`, dropout `hidden_dropout_prob`, no pooler in front).
The distances are taken inside each sequence, so padding and packing change no real token.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import ConfigError
from .base import NameTable
from .config import RenamedConfig
from .padding import Packing
from .roberta import HF_NAMES as ROBERTA_NAMES
from .roberta import RobertaModel, heads_under

BUCKETS = 32  # what transformers' MPNet computes, whatever relative_attention_num_buckets says (point 2)
MAX_DISTANCE = 128


@dataclass
class MPNetConfig(RenamedConfig):
    """transformers' MPNetConfig: BERT's fields without segments, RoBERTa's ids, and the bucket count."""

    model_type = "mpnet"
    segments = False
    # BERT fields MPNet's config lacks: in a config.json they change nothing, here or in transformers.
    absent = ("type_vocab_size", "classifier_dropout", "position_embedding_type")
    vocab_size: int = 30527
    type_vocab_size: int = 0
    pad_token_id: int | None = 1
    relative_attention_num_buckets: int = 32

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.type_vocab_size != 0:
            raise ConfigError("MPNet has no segment embeddings (type_vocab_size must be 0)")
        if self.pad_token_id != 1:
            raise ConfigError(f"config key 'pad_token_id' is {self.pad_token_id!r}: transformers' MPNet counts "
                              "positions from the padding id 1 whatever this says, so only 1 is honoured")
        b = self.relative_attention_num_buckets
        if not isinstance(b, int) or isinstance(b, bool) or b < BUCKETS:
            raise ConfigError(f"config key 'relative_attention_num_buckets' is {b!r}: transformers' MPNet buckets "
                              f"distances into {BUCKETS} whatever this says, so the table needs at least {BUCKETS} rows")

    @property
    def position_offset(self) -> int:
        return self.pad_token_id + 1

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "MPNetConfig":
        """A preset size shaped as the published MPNet models: 512 positions after the padding id's (514)."""
        return super().from_preset(name, **{"max_position_embeddings": 514, **overrides})


def relative_buckets(distance: torch.Tensor) -> torch.Tensor:
    """long [...] of key - query distances -> long [...] bucket ids in [0, 32) (point 2): transformers'
    `relative_position_bucket`, operation for operation, so the bucket edges fall where its do."""
    n = -distance
    half = BUCKETS // 2
    bucket = (n < 0).long() * half  # the second half for keys after the query
    n = n.abs()
    exact = half // 2
    # (n clamped to 1 inside the log only so that n = 0, which takes the exact branch, is not log(0))
    far = exact + (torch.log(n.clamp(min=1).float() / exact) / math.log(MAX_DISTANCE / exact) * (half - exact)).long()
    return bucket + torch.where(n < exact, n, far.clamp(max=half - 1))


class MPNetModel(RobertaModel):
    """BERT's encoder with RoBERTa's positions (point 1), no segments, and the shared relative-position bias."""

    model_type = "mpnet"
    hf_architecture = "MPNetModel"

    def __init__(self, config: MPNetConfig, add_pooling_layer: bool = True) -> None:
        super().__init__(config, add_pooling_layer=add_pooling_layer)
        self.relative_attention_bias = nn.Embedding(config.relative_attention_num_buckets, config.num_attention_heads)
        self.init_weights()

    def position_bias(self, T: int, device: torch.device) -> torch.Tensor:
        """float [1, nh, T, T]: the bias every layer adds to the scores of rows of T tokens (point 2)."""
        i = torch.arange(T, device=device)
        buckets = relative_buckets(i[None, :] - i[:, None])  # (T, T): key j - query i
        return self.relative_attention_bias(buckets).permute(2, 0, 1).unsqueeze(0)

    def encode(self, x: torch.Tensor, mask: torch.Tensor | None, packed: Packing | None,
               output_attentions: bool, position_ids: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        # The attention layout's length: each sequence starts at column 0 there, so in-row distances are in-sequence.
        T = packed.max_seqlen if packed is not None else x.shape[-2]
        bias = self.position_bias(T, x.device)
        for layer in self.blocks():
            x, probs = layer(x, mask, output_attentions, packed, bias=bias)
            yield x, probs


# RoBERTa's heads (point 4) under MPNet's names and backbone, as XLM-R's are.
MPNetForMaskedLM, MPNetForSequenceClassification, MPNetForTokenClassification, MPNetForQuestionAnswering = heads_under(
    "MPNet", "mpnet", MPNetModel, base_model_prefix="mpnet")


# bertforge module name -> transformers module name (point 3), then RoBERTa's head names (point 4).
HF_NAMES = NameTable(
    backbone=(
        ("embeddings.word", "embeddings.word_embeddings"),
        ("embeddings.position", "embeddings.position_embeddings"),
        ("embeddings.norm", "embeddings.LayerNorm"),
        ("layers.{i}.attention.query", "encoder.layer.{i}.attention.attn.q"),
        ("layers.{i}.attention.key", "encoder.layer.{i}.attention.attn.k"),
        ("layers.{i}.attention.value", "encoder.layer.{i}.attention.attn.v"),
        ("layers.{i}.attention.out", "encoder.layer.{i}.attention.attn.o"),
        ("layers.{i}.attention_norm", "encoder.layer.{i}.attention.LayerNorm"),
        ("layers.{i}.ffn.up", "encoder.layer.{i}.intermediate.dense"),
        ("layers.{i}.ffn.down", "encoder.layer.{i}.output.dense"),
        ("layers.{i}.ffn_norm", "encoder.layer.{i}.output.LayerNorm"),
        ("relative_attention_bias", "encoder.relative_attention_bias"),
        ("pooler.dense", "pooler.dense"),
    ),
    heads=ROBERTA_NAMES.heads,
    prefix="mpnet",
    derived=r"(^|\.)embeddings\.position_ids$|^lm_head\.decoder\.bias$",
    tied_decoder="lm_head.decoder.weight",
)
