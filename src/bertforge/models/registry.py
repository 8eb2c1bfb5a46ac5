"""The one table of architectures: `model_type` -> config class, backbone, heads, name table, tokenizer kind.

Everything that must know which architectures exist reads this module: `from_pretrained` and the
Auto classes (which class a config.json builds), checkpoint I/O (which name table), `predict`,
`serve`, `inspect` and `export` (which head serves which task, and what its outputs are called).
Adding an architecture is one module under `models/` and one `Family` row here; adding a head is
its class and one `HeadInfo` line in its family's row.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .albert import HF_NAMES as ALBERT_NAMES
from .albert import (AlbertConfig, AlbertForMaskedLM, AlbertForPreTraining, AlbertForQuestionAnswering,
                     AlbertForSequenceClassification, AlbertForTokenClassification, AlbertModel)
from .base import NameTable, PreTrainedModel
from .bert import HF_NAMES as BERT_NAMES
from .bert import BertModel
from .config import BertConfig
from .deberta_v2 import HF_NAMES as DEBERTA_V2_NAMES
from .deberta_v2 import (DebertaV2Config, DebertaV2ForMaskedLM, DebertaV2ForQuestionAnswering,
                         DebertaV2ForSequenceClassification, DebertaV2ForTokenClassification, DebertaV2Model)
from .distilbert import HF_NAMES as DISTILBERT_NAMES
from .distilbert import (DistilBertConfig, DistilBertForMaskedLM, DistilBertForQuestionAnswering,
                         DistilBertForSequenceClassification, DistilBertForTokenClassification, DistilBertModel)
from .electra import HF_NAMES as ELECTRA_NAMES
from .electra import (ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining, ElectraForQuestionAnswering,
                      ElectraForSequenceClassification, ElectraForTokenClassification, ElectraModel)
from .gte import HF_NAMES as GTE_NAMES
from .gte import GteConfig, GteForMaskedLM, GteForSequenceClassification, GteForTokenClassification, GteModel
from .nomic_bert import HF_NAMES as NOMIC_BERT_NAMES
from .nomic_bert import (NomicBertConfig, NomicBertForMaskedLM, NomicBertForSequenceClassification,
                         NomicBertForTokenClassification, NomicBertModel)
from .modernbert import HF_NAMES as MODERNBERT_NAMES
from .modernbert import (ModernBertConfig, ModernBertForMaskedLM, ModernBertForQuestionAnswering,
                         ModernBertForSequenceClassification, ModernBertForTokenClassification, ModernBertModel)
from .mpnet import HF_NAMES as MPNET_NAMES
from .mpnet import (MPNetConfig, MPNetForMaskedLM, MPNetForQuestionAnswering, MPNetForSequenceClassification,
                    MPNetForTokenClassification, MPNetModel)
from .heads import (BertForMaskedLM, BertForNextSentencePrediction, BertForPreTraining, BertForQuestionAnswering,
                    BertForSequenceClassification, BertForTokenClassification)
from .roberta import HF_NAMES as ROBERTA_NAMES
from .roberta import (CamembertConfig, CamembertForMaskedLM, CamembertForQuestionAnswering,
                      CamembertForSequenceClassification, CamembertForTokenClassification, CamembertModel,
                      RobertaConfig, RobertaForMaskedLM, RobertaForQuestionAnswering, RobertaForSequenceClassification,
                      RobertaForTokenClassification, RobertaModel, XLMRobertaConfig, XLMRobertaForMaskedLM,
                      XLMRobertaForQuestionAnswering, XLMRobertaForSequenceClassification,
                      XLMRobertaForTokenClassification, XLMRobertaModel)

# What each Auto class builds, by the kind of head (transformers' Auto class names, without "AutoModel").
HEAD_KINDS = ("base", "pretraining", "masked-lm", "next-sentence", "sequence-classification",
              "token-classification", "question-answering")


@dataclass(frozen=True)
class HeadInfo:
    """What one head is for, written once here; predict, evaluate, serve, inspect and export read it.

    cls: the model class; its `hf_architecture` is the name config.json gives it.
    kind: one of HEAD_KINDS: which Auto class builds it.
    tasks: the `predict` / `evaluate` tasks it serves, each also a `serve` endpoint of the same
        name (every model also serves `embed` and `similarity` through its encoder).
    labels: what its outputs index: hidden units, the vocabulary, classes, tags or token positions.
    outputs: its output tensors, in order, by the names an ONNX export gives them.
    weights: the checkpoint key prefix of its own weights and a name for them (`bertforge inspect`).
    """

    cls: type[PreTrainedModel]
    kind: str
    tasks: tuple[str, ...]
    labels: str
    outputs: tuple[str, ...]
    weights: tuple[str, str] | None


@dataclass(frozen=True)
class Family:
    """One architecture of the BERT family, as a config.json's `model_type` names it.

    config: its config class (transformers' field names); backbone: its bare encoder class;
    names: its checkpoint name table; tokenizer: the tokenizer kind its checkpoints ship
    (wordpiece, bpe or unigram); heads: its head classes, the backbone first; tokenizer_class: the
    transformers class a new vocabulary of the family is saved as.
    """

    model_type: str
    config: type
    backbone: type[PreTrainedModel]
    names: NameTable
    tokenizer: str
    heads: tuple[HeadInfo, ...]
    # The transformers tokenizer class a new vocabulary of this family is saved as (its pipeline, for Unigram).
    tokenizer_class: str = "BertTokenizer"

    def head(self, kind: str) -> type[PreTrainedModel]:
        """The class of this family that an Auto class of `kind` builds; refused when it has none.
        A family that pretrains with masked-LM alone builds its masked-LM model for `pretraining`."""
        for info in self.heads:
            if info.kind == kind:
                return info.cls
        if kind == "pretraining":
            return self.head("masked-lm")
        kinds = ", ".join(info.kind for info in self.heads)
        raise ConfigError(f"model_type '{self.model_type}' has no {kind} head in bertforge; it has: {kinds}")


def base(cls: type[PreTrainedModel], pooler: bool = True) -> HeadInfo:
    outputs = ("last_hidden_state", "pooler_output") if pooler else ("last_hidden_state",)
    return HeadInfo(cls, "base", (), "hidden", outputs, None)


def masked_lm(cls: type[PreTrainedModel], prefix: str, kind: str = "masked-lm") -> HeadInfo:
    return HeadInfo(cls, kind, ("fill-mask",), "vocabulary", ("logits",), (prefix, "masked-LM"))


def sequence_classifier(cls: type[PreTrainedModel]) -> HeadInfo:
    return HeadInfo(cls, "sequence-classification", ("classify", "regress"), "classes (id2label), or one value",
                    ("logits",), ("classifier.", "classifier"))


def token_classifier(cls: type[PreTrainedModel]) -> HeadInfo:
    return HeadInfo(cls, "token-classification", ("ner",), "tags per token (id2label)", ("logits",),
                    ("classifier.", "classifier"))


def span_extractor(cls: type[PreTrainedModel]) -> HeadInfo:
    return HeadInfo(cls, "question-answering", ("qa",), "answer start and end positions",
                    ("start_logits", "end_logits"), ("qa_outputs.", "question answering (start/end)"))


BERT = Family("bert", BertConfig, BertModel, BERT_NAMES, "wordpiece", (
    base(BertModel), masked_lm(BertForMaskedLM, "cls.predictions."),
    masked_lm(BertForPreTraining, "cls.predictions.", kind="pretraining"),
    HeadInfo(BertForNextSentencePrediction, "next-sentence", (), "is-next / not-next", ("logits",),
             ("cls.seq_relationship.", "next-sentence prediction")),
    sequence_classifier(BertForSequenceClassification), token_classifier(BertForTokenClassification),
    span_extractor(BertForQuestionAnswering),
))


def roberta_family(model_type: str, config: type, tokenizer: tuple[str, str], classes: tuple[type, ...]) -> Family:
    """RoBERTa, XLM-RoBERTa and CamemBERT: one layout, three sets of names (base, masked-LM, classifier, tagger, QA).
    RoBERTa pretrains with masked-LM alone, so its masked-LM model is also its pretraining model."""
    backbone, mlm, seq, tok, qa = classes
    return Family(model_type, config, backbone, ROBERTA_NAMES, tokenizer[0], (
        base(backbone), masked_lm(mlm, "lm_head."), sequence_classifier(seq), token_classifier(tok),
        span_extractor(qa)), tokenizer_class=tokenizer[1])


ROBERTA = roberta_family("roberta", RobertaConfig, ("bpe", "RobertaTokenizer"), (
    RobertaModel, RobertaForMaskedLM, RobertaForSequenceClassification, RobertaForTokenClassification,
    RobertaForQuestionAnswering))
XLM_ROBERTA = roberta_family("xlm-roberta", XLMRobertaConfig, ("unigram", "XLMRobertaTokenizer"), (
    XLMRobertaModel, XLMRobertaForMaskedLM, XLMRobertaForSequenceClassification, XLMRobertaForTokenClassification,
    XLMRobertaForQuestionAnswering))
CAMEMBERT = roberta_family("camembert", CamembertConfig, ("unigram", "CamembertTokenizer"), (
    CamembertModel, CamembertForMaskedLM, CamembertForSequenceClassification, CamembertForTokenClassification,
    CamembertForQuestionAnswering))

DISTILBERT = Family("distilbert", DistilBertConfig, DistilBertModel, DISTILBERT_NAMES, "wordpiece", (
    base(DistilBertModel, pooler=False), masked_lm(DistilBertForMaskedLM, "vocab_projector."),
    sequence_classifier(DistilBertForSequenceClassification), token_classifier(DistilBertForTokenClassification),
    span_extractor(DistilBertForQuestionAnswering),
), tokenizer_class="DistilBertTokenizer")

ALBERT = Family("albert", AlbertConfig, AlbertModel, ALBERT_NAMES, "unigram", (
    base(AlbertModel), masked_lm(AlbertForMaskedLM, "predictions."),
    HeadInfo(AlbertForPreTraining, "pretraining", ("fill-mask",), "vocabulary", ("logits",),
             ("sop_classifier.", "sentence-order prediction")),
    sequence_classifier(AlbertForSequenceClassification), token_classifier(AlbertForTokenClassification),
    span_extractor(AlbertForQuestionAnswering),
), tokenizer_class="AlbertTokenizer")

ELECTRA = Family("electra", ElectraConfig, ElectraModel, ELECTRA_NAMES, "wordpiece", (
    base(ElectraModel, pooler=False), masked_lm(ElectraForMaskedLM, "generator_predictions."),
    # The discriminator is ELECTRA's pretraining model: `AutoModelForPreTraining` builds it, as in transformers.
    HeadInfo(ElectraForPreTraining, "pretraining", (), "replaced (> 0) or original, per token", ("logits",),
             ("discriminator_predictions.", "replaced-token detection")),
    sequence_classifier(ElectraForSequenceClassification), token_classifier(ElectraForTokenClassification),
    span_extractor(ElectraForQuestionAnswering),
), tokenizer_class="ElectraTokenizer")

# DeBERTa-v2 and -v3 pretrain with masked-LM alone (v3's replaced-token detection is not built), so the
# masked-LM model is also the pretraining model.
DEBERTA_V2 = Family("deberta-v2", DebertaV2Config, DebertaV2Model, DEBERTA_V2_NAMES, "unigram", (
    base(DebertaV2Model, pooler=False), masked_lm(DebertaV2ForMaskedLM, "cls.predictions."),
    sequence_classifier(DebertaV2ForSequenceClassification), token_classifier(DebertaV2ForTokenClassification),
    span_extractor(DebertaV2ForQuestionAnswering),
), tokenizer_class="DebertaV2Tokenizer")

# ModernBERT pretrains with masked-LM alone (30% of tokens); every task layer is named `classifier`.
MODERNBERT = Family("modernbert", ModernBertConfig, ModernBertModel, MODERNBERT_NAMES, "bpe", (
    base(ModernBertModel, pooler=False), masked_lm(ModernBertForMaskedLM, "head."),
    sequence_classifier(ModernBertForSequenceClassification), token_classifier(ModernBertForTokenClassification),
    HeadInfo(ModernBertForQuestionAnswering, "question-answering", ("qa",), "answer start and end positions",
             ("start_logits", "end_logits"), ("classifier.", "question answering (start/end)")),
), tokenizer_class="PreTrainedTokenizerFast")

# MPNet's checkpoints are its permuted-LM pretraining's; bertforge pretrains it with masked-LM (its masked-LM model).
MPNET = Family("mpnet", MPNetConfig, MPNetModel, MPNET_NAMES, "wordpiece", (
    base(MPNetModel), masked_lm(MPNetForMaskedLM, "lm_head."),
    sequence_classifier(MPNetForSequenceClassification), token_classifier(MPNetForTokenClassification),
    span_extractor(MPNetForQuestionAnswering),
), tokenizer_class="MPNetTokenizer")

# GTE pretrains with masked-LM alone; transformers has no question-answering head for it.
GTE = Family("gte", GteConfig, GteModel, GTE_NAMES, "wordpiece", (
    base(GteModel, pooler=False), masked_lm(GteForMaskedLM, "lm_head."),
    sequence_classifier(GteForSequenceClassification), token_classifier(GteForTokenClassification),
))

# NomicBERT: GTE's blocks without biases; BERT's heads under its names; no question-answering head in transformers.
NOMIC_BERT = Family("nomic_bert", NomicBertConfig, NomicBertModel, NOMIC_BERT_NAMES, "wordpiece", (
    base(NomicBertModel, pooler=False), masked_lm(NomicBertForMaskedLM, "cls.predictions."),
    sequence_classifier(NomicBertForSequenceClassification), token_classifier(NomicBertForTokenClassification),
))

FAMILIES: dict[str, Family] = {f.model_type: f for f in (BERT, ROBERTA, XLM_ROBERTA, DISTILBERT, ALBERT, ELECTRA,
                                                         DEBERTA_V2, MODERNBERT, MPNET, CAMEMBERT, GTE, NOMIC_BERT)}

# Every head of every family, by the transformers architecture name config.json gives it.
HEADS: dict[str, HeadInfo] = {info.cls.hf_architecture: info for f in FAMILIES.values() for info in f.heads}
# Every class that `from_pretrained` can build, by that name.
ARCHITECTURES: dict[str, type[PreTrainedModel]] = {name: info.cls for name, info in HEADS.items()}
# The architectures that can serve each task. A checkpoint is used for a task only when its config.json
# names one of them: a classifier's weights fit a token classifier's shapes, so only `architectures`
# can tell the two apart.
TASK_ARCHITECTURES: dict[str, tuple[str, ...]] = {
    task: tuple(name for name, info in HEADS.items() if task in info.tasks)
    for task in dict.fromkeys(t for info in HEADS.values() for t in info.tasks)}


def family(model_type: object, source: str = "config.json") -> Family:
    """The registry row for a `model_type`; anything else is refused in one line naming the supported ones."""
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise ConfigError(f"{source}: model_type {model_type!r} is not an architecture bertforge reads; "
                          f"supported: {', '.join(FAMILIES)}")
    return FAMILIES[model_type]

