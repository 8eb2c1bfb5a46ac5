"""Task heads composed on a backbone of the family (BERT's, or any that shares its layers).

Each head class holds its backbone plus a few small layers, and returns logits and, given labels,
a loss. The backbone sits under the attribute name its family's checkpoints use (`bert`,
`roberta`, `distilbert`: `base_model_prefix`) and is reachable as `self.backbone`, so a family
whose head layout is BERT's reuses these classes by setting a few class attributes
(`registry.py` says which head serves which task). The masked-LM head follows
google-research/bert: it gathers the hidden states of the predicted positions first and runs the
vocabulary projection on those alone, so training never builds a [B, T, vocab] tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..constants import IGNORE_INDEX
from ..kernels.cross_entropy import cross_entropy, linear_cross_entropy
from ..kernels.scratch import Scratch, cast
from .base import ModelOutput
from .bert import BertModel, BertPreTrainedModel
from .config import BertConfig
from .layers import Dropout, activation


@dataclass
class HeadOutput(ModelOutput):
    """What a task head returns.

    loss:          scalar float tensor when labels were given, else None
    logits:        the head's scores; shape depends on the head (see its forward)
    hidden_states: the backbone's, when asked
    attentions:    the backbone's attention probabilities, when asked
    """

    loss: torch.Tensor | None
    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class PreTrainingOutput(HeadOutput):
    """MLM + NSP. `logits` are the MLM scores; `nsp_logits` float [B, 2] (0 = is next, 1 = random)."""

    nsp_logits: torch.Tensor | None = None
    mlm_loss: torch.Tensor | None = None
    nsp_loss: torch.Tensor | None = None

    tuple_fields: ClassVar[tuple[str, ...]] = ("loss", "logits", "nsp_logits", "hidden_states", "attentions")

    # transformers' names for the same two tensors
    @property
    def prediction_logits(self) -> torch.Tensor:
        return self.logits

    @property
    def seq_relationship_logits(self) -> torch.Tensor | None:
        return self.nsp_logits


@dataclass
class QuestionAnsweringOutput(HeadOutput):
    """`start_logits` and `end_logits`: float [B, T]; `logits` stacks them as [B, T, 2]."""

    start_logits: torch.Tensor | None = None
    end_logits: torch.Tensor | None = None

    tuple_fields: ClassVar[tuple[str, ...]] = ("loss", "start_logits", "end_logits", "hidden_states", "attentions")


class MaskedLMHead(nn.Module):
    """Transform (Linear -> GELU -> LayerNorm), then a decoder (tied to the word embeddings unless the config
    says otherwise) plus its own bias."""

    def __init__(self, config: BertConfig, act: str | None = None, biases: tuple[bool, bool, bool] = (True, True, True)) -> None:
        """act: the transform's non-linearity; None means `config.hidden_act` (BERT's head follows the
        config, RoBERTa's is exact GELU whatever the config says). biases: whether the dense layer, the
        LayerNorm and the decoder have one (all do but in ModernBERT, whose config says)."""
        super().__init__()
        E = config.embedding_width  # the word embeddings' width, which the decoder shares (ALBERT's, ELECTRA's < H)
        self.transform = nn.Sequential()
        self.transform.add_module("dense", nn.Linear(config.hidden_size, E, bias=biases[0]))
        self.transform.add_module("act", activation(act or config.hidden_act))
        self.transform.add_module("norm", nn.LayerNorm(E, eps=config.layer_norm_eps, bias=biases[1]))
        self.bias = nn.Parameter(torch.zeros(config.vocab_size)) if biases[2] else None
        # BERT ties the decoder to the word embeddings. A checkpoint with `tie_word_embeddings: false`
        # has its own [V, E] decoder matrix (cls.predictions.decoder.weight), kept here.
        self.decoder = None if config.tie_word_embeddings else nn.Linear(E, config.vocab_size, bias=False)
        # Reused memory for training's largest tensors here (kernels/scratch.py): the fp32 logits and their
        # gradient (35 MB each at BERT's vocabulary), the [V, E] weight's gradient, bf16's copy of the weight.
        self.scratch = Scratch()

    def resize_vocabulary(self, size: int, std: float) -> None:
        """`resize_token_embeddings`' part here: the bias (new entries 0) and an untied decoder (new rows N(0, std))."""
        with torch.no_grad():
            if self.bias is not None:
                bias = torch.zeros(size, dtype=self.bias.dtype, device=self.bias.device)
                keep = min(size, self.bias.numel())
                bias[:keep] = self.bias[:keep]
                self.bias = nn.Parameter(bias)
            if self.decoder is not None:
                old = self.decoder.weight
                decoder = nn.Linear(old.shape[1], size, bias=False, device=old.device, dtype=old.dtype)
                nn.init.normal_(decoder.weight, mean=0.0, std=std)
                keep = min(size, old.shape[0])
                decoder.weight[:keep] = old[:keep]
                self.decoder = decoder

    def forward(self, hidden: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        """hidden: float [..., H]; word_embeddings: float [V, E] (used when tied) -> logits float [..., V]."""
        return F.linear(self.transform(hidden), self._decoder_weight(word_embeddings), self.bias)

    def _decoder_weight(self, word_embeddings: torch.Tensor) -> torch.Tensor:
        """The [V, E] decoder matrix: the word embeddings when tied, else the head's own."""
        return word_embeddings if self.decoder is None else self.decoder.weight

    def predict(self, hidden: torch.Tensor, word_embeddings: torch.Tensor,
                labels: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits and loss for masked-LM.

        hidden: float [B, T, H]; labels: long [B, T] with IGNORE_INDEX where nothing is predicted.
        With labels, the logits are float [N, V] for the N predicted positions, in row-major
        order (the order of `labels[labels != -100]`); without, float [B, T, V].
        """
        if labels is None:
            return self(hidden, word_embeddings), None
        selected = labels != IGNORE_INDEX  # (B, T)
        targets = labels[selected]  # (N,)
        weight = self._decoder_weight(word_embeddings)
        x = self.transform(hidden[selected])  # (N, E): gather first, then project
        if targets.numel() > 0:
            fused = linear_cross_entropy(x, weight, self.bias, targets, self.scratch)
            if fused is not None:  # fp32 training on the CPU: the decoder and the loss in one node
                return fused
        if _bf16_training_on_cpu(weight):  # autocast's bf16 copy of the [V, E] weight, on reused memory
            weight = cast(weight, torch.bfloat16, self.scratch)
        logits = F.linear(x, weight, self.bias)  # (N, V)
        if targets.numel() == 0:  # nothing masked in this batch: a zero loss that still has a graph
            return logits, logits.sum() * 0.0
        # torch's F.cross_entropy(logits.float(), targets), without its [N, V] float32 intermediates.
        return logits, cross_entropy(logits, targets)


def _bf16_training_on_cpu(weight: torch.Tensor) -> bool:
    """Whether CPU bf16 autocast would cast this float32 weight for a product that autograd records."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.is_grad_enabled()
            and weight.requires_grad and torch.is_autocast_enabled("cpu")
            and torch.get_autocast_dtype("cpu") == torch.bfloat16 and not torch.compiler.is_compiling())


class ClassificationHead(nn.Module):
    """The sentence classifier of RoBERTa and ELECTRA checkpoints, on the first token's state (no pooler in
    front of it): dropout -> dense -> act -> dropout -> out_proj, where act is tanh (RoBERTa) or GELU (ELECTRA)."""

    def __init__(self, config: BertConfig, act: nn.Module) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = act
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = Dropout(p)
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        """The first tokens' states, float [B, H] -> logits float [B, num_labels]."""
        return self.out_proj(self.dropout(self.act(self.dense(self.dropout(first)))))


class HeadModel(BertPreTrainedModel):
    """A backbone plus head layers. The backbone is built by `backbone_class` and held under
    `base_model_prefix`, the name its weights carry in the family's checkpoints."""

    base_model_prefix: ClassVar[str] = "bert"
    backbone_class: ClassVar[type[BertModel]] = BertModel
    mlm_activation: ClassVar[str | None] = None  # the masked-LM transform's; None: config.hidden_act

    def masked_lm_head(self, config: BertConfig) -> MaskedLMHead:
        """The masked-LM head of this family: BERT's, with `mlm_activation` (ModernBERT's sets its biases)."""
        return MaskedLMHead(config, self.mlm_activation)

    def _add_backbone(self, config: BertConfig, add_pooling_layer: bool = True) -> None:
        self.add_module(self.base_model_prefix, self.backbone_class(config, add_pooling_layer=add_pooling_layer))

    @property
    def backbone(self) -> BertModel:
        return getattr(self, self.base_model_prefix)


class BertForPreTraining(HeadModel):
    """BERT's pretraining model: masked-LM and next-sentence prediction, losses summed."""

    hf_architecture = "BertForPreTraining"

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self._add_backbone(config)
        self.mlm = self.masked_lm_head(config)
        self.nsp = self.sentence_head(config)
        self.init_weights()

    def sentence_head(self, config: BertConfig) -> nn.Module:
        """The second pretraining head, on the pooled [CLS]: BERT's NSP is one Linear(H, 2) (ALBERT's differs)."""
        return nn.Linear(config.hidden_size, 2)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                next_sentence_label: torch.Tensor | None = None, output_attentions: bool = False,
                output_hidden_states: bool = False,
                position_ids: torch.Tensor | None = None) -> PreTrainingOutput:
        """input_ids: long [B, T]; labels: long [B, T] (-100 = not predicted); next_sentence_label: long [B],
        or [S] with one per example when rows are packed (see `BertModel.forward`)."""
        out = self.backbone(input_ids, token_type_ids, attention_mask, position_ids, output_attentions=output_attentions,
                            output_hidden_states=output_hidden_states)
        mlm_logits, mlm_loss = self.mlm.predict(out.last_hidden_state, self.backbone.embeddings.word.decoder_weight(), labels)
        nsp_logits = self.nsp(out.pooler_output)  # (B, 2), or (S, 2) packed
        nsp_loss = F.cross_entropy(nsp_logits.float(), next_sentence_label) if next_sentence_label is not None else None
        losses = [x for x in (mlm_loss, nsp_loss) if x is not None]
        return PreTrainingOutput(
            loss=sum(losses) if losses else None, logits=mlm_logits, nsp_logits=nsp_logits,
            mlm_loss=mlm_loss, nsp_loss=nsp_loss, hidden_states=out.hidden_states, attentions=out.attentions,
        )


class BertForMaskedLM(HeadModel):
    """Masked-LM only (no pooler, no NSP), as used for fill-mask and MLM-only pretraining."""

    hf_architecture = "BertForMaskedLM"

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self._add_backbone(config, add_pooling_layer=False)
        self.mlm = self.masked_lm_head(config)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                output_attentions: bool = False, output_hidden_states: bool = False,
                position_ids: torch.Tensor | None = None, labelled_logits_only: bool = True) -> HeadOutput:
        """Logits float [B, T, V]; with labels, [N, V] at the N labelled positions only (a training step needs no
        more, and a [B, T, V] tensor is 30,522 floats a token at BERT's vocabulary), unless `labelled_logits_only`
        is False, which gives [B, T, V] with the loss, as transformers does."""
        out = self.backbone(input_ids, token_type_ids, attention_mask, position_ids, output_attentions=output_attentions,
                            output_hidden_states=output_hidden_states)
        weight = self.backbone.embeddings.word.decoder_weight()  # (used once: see models/tied.py)
        if labels is not None and not labelled_logits_only:
            logits = self.mlm(out.last_hidden_state, weight)
            loss = F.cross_entropy(logits.float().flatten(0, -2), labels.flatten(), ignore_index=IGNORE_INDEX)
        else:
            logits, loss = self.mlm.predict(out.last_hidden_state, weight, labels)
        return HeadOutput(loss, logits, out.hidden_states, out.attentions)


class BertForNextSentencePrediction(HeadModel):
    """Is segment B the real continuation of segment A? Logits float [B, 2]; label 0 means yes."""

    hf_architecture = "BertForNextSentencePrediction"

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self._add_backbone(config)
        self.nsp = nn.Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                output_attentions: bool = False, output_hidden_states: bool = False,
                position_ids: torch.Tensor | None = None) -> HeadOutput:
        out = self.backbone(input_ids, token_type_ids, attention_mask, position_ids, output_attentions=output_attentions,
                            output_hidden_states=output_hidden_states)
        logits = self.nsp(out.pooler_output)
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return HeadOutput(loss, logits, out.hidden_states, out.attentions)


class LinearHead(HeadModel):
    """The backbone plus one (dropout +) linear layer on either the pooled [CLS] vector or every
    token's hidden state: what sequence classification, token classification and QA share.

    The layer keeps transformers' name (`classifier`, `qa_outputs`), so checkpoints load as they are.
    A family whose sentence classifier has a layout of its own (RoBERTa's) passes it as `head`: it
    then reads the first token's state itself, with its own dropout, and the backbone has no pooler.
    """

    def __init__(self, config: BertConfig, out_features: int, pooled: bool, layer: str = "classifier",
                 dropout: bool = True, head: nn.Module | None = None) -> None:
        super().__init__()
        self.config = config
        self.pooled, self.first_token, self.layer = pooled and head is None, pooled and head is not None, layer
        self._add_backbone(config, add_pooling_layer=self.pooled)
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = Dropout(p) if dropout and head is None else nn.Identity()
        setattr(self, layer, head if head is not None else nn.Linear(config.hidden_size, out_features))
        self.init_weights()

    def scores(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
               attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None,
               output_attentions: bool, output_hidden_states: bool):
        """(logits, encoder output): logits float [B, out] when pooled, else [B, T, out]."""
        out = self.backbone(input_ids, token_type_ids, attention_mask, position_ids, output_attentions=output_attentions,
                            output_hidden_states=output_hidden_states)
        return getattr(self, self.layer)(self.dropout(self.features(out, attention_mask, position_ids))), out

    def features(self, out, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None) -> torch.Tensor:
        """What the layer reads from the encoder's output: the pooled vectors float [B, H] (or the first tokens'),
        else every token's float [B, T, H]. A family with a head of its own in front (ModernBERT's) overrides this."""
        if self.pooled:
            return out.pooler_output
        if self.first_token:
            return out.last_hidden_state[:, 0]
        return out.last_hidden_state


class BertForSequenceClassification(LinearHead):
    """A linear classifier on the pooled [CLS] vector; regression when num_labels == 1.

    The loss follows `config.problem_type` as transformers does: mean-squared error for
    regression, cross-entropy for single-label, and binary cross-entropy per label for
    multi-label classification. When unset it is inferred from num_labels and the label dtype.
    """

    hf_architecture = "BertForSequenceClassification"
    # DeBERTa's transformers class returns a regression's logits flattened to [B] when given labels: so do its here.
    flat_regression_logits: ClassVar[bool] = False
    # transformers' classes record the problem type they inferred in the config; DeBERTa's does not.
    records_problem_type: ClassVar[bool] = True

    def __init__(self, config: BertConfig, head: nn.Module | None = None) -> None:
        super().__init__(config, config.num_labels, pooled=True, head=head)

    def problem_type(self, labels: torch.Tensor | None = None) -> str:
        if self.config.problem_type:
            return self.config.problem_type
        if self.config.num_labels == 1:
            return "regression"
        if labels is not None and labels.is_floating_point():
            return "multi_label_classification"
        return "single_label_classification"

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                output_attentions: bool = False, output_hidden_states: bool = False,
                position_ids: torch.Tensor | None = None) -> HeadOutput:
        """Logits float [B, num_labels]; labels long [B], or float [B] (regression) / [B, num_labels] (multi-label)."""
        logits, out = self.scores(input_ids, token_type_ids, attention_mask, position_ids, output_attentions,
                                  output_hidden_states)
        loss = None
        if labels is not None:
            kind = self.problem_type(labels)
            if self.config.problem_type is None and self.records_problem_type:
                self.config.problem_type = kind  # set from the first labels seen, as transformers does
            if kind == "regression" and self.flat_regression_logits:
                logits = logits.view(-1)
            if kind == "regression":
                loss = F.mse_loss(logits.float().view(-1), labels.float().view(-1))
            elif kind == "multi_label_classification":
                loss = F.binary_cross_entropy_with_logits(logits.float(), labels.float())
            else:
                loss = F.cross_entropy(logits.float(), labels.view(-1))
        return HeadOutput(loss, logits, out.hidden_states, out.attentions)


class BertForTokenClassification(LinearHead):
    """A linear tagger on every token's hidden state (NER, POS). Logits float [B, T, num_labels]."""

    hf_architecture = "BertForTokenClassification"

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config, config.num_labels, pooled=False)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                output_attentions: bool = False, output_hidden_states: bool = False,
                position_ids: torch.Tensor | None = None) -> HeadOutput:
        """labels: long [B, T], -100 on sub-tokens after the first, special tokens and padding."""
        logits, out = self.scores(input_ids, token_type_ids, attention_mask, position_ids, output_attentions,
                                  output_hidden_states)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().view(-1, self.config.num_labels), labels.view(-1),
                                   ignore_index=IGNORE_INDEX)
        return HeadOutput(loss, logits, out.hidden_states, out.attentions)


class BertForQuestionAnswering(LinearHead):
    """Extractive QA: a start and an end score for every token (no dropout, as in transformers)."""

    hf_architecture = "BertForQuestionAnswering"

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config, 2, pooled=False, layer="qa_outputs", dropout=False)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, start_positions: torch.Tensor | None = None,
                end_positions: torch.Tensor | None = None, output_attentions: bool = False,
                output_hidden_states: bool = False,
                position_ids: torch.Tensor | None = None) -> QuestionAnsweringOutput:
        """start_positions, end_positions: long [B] token indices (0 = [CLS] for "no answer")."""
        logits, out = self.scores(input_ids, token_type_ids, attention_mask, position_ids, output_attentions,
                                  output_hidden_states)  # (B, T, 2)
        start_logits, end_logits = logits[..., 0], logits[..., 1]
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = span_loss(start_logits, end_logits, start_positions, end_positions, attention_mask)
        return QuestionAnsweringOutput(loss, logits, out.hidden_states, out.attentions,
                                       start_logits=start_logits, end_logits=end_logits)


def span_loss(start_logits: torch.Tensor, end_logits: torch.Tensor, start_positions: torch.Tensor,
              end_positions: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of the start and end cross-entropies, each a softmax over the window's real tokens.

    start_logits, end_logits: [B, T]; start_positions, end_positions: long [B]; attention_mask: [B, T].
    Padding is left out of the softmax. transformers and google-research/bert keep it in, and
    the model learns to score padding low. google's windows are all padded to 384, so a
    window always sees the same padding; with padding to each batch's longest window, as
    here, a window's loss would depend on its batch-mates, and bertforge's unpadded path
    gives padding no hidden state to score.
    Positions beyond the window are clamped to T and ignored, as transformers does.
    """
    T = start_logits.shape[1]
    start, end = start_positions.view(-1).clamp(0, T), end_positions.view(-1).clamp(0, T)
    start_logits, end_logits = start_logits.float(), end_logits.float()
    if attention_mask is not None:
        padding = attention_mask == 0
        start_logits = start_logits.masked_fill(padding, torch.finfo(torch.float32).min)
        end_logits = end_logits.masked_fill(padding, torch.finfo(torch.float32).min)
    return (F.cross_entropy(start_logits, start, ignore_index=T) + F.cross_entropy(end_logits, end, ignore_index=T)) / 2
