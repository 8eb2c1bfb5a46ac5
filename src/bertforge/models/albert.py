"""ALBERT: BERT's post-LN blocks, with factorised embeddings and layers shared across depth (Lan et al., 2020).

"A Lite BERT" keeps BERT's block and changes where the parameters are, so this file composes
BERT's layers. What a checkpoint reader must know:
1. Factorised embeddings: tokens, positions and segments are `embedding_size` (E) wide, 128 in
   every published model, and one Linear (`encoder.embedding_hidden_mapping_in`) projects them up
   to the hidden size, always, even when E equals it. The masked-LM head goes back down: its
   transform is H -> E, and the tied decoder is the [V, E] word-embedding matrix.
2. Cross-layer sharing: there are `num_hidden_groups` groups of `inner_group_num` blocks each, and
   layer i of `num_hidden_layers` runs every block of group `int(i / (num_hidden_layers /
   num_hidden_groups))`. The published models have one group of one block, run 12 (or 24) times.
   `output_hidden_states` gives one state per block run, as transformers does.
3. Sentence-order prediction instead of NSP: the pretraining model's second head (`sop_classifier`)
   reads the pooled `[CLS]` through a dropout of `classifier_dropout_prob` (the name ALBERT's config
   gives BERT's `classifier_dropout`) and returns `sop_logits`: 0 = in order, 1 = swapped.
4. Defaults differ from BERT's: `hidden_act` gelu_new (the tanh GELU), no dropout in the encoder.
   ALBERT's block applies no dropout to its feed-forward output; at inference (or with the
   published zero dropout) that is BERT's block exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import ConfigError
from .base import NameTable
from .bert import HF_NAMES as BERT_NAMES
from .bert import BertModel
from .config import BertConfig, RenamedConfig
from .heads import (BertForMaskedLM, BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification,
                    BertForTokenClassification, PreTrainingOutput)
from .layers import BertLayer, Dropout


@dataclass
class AlbertConfig(RenamedConfig):
    """transformers' AlbertConfig: BERT's fields with ALBERT's defaults, plus the factorisation and sharing."""

    model_type = "albert"
    renamed = {"classifier_dropout_prob": "classifier_dropout"}
    vocab_size: int = 30000
    hidden_size: int = 4096
    num_attention_heads: int = 64
    intermediate_size: int = 16384
    hidden_act: str = "gelu_new"
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    classifier_dropout: float | None = 0.1
    embedding_size: int = 128
    num_hidden_groups: int = 1
    inner_group_num: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_sizes("embedding_size", "num_hidden_groups", "inner_group_num")
        if self.classifier_dropout is None:  # transformers' AlbertConfig refuses null too
            raise ConfigError("config key 'classifier_dropout_prob' must be a number, got None")

    @property
    def embedding_width(self) -> int:
        return self.embedding_size


class AlbertModel(BertModel):
    """The ALBERT encoder: E-wide embeddings, a projection to H, shared blocks run `num_hidden_layers` times, pooler."""

    model_type = "albert"
    hf_architecture = "AlbertModel"

    def projects(self, config: BertConfig) -> bool:
        return True  # ALBERT has its projection even when embedding_size == hidden_size

    def build_layers(self, config: AlbertConfig) -> nn.ModuleList:
        """num_hidden_groups groups of inner_group_num blocks: `layers.{g}.{j}`."""
        return nn.ModuleList(nn.ModuleList(BertLayer(config) for _ in range(config.inner_group_num))
                             for _ in range(config.num_hidden_groups))

    def blocks(self) -> Iterator[nn.Module]:
        """Layer i runs the blocks of group int(i / (L / G)), as transformers computes it (point 2)."""
        L, G = self.config.num_hidden_layers, self.config.num_hidden_groups
        for i in range(L):
            yield from self.layers[int(i / (L / G))]


@dataclass
class AlbertPreTrainingOutput(PreTrainingOutput):
    """MLM + sentence-order prediction: `nsp_logits` holds the SOP scores, float [B, num_labels]."""

    @property
    def sop_logits(self) -> torch.Tensor | None:
        return self.nsp_logits


class SentenceOrderHead(nn.Module):
    """ALBERT's SOP classifier: dropout(classifier_dropout_prob) -> Linear(H, num_labels) on the pooled [CLS]."""

    def __init__(self, config: AlbertConfig) -> None:
        super().__init__()
        self.dropout = Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        """float [B, H] -> float [B, num_labels]."""
        return self.classifier(self.dropout(pooled))


class AlbertHead:
    """What every ALBERT head says of its family: its model_type, and its backbone and that backbone's name."""

    model_type, base_model_prefix, backbone_class = "albert", "albert", AlbertModel


class AlbertForPreTraining(AlbertHead, BertForPreTraining):
    """Masked-LM + sentence-order prediction (point 3), losses summed."""

    hf_architecture = "AlbertForPreTraining"

    def sentence_head(self, config: AlbertConfig) -> nn.Module:
        return SentenceOrderHead(config)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                sentence_order_label: torch.Tensor | None = None, output_attentions: bool = False,
                output_hidden_states: bool = False,
                position_ids: torch.Tensor | None = None) -> AlbertPreTrainingOutput:
        """labels: long [B, T] (-100 = not predicted); sentence_order_label: long [B], 0 = in order, 1 = swapped."""
        out = super().forward(input_ids, token_type_ids, attention_mask, labels, sentence_order_label,
                              output_attentions, output_hidden_states, position_ids)
        return AlbertPreTrainingOutput(**vars(out))


class AlbertForMaskedLM(AlbertHead, BertForMaskedLM):
    hf_architecture = "AlbertForMaskedLM"


class AlbertForSequenceClassification(AlbertHead, BertForSequenceClassification):
    hf_architecture = "AlbertForSequenceClassification"


class AlbertForTokenClassification(AlbertHead, BertForTokenClassification):
    hf_architecture = "AlbertForTokenClassification"


class AlbertForQuestionAnswering(AlbertHead, BertForQuestionAnswering):
    hf_architecture = "AlbertForQuestionAnswering"


_BLOCK = "encoder.albert_layer_groups.{g}.albert_layers.{j}."
# BERT's embedding names, the projection, the shared blocks by group {g} and block {j}, ALBERT's pooler and heads.
HF_NAMES = NameTable(
    backbone=tuple(pair for pair in BERT_NAMES.backbone if pair[0].startswith("embeddings.")) + (
        ("project", "encoder.embedding_hidden_mapping_in"),
        ("layers.{g}.{j}.attention.query", _BLOCK + "attention.query"),
        ("layers.{g}.{j}.attention.key", _BLOCK + "attention.key"),
        ("layers.{g}.{j}.attention.value", _BLOCK + "attention.value"),
        ("layers.{g}.{j}.attention.out", _BLOCK + "attention.dense"),
        ("layers.{g}.{j}.attention_norm", _BLOCK + "attention.LayerNorm"),
        ("layers.{g}.{j}.ffn.up", _BLOCK + "ffn"),
        ("layers.{g}.{j}.ffn.down", _BLOCK + "ffn_output"),
        ("layers.{g}.{j}.ffn_norm", _BLOCK + "full_layer_layer_norm"),
        ("pooler.dense", "pooler"),
    ),
    heads=(
        ("mlm.transform.dense", "predictions.dense"),
        ("mlm.transform.norm", "predictions.LayerNorm"),
        ("mlm.bias", "predictions.bias"),
        ("mlm.decoder", "predictions.decoder"),  # only with tie_word_embeddings: false
        ("nsp.classifier", "sop_classifier.classifier"),
        ("classifier", "classifier"),
        ("qa_outputs", "qa_outputs"),
    ),
    prefix="albert",
    derived=r"(^|\.)embeddings\.position_ids$|(^|\.)embeddings\.token_type_ids$|^predictions\.decoder\.bias$",
    tied_decoder="predictions.decoder.weight",
)
