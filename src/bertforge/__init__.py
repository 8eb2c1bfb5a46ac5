"""bertforge: a from-scratch, readable BERT that pretrains, fine-tunes and serves,
with checkpoints that move freely to and from the Hugging Face ecosystem."""

from .config import PRESETS, BertConfig
from .errors import BertforgeError, CheckpointError, ConfigError, InputError, TokenizerError
from .heads import (
    BertForMaskedLM,
    BertForNextSentencePrediction,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from .model import BertModel
from .tokenizer import Tokenizer

__version__ = "0.1.0"

__all__ = [
    "PRESETS", "BertConfig", "BertModel", "BertForPreTraining", "BertForMaskedLM",
    "BertForNextSentencePrediction", "BertForSequenceClassification", "BertForTokenClassification",
    "BertForQuestionAnswering", "Tokenizer", "BertforgeError", "CheckpointError", "ConfigError",
    "InputError", "TokenizerError", "__version__",
]
