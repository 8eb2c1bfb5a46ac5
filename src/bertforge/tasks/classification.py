"""Sequence classification and regression (GLUE-style TSV, CSV or JSONL): reader -> features ->
task -> metric (accuracy / F1 / MCC, or Pearson / Spearman)."""

from __future__ import annotations

from ..data.classification import Columns, check_labels, label_set, read_examples, regression_targets, truncate_ids
from ..errors import InputError
from ..metrics import classification_metrics, regression_metrics
from ..models.heads import BertForSequenceClassification
from ..settings import FinetuneConfig
from ..tokenization.base import Tokenizer
from .base import FeatureTask, length, new_model


class ClassificationTask(FeatureTask):
    """Single-label classification (accuracy selects the model) or, with `regression`, Pearson."""

    def __init__(self, *args, id2label: dict[int, str] | None = None, regression: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.id2label, self.regression = id2label, regression
        self.main_metric = "pearson" if regression else "accuracy"

    def predictions(self, model, features: list[dict]) -> list:
        if self.regression:
            return self.predict(model, features, lambda out, _: out.logits.squeeze(-1).float().tolist())
        return self.predict(model, features, lambda out, _: out.logits.argmax(-1).tolist())

    def prediction_rows(self, model) -> list[dict]:
        """`evaluate --predictions`: one {"label": name} (or {"value": score}) per dev example."""
        values = self.predictions(model, self.dev)
        return [{"value": v} if self.regression else {"label": self.id2label[v]} for v in values]

    def evaluate(self, model) -> dict[str, float]:
        return self.score(self.predictions(model, self.dev), [f["labels"] for f in self.dev])

    def score(self, predicted: list, gold: list) -> dict[str, float]:
        if self.regression:
            return regression_metrics(gold, predicted)
        names = [self.id2label[i] for i in range(len(self.id2label))]
        return classification_metrics([names[g] for g in gold], [names[p] for p in predicted], labels=names)


def classification_features(examples, tokenizer: Tokenizer, seq_len: int, truncation: str,
                            targets: list) -> list[dict]:
    """[CLS] text [SEP] (pair [SEP]) features; pairs are trimmed longest-first, single texts by `truncation`."""
    if examples[0].pair is not None:
        enc = tokenizer([e.text for e in examples], [e.pair or "" for e in examples], truncation=True,
                        max_length=seq_len, return_token_type_ids=True)
        return [{"input_ids": ids, "token_type_ids": types, "labels": y}
                for ids, types, y in zip(enc["input_ids"], enc["token_type_ids"], targets)]
    enc = tokenizer([e.text for e in examples], add_special_tokens=False)
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    features = []
    for ids, y in zip(enc["input_ids"], targets):
        ids = [cls, *truncate_ids(ids, seq_len - 2, truncation), sep]
        features.append({"input_ids": ids, "token_type_ids": [0] * len(ids), "labels": y})
    return features


def build(cfg: FinetuneConfig, tokenizer: Tokenizer, train_path: str, dev_path: str, model=None):
    """(model, task) for `classify` and `regress`; a given `model` is evaluated, its labels kept."""
    columns = Columns(cfg.text_column, cfg.pair_column, cfg.label_column)
    train = read_examples(train_path, columns) if train_path else None
    dev = read_examples(dev_path, columns) if dev_path else []  # no --dev: nothing is evaluated
    if cfg.task == "regress":
        # Every label is checked before the model is built: a bad one is the only thing said.
        values = {path: regression_targets(examples, path) for path, examples in ((train_path, train or []),
                                                                                  (dev_path, dev))}
        if model is None:
            model = new_model(cfg, BertForSequenceClassification, None, tokenizer)
        id2label = None

        def targets(examples, path):
            return values[path]
    else:
        if model is None:
            model = new_model(cfg, BertForSequenceClassification, label_set(train), tokenizer)
        elif model.config.num_labels == 1:
            raise InputError(f"{cfg.model}: a regression model (num_labels = 1); use `evaluate regress`")
        id2label = model.config.id2label
        label2id = {v: k for k, v in id2label.items()}
        for path, examples in ((train_path, train or []), (dev_path, dev)):
            check_labels(examples, label2id, path)

        def targets(examples, path):
            return [label2id[str(e.label)] for e in examples]

    seq_len = length(cfg, model.config)

    def make(examples, path):
        return classification_features(examples, tokenizer, seq_len, cfg.truncation, targets(examples, path))

    pack_to = seq_len if cfg.pack else None
    task = ClassificationTask(make(train, train_path) if train else [], make(dev, dev_path) if dev else [],
                              cfg.batch_size, cfg.seed,
                              tokenizer.pad_token_id, pack_to, id2label=id2label, regression=cfg.task == "regress")
    task.seq_len = seq_len
    return model, task
