"""Token classification (NER on CoNLL or JSONL): reader -> word-aligned features -> task ->
entity-level P/R/F1 (seqeval, conlleval counting)."""

from __future__ import annotations

from ..data.ner import align_labels, read_sentences
from ..errors import InputError
from ..metrics import entity_metrics
from ..models.heads import IGNORE_INDEX, BertForTokenClassification
from ..settings import FinetuneConfig
from ..tokenization.base import Tokenizer
from .base import FeatureTask, length, new_model


class TokenClassificationTask(FeatureTask):
    """NER: predictions at each word's first sub-token, scored as entities (seqeval)."""

    main_metric = "f1"

    def __init__(self, *args, id2label: dict[int, str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.id2label = id2label

    def word_tags(self, model, features: list[dict]) -> list[list[str]]:
        """Predicted IOB2 tags per word; words cut off by truncation are tagged O."""

        def take(out, batch):
            best = out.logits.argmax(-1).cpu()
            return [best[i][batch["labels"][i] != IGNORE_INDEX].tolist() for i in range(best.shape[0])]

        tags = []
        for feature, ids in zip(features, self.predict(model, features, take)):
            words = [self.id2label[i] for i in ids]
            tags.append(words + ["O"] * (feature["num_words"] - len(words)))
        return tags

    def prediction_rows(self, model) -> list[dict]:
        """`evaluate --predictions`: one {"tags": [...]} per dev sentence."""
        return [{"tags": t} for t in self.word_tags(model, self.dev)]

    def evaluate(self, model) -> dict[str, float]:
        result = entity_metrics([f["tags"] for f in self.dev], self.word_tags(model, self.dev))
        per_type = result.pop("per_type")
        result.update({f"{name}_f1": v["f1"] for name, v in per_type.items()})
        return result


def ner_features(sentences, tokenizer: Tokenizer, seq_len: int, label2id: dict[str, int]) -> list[dict]:
    enc = tokenizer.for_words()([s.tokens for s in sentences], is_split_into_words=True, truncation=True, max_length=seq_len,
                    return_word_ids=True, return_token_type_ids=True)
    features = []
    for s, ids, types, word_ids in zip(sentences, enc["input_ids"], enc["token_type_ids"], enc["word_ids"]):
        features.append({"input_ids": ids, "token_type_ids": types, "tags": s.tags, "num_words": len(s.tokens),
                         "labels": align_labels(word_ids, [label2id[t] for t in s.tags])})
    return features


def build(cfg: FinetuneConfig, tokenizer: Tokenizer, train_path: str, dev_path: str, model=None):
    """(model, task) for `ner`; a given `model` is evaluated with its own tag set."""
    train = read_sentences(train_path) if train_path else None
    dev = read_sentences(dev_path) if dev_path else []  # no --dev: nothing is evaluated
    if model is not None:
        labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
    else:
        # Every entity type seen in training gets both B- and I-, so a dev file may use either.
        types = sorted({t[2:] for s in train for t in s.tags if t != "O"})
        labels = ["O"] + [f"{p}-{kind}" for kind in types for p in ("B", "I")]
        model = new_model(cfg, BertForTokenClassification, labels, tokenizer)
        labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
    label2id = {name: i for i, name in enumerate(labels)}
    for path, sentences in ((train_path, train or []), (dev_path, dev)):
        for s in sentences:
            unknown = [t for t in s.tags if t not in label2id]
            if unknown:
                raise InputError(f"{path}:{s.line}: tag '{unknown[0]}' has an entity type not seen in training")
    seq_len = length(cfg, model.config)
    pack_to = seq_len if cfg.pack else None

    def make(sentences):
        return ner_features(sentences, tokenizer, seq_len, label2id)

    task = TokenClassificationTask(make(train) if train else [], make(dev) if dev else [], cfg.batch_size, cfg.seed,
                                   tokenizer.pad_token_id, pack_to, id2label=dict(enumerate(labels)))
    task.seq_len = seq_len
    return model, task
