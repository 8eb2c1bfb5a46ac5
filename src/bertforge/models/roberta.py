"""RoBERTa and XLM-RoBERTa: BERT's encoder, trained differently, with three differences of layout.

Liu et al. (2019) kept BERT's network and changed how it is trained (more data, longer, bigger
batches, dynamic masking, no next-sentence prediction, byte-level BPE). What a checkpoint
reader must know is therefore small, and it is all here:
1. Position ids start after the padding id: token t of a row sits at `pad_token_id + 1 + t`
   (fairseq's convention), and a padding token sits at `pad_token_id`. So a 512-token model has
   `max_position_embeddings: 514`, and the position table's padding row is never trained.
2. One segment: `type_vocab_size` is 1 in the published checkpoints, and the tokenizer sends no
   token_type_ids. Pairs are `<s> A </s></s> B </s>` instead.
3. The heads have their own layout: the masked-LM head is `lm_head` (dense -> exact GELU ->
   LayerNorm -> tied decoder), whatever `hidden_act` says; the sentence classifier reads the `<s>`
   token's state through its own `dense -> tanh -> out_proj` (there is no pooler in front of it).
XLM-RoBERTa (Conneau et al., 2020) is the same network with a 250k SentencePiece vocabulary;
only its names differ. CamemBERT (Martin et al., 2020) is RoBERTa's network under its own model_type, with a
SentencePiece vocabulary numbered as fairseq numbers it (its tokenizer, `tokenization/unigram.py`, differs from XLM-R's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .base import NameTable
from .bert import HF_NAMES as BERT_NAMES
from .bert import BertModel
from .config import BertConfig
from .heads import (BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification,
                    BertForTokenClassification, ClassificationHead)


@dataclass
class RobertaConfig(BertConfig):
    """transformers' RobertaConfig: BERT's fields, with RoBERTa's vocabulary and padding id as defaults."""

    model_type = "roberta"
    vocab_size: int = 50265
    pad_token_id: int | None = 1

    @property
    def position_offset(self) -> int:
        return self.pad_token_id + 1

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "RobertaConfig":
        """A preset size as the published RoBERTa models are shaped: 512 positions after the padding id's
        (max_position_embeddings 514 with pad_token_id 1) and one segment."""
        pad = overrides.get("pad_token_id", cls.pad_token_id)
        return super().from_preset(name, **{"max_position_embeddings": 512 + pad + 1, "type_vocab_size": 1,
                                            **overrides})


@dataclass
class XLMRobertaConfig(RobertaConfig):
    """transformers' XLMRobertaConfig: the same fields and defaults as BERT's, but the padding id 1."""

    model_type = "xlm-roberta"
    vocab_size: int = 30522


@dataclass
class CamembertConfig(RobertaConfig):
    """transformers' CamembertConfig: BERT's fields and defaults, with the padding id 1, as XLM-R's."""

    model_type = "camembert"
    vocab_size: int = 30522


class RobertaModel(BertModel):
    """BERT's encoder with positions counted from `pad_token_id + 1` (see point 1 above)."""

    model_type = "roberta"
    hf_architecture = "RobertaModel"
    pads_positions = True

    def default_position_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """long [B, T] -> long [B, T]: each non-padding token's place in its row, plus the offset;
        padding tokens get `pad_token_id` (fairseq's make_positions, as transformers computes them)."""
        real = input_ids.ne(self.config.pad_token_id).long()
        return torch.cumsum(real, dim=1) * real + self.config.pad_token_id


class RobertaHead:
    """What every RoBERTa head says of its family: its model_type, and its backbone and that backbone's name."""

    model_type, base_model_prefix, backbone_class = "roberta", "roberta", RobertaModel


class RobertaForMaskedLM(RobertaHead, BertForMaskedLM):
    """The masked-LM head of RoBERTa (its pretraining model): exact GELU whatever `hidden_act` says."""

    hf_architecture = "RobertaForMaskedLM"
    mlm_activation = "gelu"


class RobertaForSequenceClassification(RobertaHead, BertForSequenceClassification):
    """RoBERTa's classifier (or regressor): its own head on the `<s>` state, no pooler."""

    hf_architecture = "RobertaForSequenceClassification"

    def __init__(self, config: RobertaConfig) -> None:
        super().__init__(config, head=ClassificationHead(config, nn.Tanh()))


class RobertaForTokenClassification(RobertaHead, BertForTokenClassification):
    hf_architecture = "RobertaForTokenClassification"


class RobertaForQuestionAnswering(RobertaHead, BertForQuestionAnswering):
    hf_architecture = "RobertaForQuestionAnswering"


def heads_under(prefix: str, model_type: str, backbone: type[RobertaModel],
                base_model_prefix: str = "roberta") -> tuple[type, type, type, type]:
    """RoBERTa's four heads under another family's names (XLM-R, CamemBERT, MPNet): each is RoBERTa's class with the
    family's model_type, backbone and transformers class name, `<prefix>ForMaskedLM` ... `<prefix>ForQuestionAnswering`."""
    family = {"model_type": model_type, "backbone_class": backbone, "base_model_prefix": base_model_prefix,
              "__module__": backbone.__module__}
    return tuple(type(f"{prefix}{kind}", (head,), {**family, "hf_architecture": f"{prefix}{kind}",
                                                   "__qualname__": f"{prefix}{kind}"})
                 for kind, head in (("ForMaskedLM", RobertaForMaskedLM),
                                    ("ForSequenceClassification", RobertaForSequenceClassification),
                                    ("ForTokenClassification", RobertaForTokenClassification),
                                    ("ForQuestionAnswering", RobertaForQuestionAnswering)))


# XLM-RoBERTa and CamemBERT: the same classes under their own names (both keep RoBERTa's `roberta.` checkpoint prefix).
class XLMRobertaModel(RobertaModel):
    model_type, hf_architecture = "xlm-roberta", "XLMRobertaModel"


class CamembertModel(RobertaModel):
    model_type, hf_architecture = "camembert", "CamembertModel"


(XLMRobertaForMaskedLM, XLMRobertaForSequenceClassification, XLMRobertaForTokenClassification,
 XLMRobertaForQuestionAnswering) = heads_under("XLMRoberta", "xlm-roberta", XLMRobertaModel)
(CamembertForMaskedLM, CamembertForSequenceClassification, CamembertForTokenClassification,
 CamembertForQuestionAnswering) = heads_under("Camembert", "camembert", CamembertModel)


# bertforge module name -> transformers module name: BERT's backbone names under `roberta.`, and RoBERTa's heads.
HF_NAMES = NameTable(
    backbone=BERT_NAMES.backbone,
    heads=(
        ("mlm.transform.dense", "lm_head.dense"),
        ("mlm.transform.norm", "lm_head.layer_norm"),
        ("mlm.bias", "lm_head.bias"),
        ("mlm.decoder", "lm_head.decoder"),  # only with tie_word_embeddings: false
        ("classifier.dense", "classifier.dense"),
        ("classifier.out_proj", "classifier.out_proj"),
        ("classifier", "classifier"),
        ("qa_outputs", "qa_outputs"),
    ),
    prefix="roberta",
    derived=r"(^|\.)embeddings\.position_ids$|(^|\.)embeddings\.token_type_ids$|^lm_head\.decoder\.bias$",
    tied_decoder="lm_head.decoder.weight",
)
