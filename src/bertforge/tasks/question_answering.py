"""Extractive question answering (SQuAD v1.1 / v2.0): reader -> windowed features -> task -> answers
merged across windows -> the official EM / F1 of the file's version."""

from __future__ import annotations

from ..data.qa import best_answers, qa_features, read_squad
from ..errors import BertforgeError
from ..metrics import squad_metrics
from ..models.heads import BertForQuestionAnswering
from ..settings import FinetuneConfig
from ..tokenization.base import Tokenizer
from .base import FeatureTask, length, new_model


class QuestionAnsweringTask(FeatureTask):
    """Extractive QA: start/end logits per window, answers merged across windows, SQuAD EM/F1."""

    main_metric = "f1"

    def __init__(self, *args, examples: list, raw: list[dict], n_best: int = 20, max_answer_len: int = 30,
                 null_threshold: float | None = None, tune_null_threshold: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.examples, self.raw = examples, raw
        self.n_best, self.max_answer_len = n_best, max_answer_len
        self.null_threshold, self.tune = null_threshold, tune_null_threshold
        self.has_impossible = any(e.impossible for e in examples)

    def prediction_rows(self, model) -> dict[str, str]:
        """`evaluate --predictions`: SQuAD's official format, one object of question id -> answer text."""
        return self.answers(model)[0]

    def answers(self, model, features: list[dict] | None = None,
                use_null: bool = True) -> tuple[dict[str, str], dict[str, float]]:
        """(question id -> answer, question id -> null-minus-best-span margin) over all windows."""
        features = features if features is not None else self.dev

        def take(out, batch):
            lengths = batch["attention_mask"].sum(1).tolist()
            s, e = out.start_logits.float().cpu().numpy(), out.end_logits.float().cpu().numpy()
            return [(s[i, :n], e[i, :n]) for i, n in enumerate(lengths)]

        logits = self.predict(model, features, take)
        threshold = None
        if use_null and self.has_impossible:
            threshold = self.null_threshold if self.null_threshold is not None else 0.0
        return best_answers(self.examples, features, [x[0] for x in logits], [x[1] for x in logits],
                            self.n_best, self.max_answer_len, threshold)

    def evaluate(self, model) -> dict[str, float]:
        if self.has_impossible and self.tune:
            # Score every question with its best span, and let the v2 threshold search pick the cut.
            spans, margins = self.answers(model, use_null=False)
            result = squad_metrics(self.raw, spans, margins)
            self.null_threshold = result.get("best_f1_thresh", 0.0)
            result.update(squad_metrics(self.raw, spans, margins, threshold=self.null_threshold))
            result["null_threshold"] = self.null_threshold
            return result
        return squad_metrics(self.raw, self.answers(model)[0])


def build(cfg: FinetuneConfig, tokenizer: Tokenizer, train_path: str, dev_path: str, model=None):
    """(model, task) for `qa` on SQuAD v1.1 / v2.0 files."""
    if cfg.pack:
        raise BertforgeError("--pack is not supported for qa: its windows already fill --seq-len")
    train = read_squad(train_path, training=True)[0] if train_path else []
    dev, raw = read_squad(dev_path) if dev_path else ([], {"data": []})  # no --dev: nothing is evaluated
    if model is None:
        model = new_model(cfg, BertForQuestionAnswering, None, tokenizer)
    seq_len = length(cfg, model.config)
    train_features = qa_features(train, tokenizer, seq_len, cfg.doc_stride, training=True) if train else []
    task = QuestionAnsweringTask(train_features, qa_features(dev, tokenizer, seq_len, cfg.doc_stride) if dev else [],
                                 cfg.batch_size, cfg.seed, tokenizer.pad_token_id, examples=dev, raw=raw["data"],
                                 n_best=cfg.n_best, max_answer_len=cfg.max_answer_len,
                                 null_threshold=cfg.null_threshold, tune_null_threshold=cfg.tune_null_threshold)
    task.seq_len = seq_len
    return model, task
