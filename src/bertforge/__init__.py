"""bertforge: a from-scratch, readable BERT that pretrains, fine-tunes and serves,
with checkpoints that move freely to and from the Hugging Face ecosystem.

The public names are imported on first use (PEP 562), so that light processes, such
as `prepare`'s tokenising workers, do not pay for importing torch.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "PRESETS": "models.config", "BertConfig": "models.config",
    "BertforgeError": "errors", "CheckpointError": "errors", "ConfigError": "errors", "InputError": "errors",
    "TokenizerError": "errors",
    "BertModel": "models.bert",
    "BertForPreTraining": "models.heads", "BertForMaskedLM": "models.heads",
    "BertForNextSentencePrediction": "models.heads",
    "BertForSequenceClassification": "models.heads", "BertForTokenClassification": "models.heads",
    "BertForQuestionAnswering": "models.heads",
    # `Tokenizer` is BERT's WordPiece, the name it has always had here; AutoTokenizer reads every kind.
    "Tokenizer": "tokenization.wordpiece:WordPieceTokenizer", "WordPieceTokenizer": "tokenization.wordpiece",
    "BatchEncoding": "tokenization.base",
    "pipeline": "inference.hf_pipeline",
    **{name: "models.roberta" for name in (
        "RobertaConfig", "RobertaModel", "RobertaForMaskedLM", "RobertaForSequenceClassification",
        "RobertaForTokenClassification", "RobertaForQuestionAnswering", "XLMRobertaConfig", "XLMRobertaModel",
        "XLMRobertaForMaskedLM", "XLMRobertaForSequenceClassification", "XLMRobertaForTokenClassification",
        "XLMRobertaForQuestionAnswering", "CamembertConfig", "CamembertModel", "CamembertForMaskedLM",
        "CamembertForSequenceClassification", "CamembertForTokenClassification", "CamembertForQuestionAnswering")},
    **{name: "models.distilbert" for name in (
        "DistilBertConfig", "DistilBertModel", "DistilBertForMaskedLM", "DistilBertForSequenceClassification",
        "DistilBertForTokenClassification", "DistilBertForQuestionAnswering")},
    **{name: "models.albert" for name in (
        "AlbertConfig", "AlbertModel", "AlbertForPreTraining", "AlbertForMaskedLM", "AlbertForSequenceClassification",
        "AlbertForTokenClassification", "AlbertForQuestionAnswering")},
    **{name: "models.electra" for name in (
        "ElectraConfig", "ElectraModel", "ElectraForPreTraining", "ElectraForMaskedLM",
        "ElectraForSequenceClassification", "ElectraForTokenClassification", "ElectraForQuestionAnswering")},
    **{name: "models.deberta_v2" for name in (
        "DebertaV2Config", "DebertaV2Model", "DebertaV2ForMaskedLM", "DebertaV2ForSequenceClassification",
        "DebertaV2ForTokenClassification", "DebertaV2ForQuestionAnswering")},
    **{name: "models.modernbert" for name in (
        "ModernBertConfig", "ModernBertModel", "ModernBertForMaskedLM", "ModernBertForSequenceClassification",
        "ModernBertForTokenClassification", "ModernBertForQuestionAnswering")},
    **{name: "models.mpnet" for name in (
        "MPNetConfig", "MPNetModel", "MPNetForMaskedLM", "MPNetForSequenceClassification",
        "MPNetForTokenClassification", "MPNetForQuestionAnswering")},
    "MPNetTokenizer": "tokenization.wordpiece",
    **{name: "models.gte" for name in (
        "GteConfig", "GteModel", "GteForMaskedLM", "GteForSequenceClassification", "GteForTokenClassification")},
    **{name: "models.nomic_bert" for name in (
        "NomicBertConfig", "NomicBertModel", "NomicBertForMaskedLM", "NomicBertForSequenceClassification",
        "NomicBertForTokenClassification")},
    "AutoConfig": "interop.auto", "AutoModel": "interop.auto", "AutoModelForPreTraining": "interop.auto",
    "AutoModelForMaskedLM": "interop.auto", "AutoModelForNextSentencePrediction": "interop.auto",
    "AutoModelForSequenceClassification": "interop.auto", "AutoModelForTokenClassification": "interop.auto",
    "AutoModelForQuestionAnswering": "interop.auto", "AutoTokenizer": "interop.auto",
}
__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        if _EXPORTS[name].startswith("models."):
            # The models know nothing of files; bertforge.interop plugs in from_pretrained / save_pretrained.
            importlib.import_module(".interop", __name__)
        module, _, attribute = _EXPORTS[name].partition(":")
        value = getattr(importlib.import_module(f".{module}", __name__), attribute or name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bertforge' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
