"""DistilBERT: BERT's encoder with half the layers, distilled from BERT (Sanh et al., 2019).

The network is BERT's post-LN block, repeated `n_layers` times, so this file composes BERT's
layers. How it differs from BERT, and what a checkpoint reader must know:
1. No segment embeddings and no pooler: token_type_ids are accepted and ignored; the sentence
   classifier reads the first token's state.
2. Optional fixed sinusoidal position embeddings (`sinusoidal_pos_embds`), as in the Transformer
   paper: a new model builds them and never trains them; a checkpoint's stored table is used as is.
3. Its own config names (`dim`, `n_layers`, `n_heads`, `hidden_dim`, `dropout`,
   `attention_dropout`, `activation`), read and written as transformers names them; every
   LayerNorm uses eps 1e-12 whatever the config says.
4. Its own head layouts: the masked-LM head is `vocab_transform -> activation -> vocab_layer_norm
   -> vocab_projector` (BERT's, renamed, with `activation` from the config); the sentence classifier
   is `pre_classifier -> ReLU -> dropout(seq_classif_dropout) -> classifier`; QA has a dropout
   (`qa_dropout`) before `qa_outputs`, which BERT's has not.
"""

from __future__ import annotations

from dataclasses import dataclass
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from .base import NameTable
from .bert import BertModel
from .config import RenamedConfig
from .layers import Dropout
from .heads import (BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification,
                    BertForTokenClassification, HeadModel)

@dataclass
class DistilBertConfig(RenamedConfig):
    """transformers' DistilBertConfig, computed with BertConfig's field names (see `renamed`)."""

    model_type = "distilbert"
    segments = False
    renamed = {"dim": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
               "hidden_dim": "intermediate_size", "dropout": "hidden_dropout_prob",
               "attention_dropout": "attention_probs_dropout_prob", "activation": "hidden_act"}
    aliases = {"hidden_size": "dim", "num_attention_heads": "n_heads", "num_hidden_layers": "n_layers"}
    absent = ("type_vocab_size", "layer_norm_eps", "classifier_dropout", "position_embedding_type")
    num_hidden_layers: int = 6
    type_vocab_size: int = 0
    # Its extra fields, as transformers names them.
    sinusoidal_pos_embds: bool = False
    qa_dropout: float = 0.1
    seq_classif_dropout: float = 0.2

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.type_vocab_size != 0 or self.layer_norm_eps != 1e-12:
            raise ConfigError("DistilBERT has no segment embeddings and uses LayerNorm eps 1e-12")
        if not isinstance(self.sinusoidal_pos_embds, bool):
            raise ConfigError(f"config key 'sinusoidal_pos_embds' must be true or false, got {self.sinusoidal_pos_embds!r}")
        for name in ("qa_dropout", "seq_classif_dropout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1:
                raise ConfigError(f"config key '{name}' must be in [0, 1), got {value!r}")


def sinusoidal_table(positions: int, width: int) -> torch.Tensor:
    """float [positions, width]: sin(p / 10000^(2i/width)) in even columns, cos in odd ones (Vaswani et al.)."""
    p = torch.arange(positions, dtype=torch.float64)[:, None]
    j = torch.arange(width, dtype=torch.float64)[None, :]
    angle = p / torch.pow(10000.0, 2 * torch.div(j, 2, rounding_mode="floor") / width)
    table = torch.where(j.long() % 2 == 0, torch.sin(angle), torch.cos(angle))
    return table.float()


class DistilBertModel(BertModel):
    """BERT's encoder without segments or pooler, with optionally fixed sinusoidal positions (points 1-2)."""

    model_type = "distilbert"
    hf_architecture = "DistilBertModel"

    def __init__(self, config: DistilBertConfig, add_pooling_layer: bool = False) -> None:
        super().__init__(config, add_pooling_layer=False)
        if config.sinusoidal_pos_embds:
            with torch.no_grad():
                self.embeddings.position.weight.copy_(sinusoidal_table(*self.embeddings.position.weight.shape))
            self.embeddings.position.weight.requires_grad = False


class DistilBertHead:
    """What every DistilBERT head says of its family: its model_type, and its backbone and that backbone's name."""

    model_type, base_model_prefix, backbone_class = "distilbert", "distilbert", DistilBertModel


class DistilBertForMaskedLM(DistilBertHead, BertForMaskedLM):
    hf_architecture = "DistilBertForMaskedLM"


class DistilBertForSequenceClassification(DistilBertHead, BertForSequenceClassification):
    """`pre_classifier -> ReLU -> dropout -> classifier` on the first token's state (point 4)."""

    hf_architecture = "DistilBertForSequenceClassification"

    def __init__(self, config: DistilBertConfig) -> None:
        HeadModel.__init__(self)
        self.config = config
        self._add_backbone(config, add_pooling_layer=False)
        self.pre_classifier = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = Dropout(config.seq_classif_dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def scores(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
               attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None,
               output_attentions: bool, output_hidden_states: bool):
        """(logits float [B, num_labels], encoder output)."""
        out = self.backbone(input_ids, token_type_ids, attention_mask, position_ids,
                            output_attentions=output_attentions, output_hidden_states=output_hidden_states)
        first = F.relu(self.pre_classifier(out.last_hidden_state[:, 0]))
        return self.classifier(self.dropout(first)), out


class DistilBertForTokenClassification(DistilBertHead, BertForTokenClassification):
    hf_architecture = "DistilBertForTokenClassification"


class DistilBertForQuestionAnswering(DistilBertHead, BertForQuestionAnswering):
    """BERT's span head with DistilBERT's dropout (`qa_dropout`) in front of it."""

    hf_architecture = "DistilBertForQuestionAnswering"

    def __init__(self, config: DistilBertConfig) -> None:
        super().__init__(config)
        self.dropout = Dropout(config.qa_dropout)


_LAYER = "transformer.layer.{i}."
HF_NAMES = NameTable(
    backbone=(
        ("embeddings.word", "embeddings.word_embeddings"),
        ("embeddings.position", "embeddings.position_embeddings"),
        ("embeddings.norm", "embeddings.LayerNorm"),
        ("layers.{i}.attention.query", _LAYER + "attention.q_lin"),
        ("layers.{i}.attention.key", _LAYER + "attention.k_lin"),
        ("layers.{i}.attention.value", _LAYER + "attention.v_lin"),
        ("layers.{i}.attention.out", _LAYER + "attention.out_lin"),
        ("layers.{i}.attention_norm", _LAYER + "sa_layer_norm"),
        ("layers.{i}.ffn.up", _LAYER + "ffn.lin1"),
        ("layers.{i}.ffn.down", _LAYER + "ffn.lin2"),
        ("layers.{i}.ffn_norm", _LAYER + "output_layer_norm"),
    ),
    heads=(
        ("mlm.transform.dense", "vocab_transform"),
        ("mlm.transform.norm", "vocab_layer_norm"),
        ("mlm.bias", "vocab_projector.bias"),
        ("mlm.decoder", "vocab_projector"),  # only with tie_word_embeddings: false
        ("pre_classifier", "pre_classifier"),
        ("classifier", "classifier"),
        ("qa_outputs", "qa_outputs"),
    ),
    prefix="distilbert",
    derived=r"(^|\.)embeddings\.position_ids$",
    tied_decoder="vocab_projector.weight",
)
