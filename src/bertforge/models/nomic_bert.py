"""NomicBERT (Nussbaum et al., 2024: nomic-embed-text-v1 and v1.5): GTE's block without biases, SwiGLU, base 1,000.

What differs from BERT, and what a checkpoint reader must know (GTE's module says the rest):
1. Positions are rotary (`rope_parameters.rope_theta`, transformers' default 1,000; older files `rope_theta`); no
   position table. Two segment rows, as BERT's.
2. No biases in the attention projections or the feed-forward; the LayerNorms keep theirs.
3. The feed-forward is SwiGLU by default (`hidden_act: silu`): down(act(gate(x)) * up(x)), no dropout inside.
4. Post-LN blocks as BERT's and GTE's.
5. Heads are BERT's: `cls.predictions` (dense -> `hidden_act` -> LayerNorm, here named `layer_norm`, -> the tied
   decoder and its bias), the sentence classifier on the pooler, the tagger; no question-answering head. The bare
   model has no pooler.
6. transformers 5 writes the original layout: `emb_ln`, `encoder.layers.{i}.attn.Wqkv` (one [3H, H] matrix),
   `attn.out_proj`, `mlp.fc11` (up), `mlp.fc12` (gate), `mlp.fc2` (down), `norm1`, `norm2`. bertforge reads it and
   the runtime names, and writes what transformers writes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..errors import ConfigError
from .base import NameTable
from .gte import HF_NAMES as GTE_NAMES
from .gte import GteConfig, GteModel, split_rows
from .heads import BertForMaskedLM, BertForSequenceClassification, BertForTokenClassification


@dataclass
class NomicBertConfig(GteConfig):
    """transformers' NomicBertConfig (nomic-embed-text-v1.5's defaults): GTE's fields with its own defaults and
    `head_dim`, which must be hidden_size / num_attention_heads."""

    model_type = "nomic_bert"
    segments = True
    default_theta: ClassVar[float] = 1000.0
    vocab_size: int = 30528
    hidden_act: str = "silu"
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    max_position_embeddings: int = 2048
    type_vocab_size: int = 2
    pad_token_id: int | None = 0

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> NomicBertConfig:
        if isinstance(data, dict) and data.get("head_dim") is not None:
            data = dict(data)
            head_dim = data.pop("head_dim")
            heads, hidden = data.get("num_attention_heads", cls.num_attention_heads), data.get("hidden_size",
                                                                                               cls.hidden_size)
            if not isinstance(heads, int) or heads < 1 or head_dim != hidden // heads:
                raise ConfigError(f"{source}: key 'head_dim' is {head_dim!r}; bertforge computes heads of "
                                  "hidden_size / num_attention_heads only")
        return super().from_dict(data, source)

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "head_dim": self.head_dim}


class NomicBertModel(GteModel):
    """GTE's encoder without the projections' biases (point 2) and no dropout inside the feed-forward (point 3)."""

    model_type = "nomic_bert"
    hf_architecture = "NomicBertModel"
    attention_bias = False
    down_bias = False

    def ffn_dropout(self, config: NomicBertConfig) -> float:
        return 0.0


class NomicHead:
    model_type, base_model_prefix, backbone_class = "nomic_bert", "nomic_bert", NomicBertModel


class NomicBertForMaskedLM(NomicHead, BertForMaskedLM):
    """BERT's masked-LM head (point 5): the transform's activation is `hidden_act`."""

    hf_architecture = "NomicBertForMaskedLM"


class NomicBertForSequenceClassification(NomicHead, BertForSequenceClassification):
    hf_architecture = "NomicBertForSequenceClassification"


class NomicBertForTokenClassification(NomicHead, BertForTokenClassification):
    hf_architecture = "NomicBertForTokenClassification"


# The layout transformers writes (point 6) <-> its runtime names, one layer's part at a time.
_WRITTEN = (("emb_ln.", "embeddings.LayerNorm."), ("encoder.layers.", "layers."), ("attn.out_proj.", "self_attn.o_proj."),
            ("mlp.fc11.", "mlp.up_proj."), ("mlp.fc12.", "mlp.gate_proj."), ("mlp.fc2.", "mlp.down_proj."),
            ("norm1.", "post_attention_layernorm."), ("norm2.", "post_mlp_layernorm."))


def _swap(key: str, pairs: tuple[tuple[str, str], ...]) -> str:
    for old, new in pairs:
        key = re.sub(rf"(^|\.){re.escape(old)}", rf"\g<1>{new}", key)
    return key


def from_original(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' written layout (point 6) under its runtime names; the runtime layout unchanged."""
    if not any(".Wqkv." in k or re.search(r"(^|\.)emb_ln\.", k) for k in state):
        return state
    out = {_swap(k, _WRITTEN): v for k, v in state.items()}
    for key in [k for k in out if ".attn.Wqkv." in k]:
        stem, kind = key.split(".attn.Wqkv.")
        split_rows(out, key, tuple(f"{stem}.self_attn.{p}_proj.{kind}" for p in "qkv"))
    return out


def to_original(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The runtime names -> the layout transformers writes: the inverse of `from_original`."""
    out = {_swap(k, tuple((new, old) for old, new in _WRITTEN)): v for k, v in state.items()}
    for key in [k for k in out if ".self_attn.q_proj." in k]:
        stem, kind = key.split(".self_attn.q_proj.")
        out[f"{stem}.attn.Wqkv.{kind}"] = torch.cat([out.pop(f"{stem}.self_attn.{p}_proj.{kind}") for p in "qkv"])
    return out


# The runtime names are GTE's for the backbone (point 6 says what is written), BERT's for the heads.
HF_NAMES = NameTable(
    backbone=GTE_NAMES.backbone,
    heads=(
        ("mlm.transform.dense", "cls.predictions.transform.dense"),
        ("mlm.transform.norm", "cls.predictions.transform.layer_norm"),
        ("mlm.bias", "cls.predictions.bias"),
        ("mlm.decoder", "cls.predictions.decoder"),  # only with tie_word_embeddings: false
        ("classifier", "classifier"),
    ),
    prefix="nomic_bert",
    derived=r"(^|\.)rotary_emb\.(original_)?inv_freq$|^cls\.predictions\.decoder\.bias$",
    tied_decoder="cls.predictions.decoder.weight",
    original=from_original,
    written=to_original,
)
