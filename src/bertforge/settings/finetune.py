"""`bertforge finetune`'s and `bertforge distill TASK`'s settings: the loop's (`loop.TrainConfig`, with fine-tuning's
defaults) with the model, the labelled files and how they are read, and question answering's windows; and the run's
length (`run_length`), which a task works out once from what the user gave."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ..errors import ConfigError
from .fields import Settings, defaults, flag, setting
from .loop import TrainConfig


def run_length(given: int | None, default: int, config: Any) -> int:
    """A fine-tuning run's length: the --seq-len the user gave, honoured or refused against the model (`config`, any
    family's model config), else the task's `default` cut to the model's positions. Worked out once, by the task,
    and kept on the task object: the settings keep what the user gave (or None)."""
    if given is not None:
        check_seq_len(given, config)
        return given
    return min(default, config.max_sequence_length)


def check_seq_len(seq_len: int, config: Any) -> None:
    """Refuse a --seq-len longer than the model's positions hold (rows would be cut there while the run's
    settings say otherwise): `config` is any family's model config."""
    if seq_len > config.max_sequence_length:
        raise ConfigError(f"--seq-len {seq_len} exceeds the {config.max_sequence_length} positions the model's "
                          f"max_position_embeddings ({config.max_position_embeddings}) leaves")


def refuse_unread(cfg: Any, group: type, reads: tuple[str, ...], what: str) -> None:
    """Refuse a setting of `group` (a value other than its default) for a task that does not read it: every field
    a run takes is honoured or refused, never ignored."""
    if cfg.task in reads:
        return
    for f in fields(group):
        if getattr(cfg, f.name) != f.default:
            raise ConfigError(f"{flag(f.name)}: {cfg.task} does not read it ({what})")


@dataclass
class ColumnSettings(Settings):
    """How classify and regress read a TSV/CSV/JSONL file's columns, and cut a long text."""

    text_column: str | None = setting(None, "TSV/CSV/JSONL column of the text (name or 0-based index)")
    pair_column: str | None = setting(None, "column of the second text, for sentence pairs")
    label_column: str | None = setting(None, "column of the label")
    truncation: str = setting("head", "long single texts keep their head, tail or head+tail")

    def check(self) -> None:
        refuse_unread(self, ColumnSettings, ("classify", "regress"),
                      "classify and regress read columns by name; ner and qa read CoNLL, JSONL and SQuAD files, and "
                      "the retrieval tasks read their rows by column shape")
        if self.truncation not in ("head", "tail", "head+tail"):
            raise ConfigError(f"{flag('truncation')} must be head, tail or head+tail")


@dataclass
class QASettings(Settings):
    """Extractive question answering's windows and answers."""

    doc_stride: int = setting(128, "qa: tokens of overlap between windows of a long context")
    n_best: int = setting(20, "qa: start and end candidates per window")
    max_answer_len: int = setting(30, "qa: longest answer, in tokens")
    null_threshold: float | None = setting(None, "qa v2: answer '' when null score - best span score exceeds this")
    tune_null_threshold: bool = setting(False, "qa v2: pick the threshold that maximises dev F1")

    def check(self) -> None:
        refuse_unread(self, QASettings, ("qa",), "a setting of qa")


@dataclass
@defaults(out="bertforge-finetune", epochs=3.0, lr=2e-5, warmup=0.1, save_every=None)
class FinetuneConfig(ColumnSettings, QASettings, TrainConfig):
    """Everything `bertforge finetune` takes."""

    task: str = setting("classify", "classify, regress, ner or qa", cli=False)  # the CLI's positional argument
    model: str = setting("", "a checkpoint directory, or a preset (then --tokenizer is needed)")
    train: str = setting("", "training file (.tsv, .csv, .jsonl; CoNLL or .jsonl for ner; SQuAD .json for qa)")
    dev: str = setting("", "development file, evaluated every epoch (or every --eval-every steps) to select the "
                           "model (none: train, and write the final model unselected)")
    tokenizer: str | None = setting(None, "tokenizer directory when --model is a preset")
    seq_len: int | None = setting(None, "maximum tokens per example (default: the task's, cut to the model's "
                                        "positions: 128; 384 for qa; 256 for embed, sparse and rerank, or a "
                                        "sentence-transformers directory's own)")
    seeds: str | None = setting(None, "e.g. 1,2,3: one run per seed, reported as mean and std")

    required = ("model", "train")  # the settings a run cannot go without

    def check(self) -> None:
        for name in self.required:
            if not getattr(self, name):
                raise ConfigError(f"{flag(name)} is required")
        if not self.dev:  # what only an evaluation can do
            for name in ("eval_every", "patience", "tune_null_threshold"):
                if getattr(self, name):
                    raise ConfigError(f"{flag(name)} evaluates on --dev; give --dev, or leave it out")
            if self.backend == "jax":
                raise ConfigError(f"{flag('backend')} jax evaluates on --dev every epoch; give --dev")
        if self.seq_len is not None and self.seq_len < 8:
            raise ConfigError(f"{flag('seq_len')} must be at least 8")
        if self.seeds is not None:
            try:
                seeds = [int(s) for s in str(self.seeds).split(",") if s.strip()]
            except ValueError:
                raise ConfigError(f"{flag('seeds')} must be comma-separated integers, not {self.seeds!r}") from None
            if not seeds:
                raise ConfigError(f"{flag('seeds')} names no seed")


@dataclass
@defaults(out="bertforge-distill")
class DistillConfig(FinetuneConfig):
    """Everything `bertforge distill` takes: fine-tuning's settings plus the teacher and the mix of losses."""

    teacher: str = setting("", "a fine-tuned checkpoint directory of the task whose outputs the student learns")
    model: str = setting("", "the student: a checkpoint directory or a preset (default: some of the teacher's "
                             "layers, --student-layers)")
    student_layers: str | None = setting(None, "the teacher's layers the student keeps: a count (evenly spaced from "
                                                "the first: 3 of 6 is 0,2,4) or indices such as 0,2,4; default: every "
                                                "other layer, as DistilBERT")
    temperature: float = setting(2.0, "softmax temperature of the teacher's and student's soft targets (all but "
                                      "regress)")
    alpha: float = setting(0.5, "weight of the loss on the teacher's outputs; 1 - alpha goes to the gold labels")
    teacher_cache_mb: float = setting(1024.0, "keep the teacher's outputs on the training set in memory when they "
                                              "take at most this many MiB, else run the teacher on each batch (0: the "
                                              "latter always)")
    required = ("teacher", "train", "dev")

    def check(self) -> None:
        if self.model and self.student_layers:
            raise ConfigError(f"{flag('student_layers')} picks the teacher's layers for the student; with "
                              f"{flag('model')} the student is that model: give one of the two")
        if self.task == "regress" and self.temperature != 2.0:  # its loss is a squared error, with no softmax
            raise ConfigError(f"{flag('temperature')}: regress distils by mean-squared error to the teacher's "
                              "scores, which has no temperature")
        if not self.temperature > 0 or not 0 <= self.alpha <= 1:
            raise ConfigError(f"{flag('temperature')} must be positive and {flag('alpha')} within [0, 1]")
        if not self.teacher_cache_mb >= 0:
            raise ConfigError(f"{flag('teacher_cache_mb')} must be 0 or more")
        if self.pack:
            raise ConfigError(f"{flag('pack')} is not supported by distill: each example is matched with its "
                              "teacher outputs row by row")
        if self.backend == "jax":
            raise ConfigError(f"{flag('backend')} jax does not distill; use torch")
