"""GTE v1.5 (Alibaba's "new" architecture, Zhang et al., 2024): BERT's post-LN encoder with rotary positions and a
gated feed-forward, for long inputs (gte-base-en-v1.5, gte-multilingual-base and the embedders built on them).

What differs from BERT, and what a checkpoint reader must know:
1. Positions are rotary (RoPE) on the queries and keys of every layer, base `rope_parameters.rope_theta`
   (transformers' default 160,000; older files say `rope_theta` at the top level); there is no position table.
   Rotary variants other than the default (`rope_type` linear, ntk, yarn, ...) are refused by name.
2. Segments are optional: `type_vocab_size: 0` (gte-base-en-v1.5) has no token-type table and ignores
   token_type_ids; the multilingual checkpoints have one row.
3. The feed-forward is gated: down(dropout(act(gate(x)) * up(x))), gate and up without bias, down with one;
   the dropout inside is `hidden_dropout_prob`, as after each residual branch.
4. The blocks are BERT's post-LN ones otherwise: x = LN(x + Attn(x)); x = LN(x + FFN(x)), the four attention
   projections with biases.
5. Heads: the masked-LM head (dense -> exact GELU -> LayerNorm -> the tied decoder, its bias inside the decoder,
   `lm_head.decoder.bias`), the sentence classifier on BERT's pooler (`pooler.dense`, tanh), the tagger. The bare
   model has no pooler (transformers' `add_pooling_layer=False`); transformers has no question-answering head.
6. Checkpoints: transformers 5 runs `gte.layers.{i}.self_attn.q_proj`, ... but reads and writes the original
   (remote-code) layout: `encoder.layer.{i}.attention.qkv_proj` (one [3H, H] matrix), `mlp.up_gate_proj` (up then
   gate, one [2I, H] matrix), `attn_ln`, `mlp_ln`, `lm_head.norm`, under `gte.` (the Hub's original files: `new.`).
   bertforge reads all three prefixes and both layouts (`from_original`) and writes transformers' (`to_original`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from ..errors import ConfigError
from .base import NameTable
from .bert import BertModel
from .config import BertConfig, default_rope
from .heads import BertForMaskedLM, BertForSequenceClassification, BertForTokenClassification, MaskedLMHead
from .layers import BertLayer, Embeddings, GatedFeedForward, RotarySelfAttention, rotary_tables
from .padding import Packing


def rope_theta(data: dict[str, Any], default: float, source: str) -> dict[str, Any]:
    """`rope_parameters` in transformers 5's form from either layout of a config.json (point 1), with the
    default base filled in; any rotary variant but the default, or two keys that disagree, refused by name."""
    params = data.get("rope_parameters")
    params = dict(params) if isinstance(params, dict) else params
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ConfigError(f"{source}: key 'rope_parameters' must be an object, got {params!r}")
    if "rope_theta" in data:
        old = data["rope_theta"]
        if params.setdefault("rope_theta", old) != old:
            raise ConfigError(f"{source}: keys 'rope_parameters' (rope_theta {params['rope_theta']!r}) and "
                              f"'rope_theta' ({old!r}) disagree")
    scaling = data.get("rope_scaling")
    if scaling is not None and not (isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type"))
                                    == "default" and set(scaling) <= {"rope_type", "type"}):
        raise ConfigError(f"{source}: key 'rope_scaling' is {scaling!r}; bertforge computes the default rotary "
                          "embedding only (no scaling)")
    return default_rope(params, default, f"{source}: key 'rope_parameters' gives ")


@dataclass
class GteConfig(BertConfig):
    """transformers' GteConfig (gte-multilingual-base's defaults): BERT's fields, rotary positions (point 1),
    optional segments (point 2)."""

    model_type = "gte"
    segments = False  # type_vocab_size may be 0
    default_theta: ClassVar[float] = 160_000.0
    vocab_size: int = 250048
    attention_probs_dropout_prob: float = 0.0
    max_position_embeddings: int = 8192
    type_vocab_size: int = 1
    pad_token_id: int | None = 1
    rope_parameters: dict | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> GteConfig:
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a JSON object")
        data = dict(data)
        data["rope_parameters"] = rope_theta(data, cls.default_theta, source)
        for key in ("rope_theta", "rope_scaling"):
            data.pop(key, None)
        if data.get("position_embedding_type", "rope") not in ("rope", "absolute"):
            raise ConfigError(f"{source}: key 'position_embedding_type' is {data['position_embedding_type']!r}; "
                              "GTE's positions are rotary")
        data.pop("position_embedding_type", None)  # the original files say "rope"; transformers' ignores it
        return super().from_dict(data, source)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.head_dim % 2:
            raise ConfigError(f"the head size ({self.head_dim}) must be even: rotary positions turn pairs")
        if not isinstance(self.rope_parameters, dict) or set(self.rope_parameters) != {"rope_type", "rope_theta"}:
            self.rope_parameters = rope_theta({"rope_parameters": self.rope_parameters}, self.default_theta, "config")

    def to_dict(self) -> dict[str, Any]:
        """transformers 5's layout, plus the older top-level `rope_theta` (transformers 4 and the original code)."""
        out = super().to_dict()
        out.pop("position_embedding_type", None)
        out["rope_parameters"] = dict(self.rope_parameters)
        out["rope_theta"] = self.rope_parameters["rope_theta"]
        return out


class GteModel(BertModel):
    """BERT's encoder with rotary positions (point 1), optional segments (2) and gated blocks (3, 4)."""

    model_type = "gte"
    hf_architecture = "GteModel"
    attention_bias: ClassVar[bool] = True  # NomicBERT's projections have none
    down_bias: ClassVar[bool] = True

    def __init__(self, config: GteConfig, add_pooling_layer: bool = False) -> None:
        super().__init__(config, add_pooling_layer=add_pooling_layer)

    def build_embeddings(self, config: GteConfig) -> nn.Module:
        return Embeddings(config, positions=False)

    def build_layers(self, config: GteConfig) -> nn.ModuleList:
        return nn.ModuleList(
            BertLayer(config, attention=RotarySelfAttention(config, bias=self.attention_bias),
                      ffn=GatedFeedForward(config, down_bias=self.down_bias, dropout_p=self.ffn_dropout(config)))
            for _ in range(config.num_hidden_layers))

    def ffn_dropout(self, config: GteConfig) -> float:
        """The dropout inside the gated feed-forward (point 3)."""
        return config.hidden_dropout_prob

    def encode(self, x: torch.Tensor, mask: torch.Tensor | None, packed: Packing | None,
               output_attentions: bool, position_ids: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        # (cos, sin) once per batch at each token's position, shared by the layers.
        rotary = rotary_tables(position_ids, self.config.rope_parameters["rope_theta"], self.config.head_dim)
        for layer in self.blocks():
            x, probs = layer(x, mask, output_attentions, packed, rotary=rotary)
            yield x, probs


class GteHead:
    """What every GTE head says of its family."""

    model_type, base_model_prefix, backbone_class = "gte", "gte", GteModel


class GteForMaskedLM(GteHead, BertForMaskedLM):
    """The masked-LM head (point 5): exact GELU whatever `hidden_act` says."""

    hf_architecture = "GteForMaskedLM"

    def masked_lm_head(self, config: GteConfig) -> MaskedLMHead:
        return MaskedLMHead(config, "gelu")


class GteForSequenceClassification(GteHead, BertForSequenceClassification):
    """BERT's: pooler, dropout (`classifier_dropout`, else `hidden_dropout_prob`), classifier."""

    hf_architecture = "GteForSequenceClassification"


class GteForTokenClassification(GteHead, BertForTokenClassification):
    hf_architecture = "GteForTokenClassification"


def split_rows(state: dict[str, torch.Tensor], key: str, names: tuple[str, ...]) -> None:
    """Replace the fused matrix (or bias) `key` by its equal row blocks, in order, under `names` (in place)."""
    for name, part in zip(names, state.pop(key).chunk(len(names), dim=0)):
        state[name] = part.contiguous()


def from_original(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The original checkpoints' layout (point 6) as transformers 5 names it; transformers' own layout unchanged."""
    if not any(k.startswith("new.") or ".qkv_proj." in k or ".up_gate_proj." in k for k in state):
        return state
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        key = re.sub(r"^new\.", "gte.", key)
        key = re.sub(r"(^|\.)encoder\.layer\.", r"\1layers.", key)
        key = key.replace(".attention.o_proj.", ".self_attn.o_proj.").replace(".attn_ln.", ".post_attention_layernorm.")
        key = key.replace(".mlp_ln.", ".post_mlp_layernorm.").replace("lm_head.norm.", "lm_head.layer_norm.")
        out[key] = tensor
    for key in [k for k in out if ".attention.qkv_proj." in k]:
        stem, kind = key.split(".attention.qkv_proj.")
        split_rows(out, key, tuple(f"{stem}.self_attn.{p}_proj.{kind}" for p in "qkv"))
    for key in [k for k in out if ".mlp.up_gate_proj." in k]:
        stem, kind = key.split(".mlp.up_gate_proj.")
        split_rows(out, key, (f"{stem}.mlp.up_proj.{kind}", f"{stem}.mlp.gate_proj.{kind}"))
    return out


def to_original(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers 5's runtime names -> the layout it writes (point 6): the inverse of `from_original`."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        key = re.sub(r"(^|\.)layers\.", r"\1encoder.layer.", key)
        key = key.replace(".self_attn.o_proj.", ".attention.o_proj.").replace(".post_attention_layernorm.", ".attn_ln.")
        key = key.replace(".post_mlp_layernorm.", ".mlp_ln.").replace("lm_head.layer_norm.", "lm_head.norm.")
        out[key] = tensor
    for key in [k for k in out if ".self_attn.q_proj." in k]:
        stem, kind = key.split(".self_attn.q_proj.")
        out[f"{stem}.attention.qkv_proj.{kind}"] = torch.cat([out.pop(f"{stem}.self_attn.{p}_proj.{kind}") for p in "qkv"])
    for key in [k for k in out if ".mlp.up_proj." in k]:
        stem, kind = key.split(".mlp.up_proj.")
        out[f"{stem}.mlp.up_gate_proj.{kind}"] = torch.cat([out.pop(key), out.pop(f"{stem}.mlp.gate_proj.{kind}")])
    return out


# bertforge module name -> transformers 5's runtime name (point 6).
HF_NAMES = NameTable(
    backbone=(
        ("embeddings.word", "embeddings.word_embeddings"),
        ("embeddings.segment", "embeddings.token_type_embeddings"),
        ("embeddings.norm", "embeddings.LayerNorm"),
        ("layers.{i}.attention.query", "layers.{i}.self_attn.q_proj"),
        ("layers.{i}.attention.key", "layers.{i}.self_attn.k_proj"),
        ("layers.{i}.attention.value", "layers.{i}.self_attn.v_proj"),
        ("layers.{i}.attention.out", "layers.{i}.self_attn.o_proj"),
        ("layers.{i}.attention_norm", "layers.{i}.post_attention_layernorm"),
        ("layers.{i}.ffn.gate", "layers.{i}.mlp.gate_proj"),
        ("layers.{i}.ffn.up", "layers.{i}.mlp.up_proj"),
        ("layers.{i}.ffn.down", "layers.{i}.mlp.down_proj"),
        ("layers.{i}.ffn_norm", "layers.{i}.post_mlp_layernorm"),
        ("pooler.dense", "pooler.dense"),
    ),
    heads=(
        ("mlm.transform.dense", "lm_head.dense"),
        ("mlm.transform.norm", "lm_head.layer_norm"),
        ("mlm.bias", "lm_head.decoder.bias"),  # before the decoder's row: its key would match that one too
        ("mlm.decoder", "lm_head.decoder"),  # only with tie_word_embeddings: false
        ("classifier", "classifier"),
    ),
    prefix="gte",
    derived=r"(^|\.)rotary_emb\.(original_)?inv_freq$",  # computed, never stored by transformers 5
    tied_decoder="lm_head.decoder.weight",
    original=from_original,
    written=to_original,
)
