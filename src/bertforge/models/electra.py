"""ELECTRA: BERT's encoder, pretrained as a discriminator of replaced tokens (Clark et al., 2020).

ELECTRA trains two BERT encoders together: a small masked-LM generator fills masked positions
with plausible tokens, and the discriminator, the model people fine-tune, learns to tell which
tokens were replaced. The network is BERT's, so this file composes BERT's layers. What a
checkpoint reader must know:
1. Factorised embeddings, as ALBERT's: tokens, positions and segments are `embedding_size` wide,
   projected up to the hidden size by `embeddings_project`, which exists only when the two differ.
2. No pooler: the sentence classifier reads the first token's state through its own
   `dense -> GELU -> out_proj` (RoBERTa's layout with GELU in place of tanh).
3. Two pretraining heads: the discriminator (`ElectraForPreTraining`: dense -> `hidden_act` ->
   one score per token, > 0 meaning "replaced"), and the generator (`ElectraForMaskedLM`:
   dense H -> E -> exact GELU -> LayerNorm -> the tied [V, E] decoder, `generator_lm_head`, whose
   bias is its own).
4. `summary_*` settings serve only `ElectraForMultipleChoice`, which bertforge does not build.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .base import ModelOutput, NameTable, PreTrainedModel
from .bert import HF_NAMES as BERT_NAMES
from .bert import BertModel
from .config import BertConfig
from .heads import (
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    ClassificationHead,
    HeadModel,
    HeadOutput,
)
from .layers import activation

_MULTIPLE_CHOICE = "used only by ElectraForMultipleChoice, which bertforge does not build"


@dataclass
class ElectraConfig(BertConfig):
    """transformers' ElectraConfig: BERT's fields with ELECTRA-small's sizes as defaults, plus `embedding_size`."""

    model_type = "electra"
    family_no_effect = {key: _MULTIPLE_CHOICE for key in ("summary_type", "summary_use_proj", "summary_activation",
                                                          "summary_last_dropout", "summary_first_dropout")}
    hidden_size: int = 256
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    embedding_size: int = 128

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_sizes("embedding_size")

    @property
    def embedding_width(self) -> int:
        return self.embedding_size

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "ElectraConfig":
        """A preset size with the paper's embedding width: 128 up to a hidden size of 256 (ELECTRA-small),
        the hidden size above it (ELECTRA-base and -large do not factorise)."""
        hidden = super().from_preset(name).hidden_size
        return super().from_preset(name, **{"embedding_size": 128 if hidden <= 256 else hidden, **overrides})


class ElectraModel(BertModel):
    """BERT's encoder with factorised embeddings and no pooler (points 1-2)."""

    model_type = "electra"
    hf_architecture = "ElectraModel"

    def __init__(self, config: ElectraConfig, add_pooling_layer: bool = False) -> None:
        super().__init__(config, add_pooling_layer=False)


class DiscriminatorHead(nn.Module):
    """dense -> hidden_act -> dense_prediction: one replaced-token score per position."""

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.dense_prediction = nn.Linear(config.hidden_size, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """float [B, T, H] -> float [B, T]."""
        return self.dense_prediction(self.act(self.dense(hidden))).squeeze(-1)


class ElectraHead:
    """What every ELECTRA head says of its family: its model_type, and its backbone and that backbone's name."""

    model_type, base_model_prefix, backbone_class = "electra", "electra", ElectraModel


class ElectraForPreTraining(ElectraHead, HeadModel):
    """The discriminator: is each token the original (label 0) or a replacement (label 1)? Logits float [B, T]."""

    hf_architecture = "ElectraForPreTraining"

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__()
        self.config = config
        self._add_backbone(config, add_pooling_layer=False)
        self.discriminator = DiscriminatorHead(config)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                output_attentions: bool = False, output_hidden_states: bool = False,
                position_ids: torch.Tensor | None = None) -> HeadOutput:
        """labels: [B, T], 1 where the token was replaced; the loss is binary cross-entropy over real tokens."""
        out = self.backbone(input_ids, token_type_ids, attention_mask, position_ids,
                            output_attentions=output_attentions, output_hidden_states=output_hidden_states)
        logits = self.discriminator(out.last_hidden_state)
        loss = None
        if labels is not None:
            real = attention_mask.bool() if attention_mask is not None else torch.ones_like(labels, dtype=torch.bool)
            loss = F.binary_cross_entropy_with_logits(logits.float()[real], labels[real].float())
        return HeadOutput(loss, logits, out.hidden_states, out.attentions)


class ElectraForMaskedLM(ElectraHead, BertForMaskedLM):
    """The generator's masked-LM head: exact GELU whatever `hidden_act` says (point 3)."""

    hf_architecture = "ElectraForMaskedLM"
    mlm_activation = "gelu"


class ElectraForSequenceClassification(ElectraHead, BertForSequenceClassification):
    """ELECTRA's classifier (or regressor): its own GELU head on the first token's state (point 2)."""

    hf_architecture = "ElectraForSequenceClassification"

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__(config, head=ClassificationHead(config, nn.GELU()))


class ElectraForTokenClassification(ElectraHead, BertForTokenClassification):
    hf_architecture = "ElectraForTokenClassification"


class ElectraForQuestionAnswering(ElectraHead, BertForQuestionAnswering):
    hf_architecture = "ElectraForQuestionAnswering"


# BERT's backbone names (less the pooler) under `electra.`, the projection, and ELECTRA's heads.
HF_NAMES = NameTable(
    backbone=tuple(pair for pair in BERT_NAMES.backbone if not pair[0].startswith("pooler"))
    + (("project", "embeddings_project"),),
    heads=(
        ("mlm.transform.dense", "generator_predictions.dense"),
        ("mlm.transform.norm", "generator_predictions.LayerNorm"),
        ("mlm.bias", "generator_lm_head.bias"),
        ("mlm.decoder", "generator_lm_head"),  # only with tie_word_embeddings: false
        ("discriminator.dense", "discriminator_predictions.dense"),
        ("discriminator.dense_prediction", "discriminator_predictions.dense_prediction"),
        ("classifier.dense", "classifier.dense"),
        ("classifier.out_proj", "classifier.out_proj"),
        ("classifier", "classifier"),
        ("qa_outputs", "qa_outputs"),
    ),
    prefix="electra",
    derived=r"(^|\.)embeddings\.position_ids$|(^|\.)embeddings\.token_type_ids$",
    tied_decoder="generator_lm_head.weight",
)


@dataclass
class ReplacedTokenOutput(ModelOutput):
    """What ELECTRA's joint pretraining step returns.

    loss: mlm_loss + rtd_weight * rtd_loss; logits: the generator's, float [N, V] at the N masked positions;
    rtd_logits: the discriminator's, float [B, T]; rtd_labels: long [B, T], 1 where the token was replaced.
    """

    loss: torch.Tensor
    logits: torch.Tensor
    mlm_loss: torch.Tensor
    rtd_loss: torch.Tensor
    rtd_logits: torch.Tensor
    rtd_labels: torch.Tensor


class ElectraReplacedTokenDetection(nn.Module):
    """ELECTRA's pretraining (Clark et al., 2020): a small masked-LM generator and the discriminator, trained together.

    The generator fills the masked positions with tokens sampled from its own distribution (not its argmax,
    and with no gradient through the sampling); the discriminator sees the result and scores every real
    token as original or replaced (a sampled token equal to the original counts as original). The loss is
    the generator's MLM loss plus `rtd_weight` (lambda, 50 in the paper) times the discriminator's. The two
    share their embeddings module (tokens, positions, segments and its LayerNorm), as ELECTRA shares
    them, so the generator's tied decoder is the discriminator's word embeddings too.
    """

    def __init__(self, discriminator: ElectraForPreTraining, generator: ElectraForMaskedLM,
                 rtd_weight: float = 50.0) -> None:
        super().__init__()
        if generator.config.embedding_size != discriminator.config.embedding_size:
            raise ValueError("the generator must embed at the discriminator's embedding_size to share its embeddings")
        self.discriminator, self.generator, self.rtd_weight = discriminator, generator, rtd_weight
        generator.backbone.embeddings = discriminator.backbone.embeddings  # one module: shared, not copied
        self.config = discriminator.config

    @staticmethod
    def generator_config(config: ElectraConfig, size: float) -> ElectraConfig:
        """The generator's shape, as ELECTRA's `get_generator_config`: the discriminator's hidden size, heads and
        feed-forward times `size` (heads at least one), its depth and embedding width."""
        hidden = max(1, round(config.hidden_size * size))
        heads = max(1, round(config.num_attention_heads * size))
        while hidden % heads:
            heads -= 1
        return dataclasses.replace(config, hidden_size=hidden, num_attention_heads=heads,
                                   intermediate_size=max(1, round(config.intermediate_size * size)))

    def num_parameters(self) -> int:
        """Every parameter once (the shared embeddings counted once)."""
        return sum(p.numel() for p in self.parameters())

    def checkpoint_parts(self) -> dict[str, PreTrainedModel]:
        """The models a directory of this pair holds, by subfolder: the discriminator at its top, the generator in
        `generator/` (what `save_pretrained` writes and training checkpoints read back)."""
        return {"": self.discriminator, "generator": self.generator}

    def save_pretrained(self, path: str | Path, tokenizer: Any = None) -> None:
        for sub, part in self.checkpoint_parts().items():
            part.save_pretrained(Path(path) / sub, tokenizer=tokenizer)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> ReplacedTokenOutput:
        """input_ids: long [B, T], the masked input; labels: long [B, T], the original ids at masked positions and
        -100 elsewhere (the masked-LM collator's)."""
        generated = self.generator(input_ids, token_type_ids, attention_mask, labels=labels, position_ids=position_ids)
        masked = labels != -100
        corrupted = input_ids.clone()
        if bool(masked.any()):
            with torch.no_grad():  # sampling is not differentiable: nothing flows back through it
                sampled = torch.multinomial(torch.softmax(generated.logits.detach().float(), dim=-1), 1).squeeze(-1)
            corrupted[masked] = sampled
        original = torch.where(masked, labels, input_ids)
        replaced = (corrupted != original).long()
        judged = self.discriminator(corrupted, token_type_ids, attention_mask, labels=replaced,
                                    position_ids=position_ids)
        return ReplacedTokenOutput(generated.loss + self.rtd_weight * judged.loss, generated.logits, generated.loss,
                                   judged.loss, judged.logits, replaced)
