"""transformers' Auto classes: `AutoModelFor*.from_pretrained(dir)` builds the class config.json calls for.

`model_type` picks the family (its registry row) and the Auto class picks the head kind, so
`AutoModelForSequenceClassification` on a BERT directory builds `BertForSequenceClassification`.
A `model_type` bertforge does not read is refused in one line naming the supported ones.

    from bertforge import AutoModel, AutoTokenizer
    tok = AutoTokenizer.from_pretrained("dir")
    model = AutoModel.from_pretrained("dir")
    out = model(**tok(["a sentence"], padding=True, return_tensors="pt"))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from ..models.base import PreTrainedModel
from ..tokenization.kinds import load_tokenizer
from ..tokenization.base import Tokenizer
from .hf import family_of, read_config


class AutoConfig:
    """`AutoConfig.from_pretrained(dir)`: the directory's config, as its family's config class."""

    @staticmethod
    def from_pretrained(path: str | Path) -> Any:
        return read_config(path)


class _AutoModel:
    kind: ClassVar[str]

    def __init__(self) -> None:
        raise TypeError(f"{type(self).__name__} is built with {type(self).__name__}.from_pretrained(dir)")

    @classmethod
    def model_class(cls, path: str | Path) -> type[PreTrainedModel]:
        """The class `from_pretrained` would build for the directory."""
        return family_of(path).head(cls.kind)

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs: Any) -> PreTrainedModel:
        """Build the directory's family's model of this kind and load its weights.

        Keyword arguments override config fields, as in transformers (`num_labels=3` for a new head); `dtype`,
        `torch_dtype`, `device_map` and `attn_implementation` are transformers' loading options
        (`PreTrainedModel.from_pretrained`).
        """
        return cls.model_class(path).from_pretrained(path, **kwargs)


class AutoModel(_AutoModel):
    """The bare encoder: `last_hidden_state` [B, T, H] and, where the family has one, `pooler_output` [B, H]."""

    kind = "base"


class AutoModelForPreTraining(_AutoModel):
    """The family's pretraining heads (BERT: masked-LM + next-sentence prediction; ALBERT: masked-LM + sentence
    order; ELECTRA: the replaced-token discriminator; RoBERTa and DistilBERT: masked-LM)."""

    kind = "pretraining"


class AutoModelForMaskedLM(_AutoModel):
    """The masked-LM head: `logits` [B, T, V]."""

    kind = "masked-lm"


class AutoModelForNextSentencePrediction(_AutoModel):
    """BERT's next-sentence head: `logits` [B, 2], 0 = B follows A."""

    kind = "next-sentence"


class AutoModelForSequenceClassification(_AutoModel):
    """A classifier (or regressor, num_labels = 1) on the sentence: `logits` [B, num_labels]."""

    kind = "sequence-classification"


class AutoModelForTokenClassification(_AutoModel):
    """A tagger: `logits` [B, T, num_labels]."""

    kind = "token-classification"


class AutoModelForQuestionAnswering(_AutoModel):
    """Extractive QA: `start_logits` and `end_logits`, each [B, T]."""

    kind = "question-answering"


class AutoTokenizer:
    """`AutoTokenizer.from_pretrained(dir)`: the directory's tokenizer, called as transformers' is."""

    @staticmethod
    def from_pretrained(path: str | Path) -> Tokenizer:
        """The tokenizer the directory's files hold (WordPiece, byte-level BPE or Unigram), as transformers picks
        it from tokenizer_config.json's class rather than from the model: a RoBERTa may ship a WordPiece vocabulary."""
        return load_tokenizer(path)
